"""Board text of the grid envs: a cell separator changes the text only, and the text still parses back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.frozen_lake import FrozenLakeEnv
from envs.sokoban.env import SokobanEnv

ENVS = {"frozen_lake": lambda **kw: FrozenLakeEnv(max_steps=5, **kw), "sokoban": lambda **kw: SokobanEnv(**kw)}


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("sep", [" ", " | ", "\t"])
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_separator_goes_between_cells_only_and_parses_back(name, sep, seed):
    plain, spaced = ENVS[name](), ENVS[name](cell_separator=sep)
    obs_plain, _ = plain.reset(seed=seed)
    obs, _ = spaced.reset(seed=seed)
    rows, plain_rows = obs.split("\n"), obs_plain.split("\n")
    assert [r.split(sep) for r in rows] == [list(r) for r in plain_rows]  # one symbol per cell, same board
    assert spaced.parse_text(obs) == plain.parse_text(obs_plain) == spaced.codes()
    assert spaced.observation_space.contains(obs)
    # the separator stays in the text after a move and in a blocked or invalid reply's board
    for reply in ("<answer>Up</answer>", "no move"):
        obs, *_ = spaced.step(reply)
        assert sep.join(plain.step(reply)[0].split("\n")[-1]) == obs.split("\n")[-1]


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("sep", ["\n", "_", " O ", 3])  # "_" and "O" are symbols of both
def test_separators_that_would_break_the_board_are_refused(name, sep):
    with pytest.raises(ValueError, match="cell_separator"):
        ENVS[name](cell_separator=sep)


def test_the_positions_line_names_player_and_goal_by_hand():
    env = FrozenLakeEnv(map_desc=["SFFH", "FHFF", "FFFF", "HFFG"], max_steps=5, describe_positions=True)
    obs, info = env.reset(seed=0)
    assert obs == "P__O\n_O__\n____\nO__G\nPositions: you (1, 1); goal (4, 4)."
    assert "(row, column), counting from (1, 1) at the top left" in info["env_instruction"]
    assert env.parse_text(obs) == env.codes()
    obs, *_ = env.step("<answer>Down</answer>")
    assert obs.endswith("\nPositions: you (2, 1); goal (4, 4).")
    obs, *_ = env.step("<answer>Right</answer>")  # into the hole at (2, 2): the player stands in it
    assert obs.endswith("\nPositions: you (2, 2); goal (4, 4).")
    plain = FrozenLakeEnv(map_desc=["SFFH", "FHFF", "FFFF", "HFFG"], max_steps=5)
    assert plain.reset(seed=0)[0] == "P__O\n_O__\n____\nO__G"  # off by default: ROLL's board
    assert "(row, column)" not in plain.instruction()


def test_the_positions_line_names_player_boxes_and_targets_by_hand():
    from tests.envs.test_sokoban import _level

    env = SokobanEnv(max_steps=20, describe_positions=True, cell_separator=" ")
    obs, _ = env.reset(seed=0, options={"level": _level(["#######", "#P_X_O#", "#_X__O#", "#######"])})
    assert obs.split("\n")[-1] == "Positions: you (2, 2); boxes (2, 4), (3, 3); targets (2, 6), (3, 6)."
    assert env.parse_text(obs) == env.codes()
    for _ in range(3):  # push the first box onto its target; the player ends next to it
        obs, *_ = env.step("<answer>Right</answer>")
    assert obs.split("\n")[-1] == "Positions: you (2, 5); boxes (2, 6), (3, 3); targets (2, 6), (3, 6)."
    obs, *_ = env.step("<answer>Up</answer>")  # into the wall: the blocked board keeps the line
    assert obs.split("\n")[-1].startswith("Positions: you (2, 5);")


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_describe_positions_must_be_a_bool(name, value):
    with pytest.raises(ValueError, match="describe_positions"):
        ENVS[name](describe_positions=value)


def test_describe_positions_needs_position_codes():
    class Plain(FrozenLakeEnv):
        position_codes = {}

    Plain(max_steps=5)  # off: nothing to name, nothing asked
    for key in ("describe_positions", "describe_offsets"):
        with pytest.raises(ValueError, match=f"{key}: Plain names no position_codes"):
            Plain(max_steps=5, **{key: True})


def test_the_offsets_line_says_how_far_the_goal_is_by_hand():
    env = FrozenLakeEnv(map_desc=["FFFH", "FHSF", "FFFF", "GFFF"], max_steps=5, describe_offsets=True)
    obs, info = env.reset(seed=0)
    assert obs == "___O\n_OP_\n____\nG___\nFrom you: goal 2 down, 2 left."
    assert "how many rows up or down and columns left or right" in info["env_instruction"]
    assert "(row, column)" not in info["env_instruction"]  # the positions sentence is the other key's
    assert env.parse_text(obs) == env.codes()
    obs, *_ = env.step("<answer>Up</answer>")
    assert obs.endswith("\nFrom you: goal 3 down, 2 left.")
    for move, line in [("Left", "goal 3 down, 1 left"), ("Left", "goal 3 down"), ("Left", "goal 3 down"),
                       ("Down", "goal 2 down")]:  # the third Left is into the edge: nothing changes
        obs, *_ = env.step(f"<answer>{move}</answer>")
        assert obs.endswith(f"\nFrom you: {line}.")
    both = FrozenLakeEnv(map_desc=["SFFF", "FFFF", "FFFF", "FFFG"], max_steps=5, describe_positions=True,
                         describe_offsets=True)
    obs, _ = both.reset(seed=0)
    assert obs.split("\n")[-2:] == ["Positions: you (1, 1); goal (4, 4).", "From you: goal 3 down, 3 right."]
    assert both.parse_text(obs) == both.codes()
    # the same column: one part only; on the goal: here
    line = FrozenLakeEnv(map_desc=["SF", "GF"], max_steps=5, describe_offsets=True)
    assert line.reset(seed=0)[0].endswith("\nFrom you: goal 1 down.")
    assert line.step("<answer>Down</answer>")[0].endswith("\nFrom you: goal here.")


def test_the_offsets_line_names_boxes_and_targets_by_hand():
    from tests.envs.test_sokoban import _level

    env = SokobanEnv(max_steps=20, describe_offsets=True)
    obs, _ = env.reset(seed=0, options={"level": _level(["#######", "#P_X_O#", "#_X__O#", "#######"])})
    assert obs.split("\n")[-1] == "From you: boxes 2 right and 1 down, 1 right; targets 4 right and 1 down, 4 right."
    assert env.parse_text(obs) == env.codes()
    for _ in range(3):  # the first box onto its target
        obs, *_ = env.step("<answer>Right</answer>")
    assert obs.split("\n")[-1] == "From you: boxes 1 right and 1 down, 2 left; targets 1 right and 1 down, 1 right."


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_describe_offsets_must_be_a_bool(name, value):
    with pytest.raises(ValueError, match="describe_offsets must be true or false"):
        ENVS[name](describe_offsets=value)

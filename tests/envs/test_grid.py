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

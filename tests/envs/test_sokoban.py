"""Sokoban: generation, solver, dynamics, parsing/penalty and rendering, as properties over seeds."""

from concurrent.futures import ThreadPoolExecutor

import gymnasium
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import envs  # noqa: F401  (registers the envs)
from envs.sokoban.env import SokobanEnv
from envs.sokoban.generation import generate_level
from envs.sokoban.level import BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET, TARGET, Level
from envs.sokoban.solver import solve

PRESETS = {  # as in examples/config/traj_envs.yaml
    "SimpleSokoban": dict(dim_room=(6, 6), num_boxes=1),
    "LargerSokoban": dict(dim_room=(10, 10), num_boxes=2, search_depth=10),
    "SokobanDifferentGridVocab": dict(
        dim_room=(6, 6), num_boxes=1, search_depth=30,
        grid_lookup={0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"},
        grid_vocab={"W": "wall", ".": "empty", "G": "target", "C": "box on target", "B": "box", "A": "player", "@": "player on target"},
    ),
}
SEEDS = st.integers(min_value=0, max_value=2**31 - 1)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("preset", PRESETS)
@FAST
@given(seed=SEEDS)
def test_every_level_is_solvable_and_replaying_the_solution_succeeds(preset, seed):
    env = SokobanEnv(max_steps=200, format_penalty=-0.15, **PRESETS[preset])
    env.reset(seed=seed)
    plan = solve(env.level)
    assert plan, "generated levels start unsolved and are solvable"
    total = 0.0
    for i, action in enumerate(plan):
        obs, reward, terminated, truncated, info = env.step(f"<answer>{action}</answer>")
        total += reward
        assert info["metrics"]["action_is_valid"] == 1.0
        assert terminated == (i == len(plan) - 1)
    assert info["metrics"]["success"] == 1.0 and terminated and not truncated


@pytest.mark.parametrize("preset", PRESETS)
@FAST
@given(seed=SEEDS)
def test_level_invariants(preset, seed):
    cfg = PRESETS[preset]
    level, tries = generate_level(cfg["dim_room"], cfg["num_boxes"], cfg.get("search_depth", 100), seed)
    assert tries >= 1
    assert len(level.boxes) == len(set(level.boxes)) == cfg["num_boxes"] == len(level.targets)
    assert not level.is_solved()
    cells = {level.player, *level.boxes, *level.targets}
    assert all(not level.walls[c] for c in cells) and level.player not in level.boxes
    h, w = cfg["dim_room"]
    border = [r * w + c for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1)]
    assert all(level.walls[c] for c in border)


@FAST
@given(seed=SEEDS)
def test_same_seed_same_level(seed):
    a, b = SokobanEnv(), SokobanEnv()
    assert a.reset(seed=seed)[0] == b.reset(seed=seed)[0]
    assert a.level == b.level


def test_different_seeds_give_different_levels():
    levels = {generate_level((6, 6), 1, 100, seed)[0] for seed in range(50)}
    assert len(levels) > 45


def test_generation_is_reentrant_across_threads():
    seeds = list(range(200))
    sequential = [generate_level((10, 10), 2, 100, s)[0] for s in seeds]
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(lambda s: generate_level((10, 10), 2, 100, s)[0], seeds))
    assert threaded == sequential


@pytest.mark.parametrize("preset", PRESETS)
@FAST
@given(seed=SEEDS, junk=st.text(max_size=80))
def test_random_strings_never_raise_and_cost_exactly_the_format_penalty(preset, seed, junk):
    assume("answer>" not in junk.lower())
    env = SokobanEnv(format_penalty=-0.15, **PRESETS[preset])
    before, _ = env.reset(seed=seed)
    obs, reward, terminated, truncated, info = env.step(junk)
    assert info["metrics"]["format_penalty"] == -0.15
    assert reward == pytest.approx(-0.15 - 0.1)  # the format penalty plus Sokoban's per-step cost
    assert info["metrics"]["action_is_valid"] == 0.0 and not terminated
    assert env.render_text() == before  # state unchanged
    assert obs.endswith(before)


@pytest.mark.parametrize("answer", ["<answer>Sideways</answer>", "<answer></answer>", "<answer>up down</answer>"])
def test_unknown_actions_are_format_errors(answer):
    env = SokobanEnv(format_penalty=-0.15)
    env.reset(seed=1)
    _, reward, _, _, info = env.step(answer)
    assert info["metrics"]["action_is_valid"] == 0.0 and reward == pytest.approx(-0.25)


def test_actions_are_case_insensitive_and_special_tokens_are_stripped():
    env = SokobanEnv()
    env.reset(seed=1)
    _, _, _, _, info = env.step("<think>go</think><answer> uP </answer><|im_end|>")
    assert info["metrics"]["action_is_valid"] == 1.0


def test_think_answer_pattern():
    env = SokobanEnv(action_pattern=r"<think>(.*?)</think>\s*<answer>(.*?)</answer>")
    env.reset(seed=1)
    assert env.step("<answer>Up</answer>")[4]["metrics"]["action_is_valid"] == 0.0
    assert env.step("<think>plan</think> <answer>Up</answer>")[4]["metrics"]["action_is_valid"] == 1.0


@pytest.mark.parametrize("preset", PRESETS)
@FAST
@given(seed=SEEDS)
def test_text_render_round_trips_to_the_grid(preset, seed):
    env = SokobanEnv(**PRESETS[preset])
    obs, _ = env.reset(seed=seed)
    assert env.parse_text(obs) == env.room_state()
    symbols = set(obs) - {"\n"}
    assert symbols <= set(env.grid_lookup.values())


def test_different_grid_vocab_is_a_config_change():
    env = SokobanEnv(**PRESETS["SokobanDifferentGridVocab"])
    obs, info = env.reset(seed=5)
    assert set(obs) - {"\n"} <= set("W.GCBA@")  # only the configured vocabulary, none of the default symbols
    assert ("A" in obs) != ("@" in obs)  # exactly one player, on floor or on a target
    assert "W: wall" in info["env_instruction"]


def _level(rows):
    """A hand-made level: # wall, _ floor, O target, X box, P player."""
    h, w = len(rows), len(rows[0])
    flat = "".join(rows)
    return Level(h, w, bytes(1 if ch == "#" else 0 for ch in flat),
                 tuple(i for i, ch in enumerate(flat) if ch == "O"),
                 tuple(i for i, ch in enumerate(flat) if ch == "X"), flat.index("P"))


def test_rewards_for_push_on_push_off_and_solve():
    level = _level(["#######", "#P_X_O#", "#_____#", "#######"])
    env = SokobanEnv(max_steps=20)
    env.reset(seed=0, options={"level": level})
    rewards = [env.step(f"<answer>{a}</answer>")[1] for a in ("Right",)]  # walk next to the box
    assert rewards == [pytest.approx(-0.1)]
    _, r, terminated, _, _ = env.step("<answer>Right</answer>")  # box to the cell before the target
    assert r == pytest.approx(-0.1) and not terminated
    _, r, terminated, _, info = env.step("<answer>Right</answer>")  # box onto the target: solved
    assert r == pytest.approx(-0.1 + 1.0 + 10.0) and terminated and info["metrics"]["success"] == 1.0


def test_pushing_a_box_off_a_target_costs_one():
    level = _level(["#######", "#P_O__#", "#_X_O_#", "#######"])
    # One box already on its target (cell 10), one box off target (16); targets 10 and 18.
    level = Level(level.height, level.width, level.walls, (10, 18), (10, 16), level.player)
    env = SokobanEnv()
    env.reset(seed=0, options={"level": level})
    env.step("<answer>Right</answer>")
    _, r, terminated, _, info = env.step("<answer>Right</answer>")
    assert r == pytest.approx(-0.1 - 1.0) and not terminated and info["metrics"]["boxes_on_target"] == 0.0


def test_walls_and_blocked_boxes_make_ineffective_moves():
    level = _level(["#####", "#PX_#", "#_XO#", "#####"])
    level = Level(level.height, level.width, level.walls, (13,), (7,), level.player)
    env = SokobanEnv()
    env.reset(seed=0, options={"level": level})
    _, r, _, _, info = env.step("<answer>Up</answer>")  # wall
    assert info["metrics"]["action_is_effective"] == 0.0 and r == pytest.approx(-0.1)


def test_a_blocked_move_penalty_costs_blocked_moves_only_and_says_so():
    level = _level(["#######", "#PXX__#", "#__OO_#", "#######"])
    env = SokobanEnv(blocked_move_penalty=-0.3)
    env.reset(seed=0, options={"level": level})
    obs, r, _, _, info = env.step("<answer>Up</answer>")  # into the wall
    assert r == pytest.approx(-0.4) and info["metrics"]["action_is_effective"] == 0.0
    assert obs.startswith("Up was blocked: nothing moved.\n") and obs.endswith(env.render_text())
    obs, r, _, _, _ = env.step("<answer>Right</answer>")  # a box pushed against the other box
    assert r == pytest.approx(-0.4) and obs.startswith("Right was blocked")
    obs, r, _, _, _ = env.step("<answer>Down</answer>")  # an effective move: the plain step cost and board
    assert r == pytest.approx(-0.1) and obs == env.render_text()
    _, r, _, _, _ = env.step("invalid")  # a format error costs the format penalty, not the blocked one
    assert r == pytest.approx(-0.1)
    plain = SokobanEnv()
    plain.reset(seed=0, options={"level": level})
    obs, r, _, _, _ = plain.step("<answer>Up</answer>")  # 0 (ROLL's rewards): no cost, no note
    assert r == pytest.approx(-0.1) and obs == plain.render_text()


def test_truncation_at_max_steps():
    env = SokobanEnv(max_steps=2)
    env.reset(seed=3)
    assert env.step("nonsense")[3] is False
    assert env.step("nonsense")[3] is True


def test_rgb_render_and_gymnasium_make():
    env = gymnasium.make("sokoban", dim_room=(6, 6), num_boxes=1, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (96, 96, 3) and frame.dtype.name == "uint8"
    state_codes = {c for row in env.unwrapped.room_state() for c in row}
    assert PLAYER in state_codes or PLAYER_ON_TARGET in state_codes
    assert BOX in state_codes or BOX_ON_TARGET in state_codes or TARGET in state_codes

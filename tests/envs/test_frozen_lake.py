import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.frozen_lake import FrozenLakeEnv, generate_map, shortest_path


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(2, 8), p=st.floats(0.3, 1.0))
def test_maps_always_have_a_path_and_replaying_it_reaches_the_goal(seed, size, p):
    env = FrozenLakeEnv(size=size, p=p, max_steps=100)
    env.reset(seed=seed)
    plan = shortest_path(env.desc)
    assert plan is not None and len(plan) >= 1
    for action in plan:
        obs, reward, terminated, truncated, info = env.step(f"<answer>{action}</answer>")
    assert terminated and reward == 1.0 and info["metrics"]["success"] == 1.0


def test_same_seed_same_map():
    assert generate_map(6, 0.8, random.Random(3)) == generate_map(6, 0.8, random.Random(3))


def test_falling_into_a_hole_ends_with_zero():
    env = FrozenLakeEnv()
    env.reset(seed=0, options={"map_desc": ["SH", "FG"]})
    _, reward, terminated, _, info = env.step("<answer>Right</answer>")
    assert terminated and reward == 0.0 and info["metrics"]["success"] == 0.0
    assert "X" in env.render_text()


def test_slippery_moves_are_seeded_and_sometimes_perpendicular():
    def run(seed):
        env = FrozenLakeEnv(is_slippery=True, max_steps=50)
        env.reset(seed=seed, options={"map_desc": ["FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG"]})
        return [env.step("<answer>Up</answer>")[0] for _ in range(3)]

    assert run(11) == run(11)
    moved_sideways = 0
    for seed in range(30):
        env = FrozenLakeEnv(is_slippery=True)
        env.reset(seed=seed, options={"map_desc": ["FFF", "FSF", "FFG"]})
        env.step("<answer>Up</answer>")
        moved_sideways += env.pos[0] == 1  # stayed on the middle row: slipped left or right
    assert 0 < moved_sideways < 30


def test_format_penalty_and_text_render():
    env = FrozenLakeEnv(format_penalty=-0.01)
    obs, info = env.reset(seed=2)
    assert "P" in obs and "G" in obs and "Left" in info["env_instruction"]
    _, reward, _, _, info = env.step("I go left")
    assert reward == pytest.approx(-0.01) and info["metrics"]["action_is_valid"] == 0.0

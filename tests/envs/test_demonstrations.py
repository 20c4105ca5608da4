"""Opening demonstrations: boards of the env's own kind answered by its expert; refused clearly where
the env has no expert."""

import pytest

from envs.frozen_lake import FrozenLakeEnv
from envs.sokoban.env import SokobanEnv
from roll.configs.errors import ConfigError
from roll.configs.loading import load_config
from roll.preflight import check_inputs


@pytest.mark.parametrize("env", [SokobanEnv(dim_room=(6, 6), num_boxes=1), FrozenLakeEnv()], ids=["sokoban", "frozen_lake"])
def test_each_demonstration_is_a_valid_first_move_of_a_shortest_solution(env):
    demos = env.demonstrations(3, seed=100)
    assert len(demos) == 3 and len({reply for _, reply in demos}) == 3  # three different moves are shown
    for board, reply in demos:
        env2 = type(env)(**({"dim_room": (6, 6), "num_boxes": 1} if isinstance(env, SokobanEnv) else {}))
        seed = next(s for s in range(100, 300) if env2.reset(seed=s)[0] == board)
        env2.reset(seed=seed)
        _, _, _, _, info = env2.step(reply)
        assert info["metrics"]["action_is_valid"] == 1.0 and info["metrics"]["action_is_effective"] == 1.0
    assert env.demonstrations(3, seed=100) == demos  # fixed seeds: the same opening every episode


def test_the_expert_follows_the_current_state():
    env = SokobanEnv(dim_room=(6, 6), num_boxes=1)
    env.reset(seed=7)
    for _ in range(30):
        _, _, terminated, _, _ = env.step(env.answer_text(env.expert_action()))
        if terminated:
            break
    assert env.is_success()


def test_an_env_that_cannot_demonstrate_is_refused_before_the_run():
    cfg = load_config("agentic_sokoban", overrides=["custom_env.SimpleSokoban.env_config.action_pattern=${think_action_pattern}"]).config
    with pytest.raises(ConfigError, match=r"custom_envs.SimpleSokoban.num_demonstrations.*answer pattern"):
        check_inputs(cfg)
    with pytest.raises(NotImplementedError, match="no expert"):
        from envs.toy import DigitsEnv

        DigitsEnv().demonstrations(1)

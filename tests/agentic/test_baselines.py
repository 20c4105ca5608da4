"""Random-move and solver baselines on exactly the validation episodes (issue 30)."""

import pytest

from roll.agentic.baselines import answer, baseline_metrics, play
from roll.agentic.rollout import build_slots, episode_requests
from roll.configs.loading import load_config


def val_requests(*overrides):
    cfg = load_config("agentic_sokoban", overrides=list(overrides)).config
    slots = build_slots(cfg.custom_envs, cfg.val_env_manager, cfg.seed)
    return cfg, episode_requests(slots, cfg.val_env_manager.max_traj_per_env, cfg.seed, "val", 0, True)


def test_the_baselines_play_the_validation_episodes_the_solver_wins_and_random_does_worse():
    cfg, requests = val_requests("val_batch_size=16", "val_env_manager.num_env_groups=16",
                                 "val_env_manager.num_groups_partition=[16]")
    # validation plays these same episodes at every eval (fixed seeds), so the baselines are computed once
    later = episode_requests(build_slots(cfg.custom_envs, cfg.val_env_manager, cfg.seed),
                             cfg.val_env_manager.max_traj_per_env, cfg.seed, "val", 7, True)
    assert [r.seed for r in requests] == [r.seed for r in later]
    metrics = baseline_metrics(requests, seed=cfg.seed)
    assert metrics["val/baseline_solver_success"] == 1.0  # every generated level is solvable
    assert metrics["val/baseline_random_success"] < metrics["val/baseline_solver_success"]
    lo, hi = metrics["val/baseline_random_success_ci_low"], metrics["val/baseline_random_success_ci_high"]
    assert lo <= metrics["val/baseline_random_success"] <= hi
    assert baseline_metrics(requests, seed=cfg.seed) == metrics  # seeded: the same numbers every start


def test_an_episode_is_played_from_its_own_seed():
    _, requests = val_requests()
    first = requests[0]
    assert play(first, "solver", 0) == 1.0
    assert {play(first, "random", s) for s in range(3)} <= {0.0, 1.0}


def test_think_pattern_answers_and_tool_envs_are_left_out():
    class Env:
        action_pattern = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"

    assert answer(Env(), "Up") == "<think></think><answer>Up</answer>"
    _, requests = val_requests()
    request = requests[0]
    tool = type(request)(type(request.slot)(0, 0, "T", {**request.slot.entry, "tool_wrapper": {"tool_configs": []}}),
                         request.seed, 0)
    assert play(tool, "random", 0) is None
    assert baseline_metrics([tool]) == {}


@pytest.mark.parametrize("tag", ["FrozenLake"])
def test_frozen_lake_has_both_baselines(tag):
    _, requests = val_requests(f"val_env_manager.tags=[{tag}]", "+custom_envs.FrozenLake=${custom_env.FrozenLake}")
    metrics = baseline_metrics(requests[:8])
    assert metrics["val/baseline_solver_success"] >= metrics["val/baseline_random_success"]


@pytest.mark.parametrize("config_name", ["agentic_sokoban", "agentic_frozen_lake"])
def test_the_default_validation_is_64_distinct_levels_played_greedily_at_the_first_and_last_step(config_name):
    from envs.registration import make_env

    cfg = load_config(config_name).config
    slots = build_slots(cfg.custom_envs, cfg.val_env_manager, cfg.seed)
    requests = episode_requests(slots, cfg.val_env_manager.max_traj_per_env, cfg.seed, "val", 0, True)
    assert cfg.val_batch_size == len(requests) == 64
    boards = set()
    for r in requests:
        env = make_env(r.slot.entry["env_type"], r.slot.entry.get("entry_point"), **r.slot.entry["env_config"])
        observation, _ = env.reset(seed=r.seed)
        boards.add(str(observation))
    assert len(boards) == 64  # no level is counted twice
    assert cfg.val_env_manager.generating_args.temperature == 0.0 and not cfg.val_env_manager.generating_args.do_sample
    evals = [s for s in range(cfg.max_steps) if s % cfg.eval_steps == 0]
    assert evals[0] == 0 and evals[-1] == cfg.max_steps - 1

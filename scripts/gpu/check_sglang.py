"""GPU check of the sglang strategy: generate, log-probs against hf_infer's math, weight sync,
memory release/resume.

Needs: a CUDA GPU, torch, transformers, tokenizers, and sglang with its kernels (sgl-kernel,
flashinfer) and torch_memory_saver (roll supports the range in roll.strategies.backends; without
internet: pip install --no-index --find-links WHEELS sglang).
    python scripts/gpu/check_sglang.py
Prints the figures as JSON (also to $OUT/sglang_check.json when OUT is set); exit 0 when every
log-prob comparison is within the stated bf16 tolerance.
"""

from __future__ import annotations

from _common import require, require_cuda

if __name__ == "__main__":
    require_cuda()
    require("transformers", "tokenizers", "peft", "sglang")
    from _inference_check import run

    run("sglang", {"mem_fraction_static": 0.3, "context_length": 512})

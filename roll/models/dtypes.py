"""The dtype names a config uses (``model_args.dtype``: bf16, fp16, fp32), as torch and the engines spell them:
one table for every backend."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def engine_dtype(name: str | None) -> str:
    """The engines' spelling (vLLM's and SGLang's ``dtype``): bfloat16, float16, float32; unset: auto (the model's)."""
    return str(TORCH_DTYPES[name]).removeprefix("torch.") if name else "auto"

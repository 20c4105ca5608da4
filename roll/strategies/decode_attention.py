"""Attention for one-token decode steps on the CPU, where torch's SDPA kernels are slow.

torch's CPU SDPA (its flash kernel, with or without ``enable_gqa``) is built for long query blocks; with one query
per row, a batch of 18 rows over 800 cached tokens took 9-15 ms per layer here (AMD EPYC, 2 threads, bf16), two
thirds of a whole decode step. Grouped-query attention written as two batched matmuls, each query group against
its own key/value head without repeating them, does the same sums in 1-2 ms. Scores and softmax are computed in
fp32 as SDPA's kernels do (bf16 scores would round a logit of 10 by up to 0.04); the probabilities are cast back
to the value dtype for the second matmul, as flash kernels do. Any other call (a prompt's prefill, training,
log-probs, a GPU) goes to transformers' SDPA function unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "roll_cpu_decode"


def grouped_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Attention of one query token per row: query [B, H, 1, D], key/value [B, KVH, L, D] (H a multiple of KVH,
    query head h reading key head h // (H / KVH)), mask broadcastable to [B, 1, 1, L] (bool: True attends;
    float: added to the scores) or None; returns [B, 1, H, D] as transformers' attention functions do."""
    b, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    q = query.reshape(b, kv_heads, heads // kv_heads, dim).float()
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scaling)  # [B, KVH, groups, L]
    if mask is not None:
        mask = mask[..., -length:].reshape(mask.shape[0], 1, 1, length)
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.float())
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(probs, value).reshape(b, heads, 1, dim).transpose(1, 2).contiguous()


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or query.device.type != "cpu" or dropout or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return grouped_decode_attention(query, key, value, attention_mask, scale), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model that runs transformers' SDPA to this module's attention (registered under ``NAME``, with
    SDPA's masks); False, and the model left as it was, where it is on another device or runs another attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    # transformers' documented way to add an attention function; registering the same name again is harmless
    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True

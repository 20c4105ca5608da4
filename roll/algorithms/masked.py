"""Masked reductions and whitening: the building blocks every estimator and loss uses."""

from __future__ import annotations

import torch

EPS = 1e-8


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    x = torch.where(mask.bool(), x, torch.zeros_like(x))  # masked positions may hold inf/NaN
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over mask=1 entries; 0 where nothing is valid (never NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over valid entries; 0 with fewer than two valid entries (unbiased) or none."""
    count = mask.sum()
    mean = masked_mean(x, mask)
    sq = masked_sum((x - mean) ** 2, mask)
    denom = count - 1 if unbiased else count
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / std over valid entries (mean kept if not shift_mean); masked entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def group_ids(keys: list) -> torch.Tensor:
    """Dense integer ids for arbitrary hashable per-row keys (first appearance order)."""
    index: dict = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def group_stats(values: torch.Tensor, groups: torch.Tensor, valid: torch.Tensor | None = None):
    """Per-row (mean, unbiased std, size) of the row's group, over valid rows only.

    Computed in float64, so the mean of equal values is exact and a zero-variance group gives
    exactly zero deviations; returned in the input dtype."""
    dtype = values.dtype
    values = values.double()
    valid = torch.ones_like(values, dtype=torch.bool) if valid is None else valid.bool()
    n_groups = int(groups.max().item()) + 1 if groups.numel() else 0
    w = valid.double()
    v = torch.where(valid, values, torch.zeros_like(values))
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, w)
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, v)
    mean = total / count.clamp(min=1)
    dev = torch.where(valid, values - mean[groups], torch.zeros_like(values))
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, dev**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[groups].to(dtype), std[groups].to(dtype), count[groups].to(dtype)

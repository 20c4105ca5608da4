"""Reward normalisation and shaping, before advantages.

Agentic grouping (``reward_normalization``): rows are normalised within groups (GRPO groups by
``traj_group_id``, env ``tags``, the whole ``batch``, step-level ``state`` groups, or any per-row
key mapped to ids by ``masked.group_ids``) with ``method`` identity | mean | mean_std | asym_clip.
A group of one, or one with zero variance, yields 0 for mean/mean_std/asym_clip, never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.algorithms.masked import EPS, group_stats

NORM_METHODS = ("identity", "mean", "mean_std", "asym_clip")
ASYM_CLIP_RANGE = (-1.0, 3.0)  # asym_clip bounds penalties more tightly than rewards


def normalize_in_groups(scores: torch.Tensor, groups: torch.Tensor, method: str) -> torch.Tensor:
    """Normalise per-row scores within their groups."""
    if method not in NORM_METHODS:
        raise ValueError(f"unknown normalisation method {method!r}; use one of {NORM_METHODS}")
    if method == "identity":
        return scores.clone()
    dtype = scores.dtype
    scores = scores.double()
    mean, std, count = group_stats(scores, groups)
    centered = torch.where(count > 1, scores - mean, torch.zeros_like(scores))
    if method == "mean":
        return centered.to(dtype)
    # A (numerically) constant group carries no signal: its advantage is exactly 0.
    out = torch.where(std > 1e-8, centered / (std + 1e-6), torch.zeros_like(centered))
    if method == "asym_clip":
        out = out.clamp(*ASYM_CLIP_RANGE)
    return out.to(dtype)


@dataclass
class RunningMeanStd:
    """Running mean/variance (parallel Welford update). State the caller keeps across steps."""

    mean: float = 0.0
    var: float = 1.0
    count: float = 0.0

    def update(self, x: torch.Tensor) -> RunningMeanStd:
        """Return the statistics after also seeing ``x`` (pure: self is unchanged)."""
        n = float(x.numel())
        if n == 0:
            return RunningMeanStd(self.mean, self.var, self.count)
        b_mean = float(x.mean())
        b_var = float(x.var(unbiased=False))
        total = self.count + n
        delta = b_mean - self.mean
        mean = self.mean + delta * n / total
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        return RunningMeanStd(mean, m2 / total, total)


def normalize_rewards(
    scores: torch.Tensor,
    *,
    reward_norm: str | None = None,
    groups: torch.Tensor | None = None,
    running: RunningMeanStd | None = None,
    reward_shift: bool = False,
    reward_scale: bool = False,
    reward_clip: float | None = None,
) -> tuple[torch.Tensor, RunningMeanStd | None]:
    """Scope-based normalisation (``reward_norm``: batch | group | running | None).

    ``reward_shift`` only subtracts the mean; ``reward_scale`` only divides by the std (both off:
    both applied). ``reward_clip`` clips the result to [-c, c]. Returns the new scores and the
    updated running statistics (for ``running``)."""
    out = scores.clone()
    new_running = running
    if reward_norm is not None:
        if reward_norm == "batch":
            mean = out.mean().expand_as(out)
            std = out.std().expand_as(out) if out.numel() > 1 else torch.zeros_like(out)
        elif reward_norm == "group":
            if groups is None:
                raise ValueError("reward_norm='group' needs per-row group ids")
            mean, std, count = group_stats(out, groups)
            mean = torch.where(count > 1, mean, out)  # a group of one normalises to 0
        elif reward_norm == "running":
            new_running = (running or RunningMeanStd()).update(out)
            mean = torch.full_like(out, new_running.mean)
            std = torch.full_like(out, new_running.var**0.5)
        else:
            raise ValueError(f"unknown reward_norm {reward_norm!r}; use batch, group, running or null")
        do_shift = reward_shift or not reward_scale
        do_scale = reward_scale or not reward_shift
        if do_shift:
            out = out - mean
        if do_scale:
            out = out / (std + EPS)
    if reward_clip is not None:
        out = out.clamp(-reward_clip, reward_clip)
    return out, new_running

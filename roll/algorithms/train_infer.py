"""The gap between the trainer's log-probs and the sampler's, and its correction.

The inference engine (actor_infer) samples with its own kernels and precision; the trainer's
log-probs of the same tokens (the old log-probs) differ a little. ``train_infer_correction``
measures that gap at four granularities and, as configured, turns it into an importance weight on
each token's policy loss and into filters that drop tokens from the loss mask:

- token: r_t = exp(old_t - infer_t), d_t = p_old_t - p_infer_t;
- segment: per model turn (contiguous run of the mask), exp of the mean log-ratio / the mean diff;
- geometric: per row, exp of the mean log-ratio / the mean diff;
- sequence: per row, exp of the summed log-ratio / the summed diff.

Log-ratios are clamped to [-20, 20] before exp, so a long row cannot overflow to inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from roll.algorithms.losses import GlobalCounts, segment_mean, token_share
from roll.algorithms.masked import masked_sum

GRANULARITIES = ("token", "segment", "geometric", "sequence")


@dataclass(frozen=True)
class FilterRule:
    """Keep a token only where its ratio (and/or diff) at ``agg_type`` granularity lies in the bounds."""

    agg_type: str = "token"
    ratio_enabled: bool = True
    ratio_low: float = 0.8
    ratio_high: float = 1.2
    diff_enabled: bool = False
    diff_low: float = -0.2
    diff_high: float = 0.2


@dataclass(frozen=True)
class Correction:
    """What to apply (the enabled parts of the ``train_infer_correction`` config)."""

    weight_enabled: bool = False
    weight_type: str = "token"
    upper_bound: float | None = 1.2
    detach: bool = True
    filters: tuple[FilterRule, ...] = field(default_factory=tuple)

    @property
    def active(self) -> bool:
        return self.weight_enabled or bool(self.filters)


def at_granularity(x: torch.Tensor, mask: torch.Tensor, kind: str, reduce: str) -> torch.Tensor:
    """``x`` [B, T] turned into per-token values of ``kind``: token (itself), segment (the turn's mean),
    geometric/sequence (the row's mean / sum, the latter with ``reduce="sum"``) broadcast over the row."""
    m = mask.to(x.dtype)
    if kind == "token":
        return x
    if kind == "segment":
        return segment_mean(x, mask)
    if kind in ("geometric", "sequence"):
        total = masked_sum(x, m, dim=-1)
        row = total if reduce == "sum" else total / m.sum(-1).clamp(min=1)
        return row[:, None].expand_as(x)
    raise ValueError(f"unknown granularity {kind!r}; use one of {GRANULARITIES}")


def gap(old: torch.Tensor, infer: torch.Tensor, mask: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ratio, diff) per token at granularity ``kind`` (see the module docstring)."""
    log_ratio = old - infer
    diff = old.exp() - infer.exp()
    reduce = "sum" if kind == "sequence" else "mean"
    ratio = at_granularity(log_ratio, mask, kind, reduce).clamp(-20.0, 20.0).exp()
    return ratio, at_granularity(diff, mask, kind, reduce)


def train_infer_correction(
    cfg: Correction, mask: torch.Tensor, old: torch.Tensor, infer: torch.Tensor, counts: GlobalCounts | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(importance weight or None, keep mask, metrics) for rows with loss ``mask``, trainer log-probs ``old``
    and sampler log-probs ``infer`` (all [B, T], token-aligned).

    The weight is the ratio at ``weight_type`` clipped to [0, upper_bound] (detached unless asked
    otherwise); the keep mask is 1 where every enabled filter passes. Metrics (always, so the gap is
    visible every step) are this batch's shares of global token means: summed over micro-batches they
    give the whole batch's value."""
    mask = mask.to(old.dtype)
    metrics: dict[str, float] = {
        "actor/train_infer_logprob_abs_diff": token_share((old - infer).abs(), mask, counts),
    }
    stats = {kind: gap(old, infer, mask, kind) for kind in GRANULARITIES}
    for kind, (ratio, diff) in stats.items():
        metrics[f"actor/train_infer_ratio_{kind}_mean"] = token_share(ratio, mask, counts)
        metrics[f"actor/train_infer_diff_{kind}_mean"] = token_share(diff, mask, counts)
    weight = None
    if cfg.weight_enabled:
        weight = stats[cfg.weight_type][0]
        if cfg.upper_bound is not None:
            metrics["actor/is_weight_clipfrac"] = token_share((weight > cfg.upper_bound).float(), mask, counts)
            weight = weight.clamp(0.0, cfg.upper_bound)
        weight = weight.detach() if cfg.detach else weight
        metrics["actor/is_weight_mean"] = token_share(weight, mask, counts)
        on_mask = weight.detach()[mask.bool()]
        metrics["actor/is_weight_max"] = float(on_mask.max()) if on_mask.numel() else 0.0  # a maximum, not a share
    keep = torch.ones_like(mask)
    for rule in cfg.filters:
        ratio, diff = stats[rule.agg_type]
        if rule.ratio_enabled:
            passed = ((ratio >= rule.ratio_low) & (ratio <= rule.ratio_high)).to(mask.dtype)
            metrics[f"actor/train_infer_{rule.agg_type}_ratio_pass"] = token_share(passed, mask, counts)
            keep = keep * passed
        if rule.diff_enabled:
            passed = ((diff >= rule.diff_low) & (diff <= rule.diff_high)).to(mask.dtype)
            metrics[f"actor/train_infer_{rule.agg_type}_diff_pass"] = token_share(passed, mask, counts)
            keep = keep * passed
    if cfg.filters:
        metrics["actor/train_infer_kept"] = token_share(keep, mask, counts)
    return weight, keep, metrics

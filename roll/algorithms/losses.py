"""Policy and value losses, aggregated so that micro-batches and data-parallel ranks add up to the
loss of one big batch.

Aggregation (``loss_agg_mode``) divides by *global* counts passed in by the caller: the number of
valid tokens, or of rows with at least one valid token, in the whole global batch. Summing the
aggregated losses of the micro-batches then equals the aggregated loss of the full batch. Without
global counts the local ones are used (a plain mean of this batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.algorithms.kl import kl_penalty
from roll.algorithms.masked import masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class GlobalCounts:
    """Denominators for loss aggregation over the whole global batch."""

    tokens: float  # valid tokens
    seqs: float  # rows with at least one valid token
    norm_length: float = 1.0  # seq-mean-token-sum-norm: the fixed length tokens sums are divided by

    @staticmethod
    def of(mask: torch.Tensor, norm_length: float | None = None) -> GlobalCounts:
        return GlobalCounts(
            tokens=float(mask.sum()),
            seqs=float((mask.sum(-1) > 0).sum()),
            norm_length=float(norm_length if norm_length is not None else mask.shape[-1]),
        )


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, counts: GlobalCounts | None = None) -> torch.Tensor:
    """Reduce a [B, T] token loss to a scalar with ``mode``, normalised by global ``counts``."""
    counts = counts or GlobalCounts.of(mask)
    if mode == "token-mean":
        return masked_sum(loss, mask) / max(counts.tokens, 1.0)
    per_row_sum = masked_sum(loss, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return per_row_sum.sum() / max(counts.seqs, 1.0)
    if mode == "seq-mean-token-mean":
        return (per_row_sum / mask.sum(-1).clamp(min=1)).sum() / max(counts.seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return per_row_sum.sum() / (max(counts.seqs, 1.0) * counts.norm_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; use one of {LOSS_AGG_MODES}")


def ppo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg_mode: str = "token-mean",
    counts: GlobalCounts | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO surrogate: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with ``dual_clip``
    (c > 1) the loss of negative-advantage tokens is also capped at -A c."""
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_frac = torch.zeros(())
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual clip constant must be > 1, got {dual_clip}")
        capped = torch.minimum(loss, -advantages * dual_clip)
        dual_hit = (advantages < 0) & (loss > -advantages * dual_clip)
        loss = torch.where(advantages < 0, capped, loss)
        dual_frac = masked_mean(dual_hit.float(), mask)
    metrics = {
        "actor/pg_clipfrac": float(masked_mean((clipped > unclipped).float(), mask)),
        "actor/ppo_kl": float(masked_mean(-log_ratio, mask)),
        "actor/ratio_mean": float(masked_mean(ratio.detach(), mask)),
        "actor/dual_clipfrac": float(dual_frac),
    }
    return aggregate(loss, mask, agg_mode, counts), metrics


def topr_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
    agg_mode: str = "token-mean",
    counts: GlobalCounts | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TOPR (tapered off-policy REINFORCE): positive-advantage tokens get the plain REINFORCE
    gradient; negative ones are weighted by the truncated ratio min(r, 1) (no gradient through it)."""
    ratio = torch.exp((logprob - old_logprob).clamp(-20.0, 20.0)).detach()
    positive = advantages >= 0
    weight = torch.where(positive, torch.full_like(ratio, positive_weight), negative_weight * ratio.clamp(max=1.0))
    loss = -weight * advantages * logprob
    metrics = {"actor/topr_negative_frac": float(masked_mean((~positive).float(), mask))}
    return aggregate(loss, mask, agg_mode, counts), metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = None,
    agg_mode: str = "token-mean",
    counts: GlobalCounts | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 (V - R)^2; with ``clip``, 0.5 max((V - R)^2, (V_clipped - R)^2) where V_clipped stays
    within ``clip`` of the old values."""
    err = (values - returns) ** 2
    if clip is None:
        loss = 0.5 * err
        clipfrac = torch.zeros(())
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        err_clipped = (clipped_values - returns) ** 2
        loss = 0.5 * torch.maximum(err, err_clipped)
        clipfrac = masked_mean((err_clipped > err).float(), mask)
    metrics = {
        "critic/vf_clipfrac": float(clipfrac),
        "critic/vpred_mean": float(masked_mean(values.detach(), mask)),
    }
    return aggregate(loss, mask, agg_mode, counts), metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of the categorical distribution given by ``logits`` [..., V]."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass(frozen=True)
class ActorLossConfig:
    """The actor loss knobs (top-level config keys, passed in as values)."""

    pg_clip_low: float = 0.2
    pg_clip_high: float = 0.2
    dual_clip: float | None = None
    use_topr_loss: bool = False
    topr_positive_weight: float = 1.0
    topr_negative_weight: float = 1.0
    rl_loss_coef: float = 1.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    entropy_loss_coef: float = 0.0
    sft_loss_coef: float = 0.0
    l2: float = 0.0
    agg_mode: str = "seq-mean-token-mean"


def actor_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: ActorLossConfig,
    *,
    ref_logprob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    positive_rows: torch.Tensor | None = None,
    params: list[torch.Tensor] | None = None,
    counts: GlobalCounts | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """rl_loss_coef x (PPO or TOPR) + kl_loss_coef x KL(ref) - entropy_loss_coef x entropy
    + sft_loss_coef x NLL on positive rows + l2 x ||params||^2; returns (loss, metrics)."""
    if cfg.use_topr_loss:
        pg, metrics = topr_policy_loss(logprob, old_logprob, advantages, mask, positive_weight=cfg.topr_positive_weight,
                                       negative_weight=cfg.topr_negative_weight, agg_mode=cfg.agg_mode, counts=counts)
    else:
        pg, metrics = ppo_policy_loss(logprob, old_logprob, advantages, mask, clip_low=cfg.pg_clip_low,
                                      clip_high=cfg.pg_clip_high, dual_clip=cfg.dual_clip, agg_mode=cfg.agg_mode, counts=counts)
    total = cfg.rl_loss_coef * pg
    metrics["actor/pg_loss"] = float(pg)
    if cfg.use_kl_loss:
        if ref_logprob is None:
            raise ValueError("use_kl_loss needs the reference log-probs")
        kl = aggregate(kl_penalty(logprob, ref_logprob, cfg.kl_loss_type), mask, cfg.agg_mode, counts)
        total = total + cfg.kl_loss_coef * kl
        metrics["actor/kl_loss"] = float(kl)
    if entropy is not None:
        ent = aggregate(entropy, mask, cfg.agg_mode, counts)
        total = total - cfg.entropy_loss_coef * ent
        metrics["actor/entropy"] = float(ent)
    if cfg.sft_loss_coef:
        if positive_rows is None:
            raise ValueError("sft_loss_coef needs the positive rows")
        sft_mask = mask * positive_rows[:, None].to(mask.dtype)
        sft = aggregate(-logprob, sft_mask, cfg.agg_mode, counts)
        total = total + cfg.sft_loss_coef * sft
        metrics["actor/sft_loss"] = float(sft)
    if cfg.l2 and params:
        total = total + cfg.l2 * sum((p.float() ** 2).sum() for p in params)
    metrics["actor/loss"] = float(total)
    return total, metrics

"""Policy and value losses, aggregated so that micro-batches and data-parallel ranks add up to the
loss of one big batch.

Aggregation (``loss_agg_mode``) divides by *global* counts passed in by the caller: the number of
valid tokens, or of rows with at least one valid token, in the whole global batch. Summing the
aggregated losses of the micro-batches then equals the aggregated loss of the full batch. Without
global counts the local ones are used (a plain mean of this batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from roll.algorithms.kl import kl_penalty
from roll.algorithms.masked import masked_sum

if TYPE_CHECKING:
    from roll.algorithms.train_infer import Correction

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class GlobalCounts:
    """Denominators for loss aggregation over the whole global batch."""

    tokens: float  # valid tokens
    seqs: float  # rows with at least one valid token

    @staticmethod
    def of(mask: torch.Tensor) -> GlobalCounts:
        return GlobalCounts(tokens=float(mask.sum()), seqs=float((mask.sum(-1) > 0).sum()))


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, counts: GlobalCounts | None = None,
              norm_length: float | None = None) -> torch.Tensor:
    """Reduce a [B, T] token loss to a scalar with ``mode``, normalised by global ``counts``.

    ``seq-mean-token-sum-norm`` divides the token sums by ``norm_length``, a constant of the run (the
    configured sequence length): a per-batch padded width would change the loss scale from batch to batch."""
    counts = counts or GlobalCounts.of(mask)
    if mode == "token-mean":
        return masked_sum(loss, mask) / max(counts.tokens, 1.0)
    per_row_sum = masked_sum(loss, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return per_row_sum.sum() / max(counts.seqs, 1.0)
    if mode == "seq-mean-token-mean":
        return (per_row_sum / mask.sum(-1).clamp(min=1)).sum() / max(counts.seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        if norm_length is None or norm_length <= 0:
            raise ValueError("loss_agg_mode 'seq-mean-token-sum-norm' needs a positive constant norm_length")
        return per_row_sum.sum() / (max(counts.seqs, 1.0) * norm_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; use one of {LOSS_AGG_MODES}")


def token_share(x: torch.Tensor, mask: torch.Tensor, counts: GlobalCounts | None = None) -> float:
    """This batch's part of the global token mean of ``x``: summed over micro-batches and data-parallel
    ranks, the parts give the token mean of the whole global batch (how every diagnostic is reported)."""
    counts = counts or GlobalCounts.of(mask)
    return float(masked_sum(x.detach().float(), mask) / max(counts.tokens, 1.0))


def segment_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each contiguous run of mask=1 (one model turn) replaced by the mean of ``x`` over that run;
    0 off the mask. ``ratio_type: segment`` takes the importance ratio per turn this way."""
    m = mask.long()
    starts = (m - torch.nn.functional.pad(m, (1, 0))[:, :-1]).clamp(min=0)
    seg = torch.cumsum(starts, dim=1) * m  # 1-based segment id on mask=1, 0 elsewhere
    n_seg = int(seg.max()) + 1 if seg.numel() else 1
    flat = (seg + torch.arange(seg.shape[0], device=seg.device)[:, None] * n_seg).flatten()
    values = torch.where(mask.bool(), x, torch.zeros_like(x)).flatten()
    sums = torch.zeros(seg.shape[0] * n_seg, dtype=x.dtype, device=x.device).index_add(0, flat, values)
    sizes = torch.zeros(seg.shape[0] * n_seg, dtype=x.dtype, device=x.device).index_add(0, flat, m.flatten().to(x.dtype))
    means = (sums / sizes.clamp(min=1))[flat].view_as(x)
    return torch.where(mask.bool(), means, torch.zeros_like(x))


def log_ratio_of(logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor, ratio_type: str = "token") -> torch.Tensor:
    """log(pi / pi_old) per token (``token``) or the mean over each turn, on each of its tokens (``segment``)."""
    log_ratio = logprob - old_logprob
    if ratio_type == "segment":
        log_ratio = segment_mean(log_ratio, mask)
    elif ratio_type != "token":
        raise ValueError(f"unknown ratio_type {ratio_type!r}; use token or segment")
    return log_ratio.clamp(-20.0, 20.0)


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
    norm_length: float | None = None,
    ratio_type: str = "token",
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO surrogate: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with ``dual_clip``
    (c > 1) the loss of negative-advantage tokens is also capped at -A c. ``ratio_type: segment``
    uses one ratio per model turn (the exp of the turn's mean log-ratio). ``weight`` multiplies each
    token's loss before aggregation (the train/infer importance weight)."""
    log_ratio = log_ratio_of(logprob, old_logprob, mask, ratio_type)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_hit = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual clip constant must be > 1, got {dual_clip}")
        capped = torch.minimum(loss, -advantages * dual_clip)
        dual_hit = (advantages < 0) & (loss > -advantages * dual_clip)
        loss = torch.where(advantages < 0, capped, loss)
    metrics = {
        "actor/pg_clipfrac": token_share((clipped > unclipped).float(), mask, counts),
        "actor/ppo_kl": token_share(-log_ratio, mask, counts),
        "actor/ratio_mean": token_share(ratio, mask, counts),
        "actor/dual_clipfrac": token_share(dual_hit.float(), mask, counts),
    }
    return aggregate(_weighted(loss, weight), mask, agg_mode, counts, norm_length), metrics


def _weighted(loss: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    return loss if weight is None else loss * weight


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
    norm_length: float | None = None,
    ratio_type: str = "token",
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TOPR (tapered off-policy REINFORCE): positive-advantage tokens get the plain REINFORCE
    gradient; negative ones are weighted by the truncated ratio min(r, 1) (no gradient through it)."""
    ratio = torch.exp(log_ratio_of(logprob, old_logprob, mask, ratio_type)).detach()
    positive = advantages >= 0
    taper = torch.where(positive, torch.full_like(ratio, positive_weight), negative_weight * ratio.clamp(max=1.0))
    loss = -taper * advantages * logprob
    metrics = {"actor/topr_negative_frac": token_share((~positive).float(), mask, counts)}
    return aggregate(_weighted(loss, weight), mask, agg_mode, counts, norm_length), metrics


PG_VARIANTS = ("vanilla", "ppo", "tis", "topr", "cispo", "kimi15")
TIS_BOUNDS = (0.0, 1.0)  # the truncation range of tis and of topr's negative samples
CISPO_EPSILON = (0.1, 0.1)  # cispo keeps its weight in [1 - low, 1 + high]
KIMI15_TAU = 0.1  # strength of kimi15's squared log-ratio penalty


def variant_token_loss(
    variant: str,
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    positive_rows: torch.Tensor | None = None,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
    ratio_type: str = "token",
    counts: GlobalCounts | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The [B, T] token loss of a ``pg_variant`` other than ppo, with r = pi / pi_old (of ``ratio_type``):

    - vanilla: -A log pi (plain REINFORCE, no ratio);
    - tis: -sg(clip(r, 0, 1)) A log pi (truncated importance sampling);
    - topr: rows of positive episodes (``positive_rows``: score > 0) -A log pi, the others
      -sg(clip(r, 0, 1)) A log pi, weighted by ``positive_weight`` / ``negative_weight``;
    - cispo: -sg(clip(r, 1 - 0.1, 1 + 0.1)) A log pi;
    - kimi15: -A log pi + tau / 2 (log pi - log pi_old)^2 with tau 0.1.

    sg is stop-gradient. Metrics are this batch's shares of the global token means."""
    log_ratio = log_ratio_of(logprob, old_logprob, mask, ratio_type)
    ratio = torch.exp(log_ratio).detach()
    metrics: dict[str, float] = {"actor/ratio_mean": token_share(ratio, mask, counts)}
    if variant == "vanilla":
        return -advantages * logprob, metrics
    if variant in ("tis", "topr"):
        low, high = TIS_BOUNDS
        truncated = ratio.clamp(low, high)
        metrics[f"actor/{variant}_clipfrac"] = token_share(((ratio < low) | (ratio > high)).float(), mask, counts)
        if variant == "tis":
            return -truncated * advantages * logprob, metrics
        if positive_rows is None:
            raise ValueError("pg_variant topr needs the rows' episode scores (positive_rows)")
        positive = positive_rows.to(logprob.dtype)[:, None].expand_as(logprob)
        loss = positive_weight * positive * (-advantages * logprob) + negative_weight * (1 - positive) * (
            -truncated * advantages * logprob)
        metrics["actor/topr_positive_frac"] = token_share(positive, mask, counts)
        return loss, metrics
    if variant == "cispo":
        low, high = 1.0 - CISPO_EPSILON[0], 1.0 + CISPO_EPSILON[1]
        metrics["actor/cispo_clipfrac"] = token_share(((ratio < low) | (ratio > high)).float(), mask, counts)
        return -ratio.clamp(low, high) * advantages * logprob, metrics
    if variant == "kimi15":
        penalty = 0.5 * KIMI15_TAU * (logprob - old_logprob) ** 2
        metrics["actor/kimi15_penalty"] = token_share(penalty, mask, counts)
        return -advantages * logprob + penalty, metrics
    raise ValueError(f"unknown pg_variant {variant!r}; use one of {PG_VARIANTS}")


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = None,
    agg_mode: str = "token-mean",
    counts: GlobalCounts | None = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 (V - R)^2; with ``clip``, 0.5 max((V - R)^2, (V_clipped - R)^2) where V_clipped stays
    within ``clip`` of the old values."""
    err = (values - returns) ** 2
    if clip is None:
        loss = 0.5 * err
        clip_hit = torch.zeros_like(err, dtype=torch.bool)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        err_clipped = (clipped_values - returns) ** 2
        loss = 0.5 * torch.maximum(err, err_clipped)
        clip_hit = err_clipped > err
    total = aggregate(loss, mask, agg_mode, counts, norm_length)
    metrics = {
        "critic/value_loss": float(total.detach()),
        "critic/vf_clipfrac": token_share(clip_hit.float(), mask, counts),
        "critic/vpred_mean": token_share(values, mask, counts),
    }
    return total, metrics


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
    agg_mode: str = "seq-mean-token-mean"
    norm_length: float | None = None  # seq-mean-token-sum-norm: the run's constant length
    ratio_type: str = "token"
    pg_variant: str | None = None  # ROLL's agentic PG worker losses (see variant_token_loss); None: PPO / TOPR above
    correction: Correction | None = None  # train/infer correction applied in the loss (no recomputed old log-probs)


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
    counts: GlobalCounts | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """rl_loss_coef x (the pg_variant loss, else PPO or TOPR) + kl_loss_coef x KL(ref) - entropy_loss_coef
    x entropy + sft_loss_coef x NLL on positive rows; returns (loss, metrics). ``weight`` multiplies each
    token's policy loss before aggregation (the train/infer importance weight).

    Every metric is this batch's part of the global-batch value (see ``token_share``): the parts of
    all micro-batches and ranks add up to the metric of the whole batch, as the losses do."""
    agg = {"agg_mode": cfg.agg_mode, "counts": counts, "norm_length": cfg.norm_length}
    if cfg.pg_variant not in (None, "ppo"):
        tokens, metrics = variant_token_loss(
            cfg.pg_variant, logprob, old_logprob, advantages, mask, positive_rows=positive_rows,
            positive_weight=cfg.topr_positive_weight, negative_weight=cfg.topr_negative_weight,
            ratio_type=cfg.ratio_type, counts=counts)
        pg = aggregate(_weighted(tokens, weight), mask, cfg.agg_mode, counts, cfg.norm_length)
    elif cfg.use_topr_loss and cfg.pg_variant is None:
        pg, metrics = topr_policy_loss(logprob, old_logprob, advantages, mask, positive_weight=cfg.topr_positive_weight,
                                       negative_weight=cfg.topr_negative_weight, ratio_type=cfg.ratio_type, weight=weight,
                                       **agg)
    else:
        pg, metrics = ppo_policy_loss(logprob, old_logprob, advantages, mask, clip_low=cfg.pg_clip_low,
                                      clip_high=cfg.pg_clip_high, dual_clip=cfg.dual_clip, ratio_type=cfg.ratio_type,
                                      weight=weight, **agg)
    total = cfg.rl_loss_coef * pg
    metrics["actor/pg_loss"] = float(pg.detach())
    if cfg.use_kl_loss:
        if ref_logprob is None:
            raise ValueError("use_kl_loss needs the reference log-probs")
        kl = aggregate(kl_penalty(logprob, ref_logprob, cfg.kl_loss_type), mask, cfg.agg_mode, counts, cfg.norm_length)
        total = total + cfg.kl_loss_coef * kl
        metrics["actor/kl_loss"] = float(kl.detach())
    if entropy is not None:
        ent = aggregate(entropy, mask, cfg.agg_mode, counts, cfg.norm_length)
        total = total - cfg.entropy_loss_coef * ent
        metrics["actor/entropy"] = float(ent.detach())
    if cfg.sft_loss_coef:
        if positive_rows is None:
            raise ValueError("sft_loss_coef needs the positive rows")
        sft_mask = mask * positive_rows[:, None].to(mask.dtype)
        sft = aggregate(-logprob, sft_mask, cfg.agg_mode, counts, cfg.norm_length)
        total = total + cfg.sft_loss_coef * sft
        metrics["actor/sft_loss"] = float(sft.detach())
    metrics["actor/loss"] = float(total.detach())
    return total, metrics

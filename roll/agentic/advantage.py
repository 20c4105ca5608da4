"""From a collected batch to advantages, in the order the algorithm reads:
reward normalisation -> token rewards (+ KL penalty) -> advantage estimator -> whitening/clipping.

This is the only place that maps config keys onto ``roll.algorithms`` (pure functions).

Rewards are normalised once, as configured: by ``reward_normalization`` (agentic grouping, method or
explicit mean/std scopes) or by the top-level scope keys (``reward_norm``, ``norm_mean_type``,
``norm_std_type``, ``reward_shift``, ``reward_scale``); the config loader refuses both at once. The
estimators then take the normalised scores as they are (GRPO's group baseline *is* this
normalisation). Step-wise batches hold one row per turn: their episode-level statistics are taken
over trajectories, one value each, so a long episode weighs no more than a short one.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.algorithms.advantages import (
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    postprocess_advantages,
    step_returns,
    token_level_rewards,
)
from roll.algorithms.kl import kl_penalty
from roll.algorithms.masked import group_ids, masked_mean, masked_whiten
from roll.algorithms.reward_norm import (
    NormSpec,
    RunningMeanStd,
    method_scopes,
    normalize_scores,
    singleton_share,
)
from roll.distributed.batch import Batch


def grouping_ids(batch: Batch, grouping: str, step_level: bool = False) -> torch.Tensor:
    """Row groups for reward normalisation: traj_group_id, tags, batch, state, or any per-row key.

    ``state`` (and ROLL's ``inductive``) groups trajectory rows by their initial state, which is the
    GRPO group; with ``step_level`` rows of step-wise batches group by (GRPO group, state)."""
    n = len(batch)
    if grouping == "batch":
        return torch.zeros(n, dtype=torch.long)
    if grouping in ("state", "inductive"):
        if step_level and "state_hash" in batch:
            return group_ids(list(zip(batch["traj_group_id"].tolist(), batch["state_hash"].tolist())))
        return group_ids(batch["traj_group_id"].tolist())
    if grouping not in batch:
        raise KeyError(f"reward_normalization.grouping: the batch has no per-row key {grouping!r}")
    values = batch[grouping]
    return group_ids(values.tolist() if hasattr(values, "tolist") else list(values))


def reward_norm_spec(cfg: Any) -> tuple[NormSpec, str]:
    """The one normalisation the config asks for, and the grouping its ``group`` scope uses."""
    norm = cfg.reward_normalization
    derived = method_scopes(norm.method, norm.grouping)
    # ROLL's rule: an explicit mean/std scope wins; each one left unset falls back to the method's.
    agentic = NormSpec(norm.norm_mean_type or derived.mean_scope, norm.norm_std_type or derived.std_scope, derived.clip)
    if agentic.active:
        return agentic, norm.grouping
    if cfg.norm_mean_type is not None or cfg.norm_std_type is not None:
        return NormSpec(cfg.norm_mean_type, cfg.norm_std_type), "traj_group_id"
    if cfg.reward_norm is not None:
        shift_only = cfg.reward_shift and not cfg.reward_scale
        scale_only = cfg.reward_scale and not cfg.reward_shift
        return NormSpec(None if scale_only else cfg.reward_norm, None if shift_only else cfg.reward_norm), "traj_group_id"
    return NormSpec(), "traj_group_id"


def _per_trajectory(batch: Batch) -> tuple[list[int], torch.Tensor]:
    """(first row of each trajectory, trajectory index of every row)."""
    first: dict[Any, int] = {}
    owner = [first.setdefault(t, len(first)) for t in batch["traj_id"].tolist()]
    rows = [0] * len(first)
    for i, t in reversed(list(enumerate(owner))):
        rows[t] = i
    return rows, torch.tensor(owner, dtype=torch.long)


def normalized_scores(
    batch: Batch, cfg: Any, running: RunningMeanStd | None
) -> tuple[torch.Tensor, RunningMeanStd | None, dict[str, float]]:
    """Per-row normalised outcome: the episode score (step-wise rows: normalised over trajectories)
    or, for step_reinforce, each step's discounted return."""
    spec, grouping = reward_norm_spec(cfg)
    metrics: dict[str, float] = {}
    step_rows = "step_rewards" in batch
    if step_rows and cfg.adv_estimator == "step_reinforce":
        traj = group_ids(batch["traj_id"].tolist())
        values = step_returns(batch["step_rewards"].float(), traj, batch["step_idx"], cfg.step_reward_gamma)
        groups = grouping_ids(batch, grouping, step_level=True)
        out, running = normalize_scores(values, spec, groups, running)
    elif step_rows:
        first_rows, owner = _per_trajectory(batch)
        episodes = batch.select(first_rows)
        groups = grouping_ids(episodes, grouping)
        out, running = normalize_scores(episodes["scores"].float(), spec, groups, running)
        out = out[owner]
    else:
        groups = grouping_ids(batch, grouping)
        out, running = normalize_scores(batch["scores"].float(), spec, groups, running)
    if spec.uses_groups:
        metrics["reward/singleton_group_share"] = singleton_share(groups)
    if cfg.reward_clip is not None:
        out = out.clamp(-cfg.reward_clip, cfg.reward_clip)
    return out, running, metrics


def compute_batch_advantages(
    batch: Batch, cfg: Any, kl_coef: float, running: RunningMeanStd | None
) -> tuple[Batch, dict[str, float], RunningMeanStd | None]:
    """Add ``advantages``, ``returns`` and ``token_rewards`` to ``batch``; return metrics."""
    mask = batch["response_mask"].float()
    step_rows = "step_rewards" in batch
    raw = batch["scores"].float()
    episode_raw = raw[_per_trajectory(batch)[0]] if step_rows else raw
    metrics: dict[str, float] = {"reward/score_mean": float(episode_raw.mean()) if len(episode_raw) else 0.0}

    # 1. reward normalisation (once, as configured)
    scores, running, norm_metrics = normalized_scores(batch, cfg, running)
    metrics.update(norm_metrics)
    metrics["reward/normalized_mean"] = float(scores.mean()) if len(scores) else 0.0

    # 2. token rewards with the KL penalty to the reference
    kl = None
    if "ref_logprobs" in batch:
        kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], cfg.kl_penalty)
        metrics["actor/kl_to_reference"] = float(masked_mean(kl, mask))
    coef = kl_coef if cfg.add_token_level_kl else 0.0
    token_rewards = token_level_rewards(scores, mask, kl, coef)
    if cfg.whiten_rewards:
        token_rewards = masked_whiten(token_rewards, mask, shift_mean=False)

    # 3. the estimator
    groups = group_ids(batch["traj_group_id"].tolist())
    inputs = AdvantageInputs(response_mask=mask, token_rewards=token_rewards, scores=scores, groups=groups,
                             values=batch.tensors.get("values"))
    if "turn_rewards" in batch:
        inputs.turn_rewards = batch["turn_rewards"]
    if step_rows:
        traj = group_ids(batch["traj_id"].tolist())
        inputs.step_return = (scores if cfg.adv_estimator == "step_reinforce"
                              else step_returns(batch["step_rewards"].float(), traj, batch["step_idx"], cfg.step_reward_gamma))
        inputs.state_groups = grouping_ids(batch, "state", step_level=True)
    norm = cfg.reward_normalization
    params = AdvantageParams(gamma=cfg.gamma, lambd=cfg.lambd, episode_weight=cfg.episode_reward_weight,
                             step_weight=cfg.step_reward_weight, step_norm=method_scopes(norm.method, "state"))
    advantages, returns = compute_advantages(cfg.adv_estimator, inputs, params)
    advantages = postprocess_advantages(advantages, mask, cfg.whiten_advantages, cfg.advantage_clip)

    valid = mask.bool()
    metrics.update({
        "critic/advantages_mean": float(advantages[valid].mean()) if valid.any() else 0.0,
        "critic/advantages_max": float(advantages[valid].max()) if valid.any() else 0.0,
        "critic/advantages_min": float(advantages[valid].min()) if valid.any() else 0.0,
        "critic/returns_mean": float(returns[valid].mean()) if valid.any() else 0.0,
        "actor/kl_coef": float(coef),
    })
    return batch | Batch({"advantages": advantages, "returns": returns, "token_rewards": token_rewards}), metrics, running

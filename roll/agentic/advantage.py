"""From a collected batch to advantages, in the order the algorithm reads:
reward normalisation -> token rewards (+ KL penalty) -> advantage estimator -> whitening/clipping.

This is the only place that maps config keys onto ``roll.algorithms`` (pure functions)."""

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
from roll.algorithms.reward_norm import RunningMeanStd, normalize_in_groups, normalize_rewards
from roll.distributed.batch import Batch


def grouping_ids(batch: Batch, grouping: str) -> torch.Tensor:
    """Row groups for reward normalisation: traj_group_id, tags, batch, state, or any per-row key."""
    n = len(batch)
    if grouping == "batch":
        return torch.zeros(n, dtype=torch.long)
    if grouping in ("state", "inductive"):
        # trajectory rows: one group per initial state (= GRPO group); step rows: per (group, state)
        if "state_hash" in batch:
            return group_ids(list(zip(batch["traj_group_id"].tolist(), batch["state_hash"].tolist())))
        return group_ids(batch["traj_group_id"].tolist())
    if grouping not in batch:
        raise KeyError(f"reward_normalization.grouping: the batch has no per-row key {grouping!r}")
    values = batch[grouping]
    return group_ids(values.tolist() if hasattr(values, "tolist") else list(values))


def compute_batch_advantages(
    batch: Batch, cfg: Any, kl_coef: float, running: RunningMeanStd | None
) -> tuple[Batch, dict[str, float], RunningMeanStd | None]:
    """Add ``advantages``, ``returns`` and ``token_rewards`` to ``batch``; return metrics."""
    mask = batch["response_mask"].float()
    raw = batch["scores"].float() if "step_rewards" not in batch else batch["step_rewards"].float()
    metrics: dict[str, float] = {"reward/score_mean": float(batch["scores"].float().mean())}

    # 1. reward normalisation (agentic grouping, then the scope-based options)
    norm = cfg.reward_normalization
    scores = normalize_in_groups(batch["scores"].float(), grouping_ids(batch, norm.grouping), norm.method)
    scope = cfg.reward_norm or cfg.norm_mean_type or cfg.norm_std_type
    if scope or cfg.reward_clip is not None:
        scores, running = normalize_rewards(
            scores, reward_norm=scope, groups=group_ids(batch["traj_group_id"].tolist()), running=running,
            reward_shift=cfg.reward_shift or (cfg.norm_mean_type is not None and cfg.norm_std_type is None),
            reward_scale=cfg.reward_scale or (cfg.norm_std_type is not None and cfg.norm_mean_type is None),
            reward_clip=cfg.reward_clip,
        )
    metrics["reward/normalized_mean"] = float(scores.mean())

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
    if "step_rewards" in batch:
        traj = group_ids(batch["traj_id"].tolist())
        inputs.step_return = step_returns(raw, traj, batch["step_idx"], cfg.step_reward_gamma)
        inputs.state_groups = group_ids(list(zip(batch["traj_group_id"].tolist(), batch["state_hash"].tolist())))
    params = AdvantageParams(gamma=cfg.gamma, lambd=cfg.lambd, episode_weight=cfg.episode_reward_weight,
                             step_weight=cfg.step_reward_weight,
                             norm_by_std=norm.method != "mean")
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

"""Advantage estimators over token rows ([B, T] tensors with a response mask).

Every recursion runs over response tokens only: positions with ``response_mask == 0`` (prompt,
padding, the env's observation tokens between turns) are skipped, carry nothing and get 0, so a
multi-turn row behaves like the sequence of its model tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from roll.algorithms.masked import group_stats, masked_whiten
from roll.algorithms.reward_norm import NormSpec, normalize_scores


def broadcast(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A per-row value on every response token of the row."""
    return per_row[:, None].to(torch.float32) * mask.to(torch.float32)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last response token per row (-1 for rows without one)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values


def place_on_last_token(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward on the last response token of each row, zero elsewhere."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    last = last_token_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = scores[rows].to(torch.float32)
    return out


def token_level_rewards(
    scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """Outcome reward on the last response token, minus ``kl_coef * kl`` on every response token."""
    rewards = place_on_last_token(scores, mask)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * torch.where(mask.bool(), kl.float(), torch.zeros_like(rewards))
    return rewards


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_next over response tokens (REINFORCE returns)."""
    valid = mask.bool()
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float32, device=token_rewards.device)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        updated = token_rewards[:, t].float() + gamma * running
        running = torch.where(valid[:, t], updated, running)
        returns[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
    return returns


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns (advantages, returns = advantages + values).

    delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lambd * A_next, where "next" is the
    next response token of the row (0 after the last one).
    """
    valid = mask.bool()
    batch = token_rewards.shape[0]
    adv = torch.zeros_like(token_rewards, dtype=torch.float32)
    next_value = torch.zeros(batch, dtype=torch.float32, device=token_rewards.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        v = values[:, t].float()
        delta = token_rewards[:, t].float() + gamma * next_value - v
        a = delta + gamma * lambd * next_adv
        next_adv = torch.where(valid[:, t], a, next_adv)
        next_value = torch.where(valid[:, t], v, next_value)
        adv[:, t] = torch.where(valid[:, t], a, torch.zeros_like(a))
    returns = torch.where(valid, adv + values.float(), torch.zeros_like(adv))
    return adv, returns


def rloo_advantages(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """score_i - mean of the other scores in its group (0 for a group of one)."""
    scores = scores.float()
    mean, _, count = group_stats(scores, groups)
    baseline = (mean * count - scores) / (count - 1).clamp(min=1)
    return broadcast(torch.where(count > 1, scores - baseline, torch.zeros_like(scores)), mask)


def reinforce_plus_plus(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++: discounted token returns (KL penalty inside the rewards), whitened over the batch."""
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)


def reinforce_plus_plus_baseline(scores: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ with a group-mean baseline, then whitened over the batch."""
    centred, _ = normalize_scores(scores.float(), NormSpec("group", None), groups)
    return masked_whiten(broadcast(centred, mask), mask)


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """0-based turn of each response token (a turn = a contiguous run of mask=1); -1 elsewhere."""
    m = mask.long()
    starts = m - torch.nn.functional.pad(m, (1, 0))[:, :-1]
    turn = torch.cumsum(starts.clamp(min=0), dim=1) - 1
    return torch.where(mask.bool(), turn, torch.full_like(turn, -1))


def turn_level_returns(turn_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """R_k = r_k + gamma * R_{k+1} over a row's turns, on every token of turn k.

    ``turn_rewards`` is [B, K] (K >= the most turns in a row; extra entries are ignored)."""
    turns = turn_index(mask)
    n_turns = turns.max(dim=1).values + 1
    k = turn_rewards.shape[1]
    active = torch.arange(k, device=mask.device)[None, :] < n_turns[:, None]
    r = torch.where(active, turn_rewards.float(), torch.zeros_like(turn_rewards, dtype=torch.float32))
    returns = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=torch.float32, device=r.device)
    for i in range(k - 1, -1, -1):
        running = r[:, i] + gamma * running
        returns[:, i] = running
    gathered = returns.gather(1, turns.clamp(min=0))
    return torch.where(mask.bool(), gathered, torch.zeros_like(gathered))


def step_returns(step_rewards: torch.Tensor, traj_ids: torch.Tensor, step_idx: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return from each step of its trajectory, for step-wise rows (one row per turn)."""
    order = sorted(range(len(step_rewards)), key=lambda i: (int(traj_ids[i]), -int(step_idx[i])))
    out = torch.zeros(len(step_rewards), dtype=torch.float32)
    running, current = 0.0, None
    for i in order:
        if traj_ids[i] != current:
            running, current = 0.0, traj_ids[i]
        running = float(step_rewards[i]) + gamma * running
        out[i] = running
    return out


def gigpo_advantages(
    episode_advantage: torch.Tensor,
    step_return: torch.Tensor,
    state_groups: torch.Tensor,
    episode_weight: float = 1.0,
    step_weight: float = 1.0,
    step_norm: NormSpec | None = None,
) -> torch.Tensor:
    """GiGPO per-row advantage: the episode-level advantage (the episode score already normalised in
    its GRPO group) plus the step-level one (the discounted step return normalised among rows that
    share an anchor state within the group, ``state_groups``; mean and std by default), weighted."""
    step, _ = normalize_scores(step_return.float(), step_norm or NormSpec("group", "group"), state_groups)
    return episode_weight * episode_advantage.float() + step_weight * step


@dataclass
class AdvantageInputs:
    """What the estimators read; each uses the fields it needs (see ADVANTAGE_ESTIMATORS)."""

    response_mask: torch.Tensor  # [B, T]
    token_rewards: torch.Tensor | None = None  # [B, T] (outcome on last token, KL penalty folded in)
    scores: torch.Tensor | None = None  # [B] outcome/episode score per row, after reward normalisation
    groups: torch.Tensor | None = None  # [B] GRPO group id per row (traj_group_id)
    values: torch.Tensor | None = None  # [B, T] critic values
    turn_rewards: torch.Tensor | None = None  # [B, K] per-turn rewards of trajectory rows
    step_return: torch.Tensor | None = None  # [B] discounted step return of step-wise rows
    state_groups: torch.Tensor | None = None  # [B] anchor-state group id of step-wise rows


@dataclass
class AdvantageParams:
    gamma: float = 1.0
    lambd: float = 0.95
    episode_weight: float = 1.0
    step_weight: float = 1.0
    step_norm: NormSpec | None = None  # GiGPO: how step returns normalise within a state group (default mean_std)


def _need(x: torch.Tensor | None, name: str, estimator: str) -> torch.Tensor:
    if x is None:
        raise ValueError(f"adv_estimator {estimator!r} needs {name}")
    return x


def _gae(i: AdvantageInputs, p: AdvantageParams):
    return gae(_need(i.token_rewards, "token_rewards", "gae"), _need(i.values, "values", "gae"), i.response_mask, p.gamma, p.lambd)


def _reinforce(i: AdvantageInputs, p: AdvantageParams):
    r = discounted_returns(_need(i.token_rewards, "token_rewards", "reinforce"), i.response_mask, p.gamma)
    return r, r


def _grpo(i: AdvantageInputs, p: AdvantageParams):
    # The group baseline is the reward normalisation (reward_normalization: traj_group_id, mean_std):
    # normalising here again would override the configured grouping and rescale asym_clip.
    a = broadcast(_need(i.scores, "scores", "grpo"), i.response_mask)
    return a, a


def _rloo(i: AdvantageInputs, p: AdvantageParams):
    a = rloo_advantages(_need(i.scores, "scores", "rloo"), _need(i.groups, "groups", "rloo"), i.response_mask)
    return a, a


def _rpp(i: AdvantageInputs, p: AdvantageParams):
    a = reinforce_plus_plus(_need(i.token_rewards, "token_rewards", "reinforce_plus_plus"), i.response_mask, p.gamma)
    return a, discounted_returns(i.token_rewards, i.response_mask, p.gamma)


def _rpp_baseline(i: AdvantageInputs, p: AdvantageParams):
    name = "reinforce_plus_plus_baseline"
    a = reinforce_plus_plus_baseline(_need(i.scores, "scores", name), _need(i.groups, "groups", name), i.response_mask)
    return a, a


def _gigpo(i: AdvantageInputs, p: AdvantageParams):
    a = gigpo_advantages(
        _need(i.scores, "scores", "gigpo"), _need(i.step_return, "step_return", "gigpo"),
        _need(i.state_groups, "state_groups", "gigpo"), p.episode_weight, p.step_weight, p.step_norm,
    )
    a = broadcast(a, i.response_mask)
    return a, a


def _step_reinforce(i: AdvantageInputs, p: AdvantageParams):
    a = broadcast(_need(i.step_return, "step_return", "step_reinforce"), i.response_mask)
    return a, a


def _agentic_reinforce(i: AdvantageInputs, p: AdvantageParams):
    r = turn_level_returns(_need(i.turn_rewards, "turn_rewards", "agentic_reinforce"), i.response_mask, p.gamma)
    return r, r


# adv_estimator name -> estimator(inputs, params) -> (advantages [B, T], returns [B, T])
ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageInputs, AdvantageParams], tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": _gae,
    "reinforce": _reinforce,
    "grpo": _grpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _rpp,
    "reinforce_plus_plus_baseline": _rpp_baseline,
    "gigpo": _gigpo,
    "step_reinforce": _step_reinforce,
    "agentic_reinforce": _agentic_reinforce,  # turn-level returns of trajectory rows
}


def compute_advantages(estimator: str, inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {estimator!r}; use one of {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[estimator](inputs, params)


def postprocess_advantages(
    advantages: torch.Tensor, mask: torch.Tensor, whiten: bool = False, clip: float | None = None
) -> torch.Tensor:
    """``whiten_advantages`` then ``advantage_clip``; masked positions stay 0."""
    out = masked_whiten(advantages, mask) if whiten else torch.where(mask.bool(), advantages, torch.zeros_like(advantages))
    if clip is not None:
        out = out.clamp(-clip, clip)
    return out

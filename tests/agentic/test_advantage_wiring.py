"""The config -> algorithms wiring of the advantage phase (roll/agentic/advantage.py) on batches as the
rollout builds them: one normalisation as configured, scopes kept apart, episode statistics of step-wise
batches over trajectories."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from roll.agentic.advantage import compute_batch_advantages
from roll.algorithms.reward_norm import NormSpec, normalize_scores
from roll.configs.schema import PipelineConfig, RewardNormalizationConfig
from roll.distributed.batch import Batch


def trajectory_batch(scores, groups, tags=None) -> Batch:
    n = len(scores)
    mask = torch.zeros(n, 6, dtype=torch.long)
    mask[:, 2:5] = 1
    return Batch(
        {"input_ids": torch.ones(n, 6, dtype=torch.long), "attention_mask": torch.ones(n, 6, dtype=torch.long),
         "response_mask": mask, "scores": torch.tensor(scores, dtype=torch.float32)},
        {"traj_group_id": [f"g{g}" for g in groups], "traj_id": [f"t{i}" for i in range(n)],
         "tags": tags or ["A"] * n},
    )


def config(**kw) -> PipelineConfig:
    norm = kw.pop("norm", {})
    return dataclasses.replace(PipelineConfig(), adv_estimator="grpo", reward_normalization=RewardNormalizationConfig(**norm), **kw)


def per_row(batch: Batch) -> torch.Tensor:
    return batch["advantages"][:, 3]


def test_grpo_uses_the_configured_grouping_once():
    """grouping: batch must normalise over the whole batch; the GRPO estimator used to normalise again inside
    each traj group, overriding it."""
    scores = [1.0, 0.0, 3.0, 3.0, 5.0, 1.0]
    batch = trajectory_batch(scores, [0, 0, 1, 1, 2, 2])
    out, _, _ = compute_batch_advantages(batch, config(norm={"grouping": "batch", "method": "mean_std"}), 0.0, None)
    expected, _ = normalize_scores(torch.tensor(scores), NormSpec("batch", "batch"))
    torch.testing.assert_close(per_row(out), expected)


def test_asym_clip_is_not_rescaled():
    scores = [-10.0] + [0.0] * 7
    batch = trajectory_batch(scores, [0] * 8)
    out, _, _ = compute_batch_advantages(batch, config(norm={"grouping": "traj_group_id", "method": "asym_clip"}), 0.0, None)
    adv = per_row(out)
    # mean -1.25, unbiased std sqrt((8.75^2 + 7 * 1.25^2) / 7) = sqrt(12.5): z = -2.47 clipped to -1, and 0.35355
    assert adv[0].item() == -1.0
    assert adv[1].item() == pytest.approx(1.25 / 12.5**0.5, abs=1e-5)


def test_top_level_mean_and_std_scopes_stay_apart():
    """norm_mean_type: batch with norm_std_type: group is the batch mean with each group's std (they used to
    collapse into one scope)."""
    scores = [2.0, 4.0, 6.0, 10.0]
    batch = trajectory_batch(scores, [0, 0, 1, 1])
    out, _, _ = compute_batch_advantages(batch, config(norm_mean_type="batch", norm_std_type="group"), 0.0, None)
    # batch mean 5.5; group stds sqrt(2) and sqrt(8)
    expected = [(2 - 5.5) / 2**0.5, (4 - 5.5) / 2**0.5, (6 - 5.5) / 8**0.5, (10 - 5.5) / 8**0.5]
    assert per_row(out).tolist() == [pytest.approx(e, abs=1e-4) for e in expected]


def test_roll_reward_normalization_scopes():
    """reward_normalization.norm_mean_type / norm_std_type (ROLL's current fields) win over the method."""
    scores = [2.0, 4.0, 6.0, 10.0]
    batch = trajectory_batch(scores, [0, 0, 1, 1])
    cfg = config(norm={"grouping": "traj_group_id", "method": "mean_std", "norm_std_type": "batch"})
    out, _, _ = compute_batch_advantages(batch, cfg, 0.0, None)
    std = torch.tensor(scores).std().item()
    expected = [(2 - 3) / std, (4 - 3) / std, (6 - 8) / std, (10 - 8) / std]
    assert per_row(out).tolist() == [pytest.approx(e, abs=1e-4) for e in expected]


def step_batch() -> Batch:
    """Two episodes of one GRPO group: t0 (score 1) took three turns, t1 (score 0) one."""
    rows = 4
    mask = torch.zeros(rows, 4, dtype=torch.long)
    mask[:, 2:] = 1
    return Batch(
        {"input_ids": torch.ones(rows, 4, dtype=torch.long), "attention_mask": torch.ones(rows, 4, dtype=torch.long),
         "response_mask": mask, "scores": torch.tensor([1.0, 1.0, 1.0, 0.0]),
         "step_rewards": torch.tensor([0.0, 0.0, 1.0, 0.0]), "step_idx": torch.tensor([0, 1, 2, 0])},
        {"traj_group_id": ["g"] * rows, "traj_id": ["t0", "t0", "t0", "t1"], "tags": ["A"] * rows,
         "state_hash": ["s0", "s1", "s2", "s0"]},
    )


def test_step_wise_episode_statistics_are_over_trajectories():
    """Over the two episodes the scores 1 and 0 normalise to +-0.70711; over rows (three of them from the long
    episode) they would not."""
    cfg = config(norm={"grouping": "traj_group_id", "method": "mean_std"})
    out, metrics, _ = compute_batch_advantages(step_batch(), cfg, 0.0, None)
    assert per_row(out).tolist() == [pytest.approx(0.70711, abs=1e-4)] * 3 + [pytest.approx(-0.70711, abs=1e-4)]
    assert metrics["reward/score_mean"] == 0.5  # the mean episode score, not the mean over rows (0.75)


def test_singleton_groups_are_reported():
    batch = trajectory_batch([1.0, 2.0, 3.0], [0, 1, 2])
    _, metrics, _ = compute_batch_advantages(batch, config(norm={"grouping": "traj_group_id", "method": "mean_std"}), 0.0, None)
    assert metrics["reward/singleton_group_share"] == 1.0

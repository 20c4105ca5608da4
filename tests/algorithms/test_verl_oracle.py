"""roll.algorithms against an independent implementation: verl's ``core_algos`` (the PyPI package
``verl``, installed by the dev set-up), on random batches whose response masks have multi-turn
holes (prompt, model turn, observation, model turn, padding).

Where the two differ by design the test says so: verl whitens inside its GAE (roll whitens with
``whiten_advantages``), verl applies dual clip always (roll when ``dual_clip_loss``), and a group of
one gets advantage 0 in roll (ROLL's rule) but its raw score in verl, so the groups here have at
least two members (the singleton rule has its own hand-checked test).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos as verl

from roll.algorithms.advantages import (
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    discounted_returns,
    gae,
    place_on_last_token,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo_advantages,
)
from roll.algorithms.kl import kl_penalty
from roll.algorithms.losses import LOSS_AGG_MODES, GlobalCounts, aggregate, ppo_policy_loss, value_loss
from roll.algorithms.masked import masked_whiten
from roll.algorithms.reward_norm import method_scopes, normalize_scores

SEEDS = range(12)


def multi_turn_batch(seed: int, rows: int = 8, length: int = 24) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, length)
    for r in range(rows):  # prompt, then 1-3 model turns separated by observations, then padding
        pos = int(torch.randint(1, 4, (1,), generator=g))
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            turn = int(torch.randint(1, 5, (1,), generator=g))
            mask[r, pos:pos + turn] = 1
            pos += turn + int(torch.randint(1, 4, (1,), generator=g))
            if pos >= length - 1:
                break
    groups = torch.arange(rows) // 2  # groups of two
    groups[-3:] = groups[-3]  # and one of three
    return {
        "mask": mask,
        "scores": torch.randn(rows, generator=g),
        "values": torch.randn(rows, length, generator=g),
        "rewards": torch.randn(rows, length, generator=g) * 0.1,
        "logp": -torch.rand(rows, length, generator=g) * 3,
        "old": -torch.rand(rows, length, generator=g) * 3,
        "adv": torch.randn(rows, length, generator=g),
        "groups": groups,
    }


def close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_verl(seed):
    b = multi_turn_batch(seed)
    token_rewards = b["rewards"] * b["mask"] + place_on_last_token(b["scores"], b["mask"])
    ours, our_returns = gae(token_rewards, b["values"], b["mask"], 0.99, 0.95)
    theirs, their_returns = verl.compute_gae_advantage_return(token_rewards, b["values"], b["mask"], 0.99, 0.95)
    close(masked_whiten(ours, b["mask"]), theirs, b["mask"])  # verl whitens inside its GAE
    close(our_returns, their_returns, b["mask"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("method, by_std", [("mean_std", True), ("mean", False)])
def test_grpo_matches_verl(seed, method, by_std):
    b = multi_turn_batch(seed)
    normed, _ = normalize_scores(b["scores"], method_scopes(method, "traj_group_id"), b["groups"])
    ours, _ = compute_advantages("grpo", AdvantageInputs(b["mask"], scores=normed, groups=b["groups"]), AdvantageParams())
    theirs, _ = verl.compute_grpo_outcome_advantage(place_on_last_token(b["scores"], b["mask"]), b["mask"],
                                                    b["groups"].numpy(), norm_adv_by_std_in_grpo=by_std)
    close(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_verl(seed):
    b = multi_turn_batch(seed)
    ours = rloo_advantages(b["scores"], b["groups"], b["mask"])
    theirs, _ = verl.compute_rloo_outcome_advantage(place_on_last_token(b["scores"], b["mask"]), b["mask"], b["groups"].numpy())
    close(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_matches_verl(seed):
    b = multi_turn_batch(seed)
    token_rewards = b["rewards"] * b["mask"] + place_on_last_token(b["scores"], b["mask"])
    theirs, their_returns = verl.compute_reinforce_plus_plus_outcome_advantage(
        token_rewards, b["mask"], config=SimpleNamespace(gamma=0.9))
    close(reinforce_plus_plus(token_rewards, b["mask"], 0.9), theirs, b["mask"])
    close(discounted_returns(token_rewards, b["mask"], 0.9), their_returns, b["mask"])
    baseline, _ = verl.compute_reinforce_plus_plus_baseline_outcome_advantage(
        place_on_last_token(b["scores"], b["mask"]), b["mask"], b["groups"].numpy())
    close(reinforce_plus_plus_baseline(b["scores"], b["groups"], b["mask"]), baseline, b["mask"])


@pytest.mark.parametrize("seed", SEEDS)
def test_kl_estimators_match_verl(seed):
    b = multi_turn_batch(seed)
    for name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"):
        close(kl_penalty(b["logp"], b["old"], name), verl.kl_penalty_forward(b["logp"], b["old"], name))


def _global(mask: torch.Tensor, length: float) -> dict:
    counts = GlobalCounts.of(mask)
    return {"dp_size": 1, "batch_num_tokens": counts.tokens, "global_batch_size": counts.seqs, "loss_scale_factor": length}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_aggregation_matches_verl(seed, mode):
    b = multi_turn_batch(seed)
    norm = 40.0  # the run's constant length
    ours = aggregate(b["adv"], b["mask"], mode, GlobalCounts.of(b["mask"]), norm)
    close(ours, verl.agg_loss(b["adv"], b["mask"], mode, **_global(b["mask"], norm)))


class _ActorConfig(SimpleNamespace):
    def get(self, key, default=None):
        return getattr(self, key, default)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_clipped_policy_loss_matches_verl(seed, mode):
    b = multi_turn_batch(seed)
    cfg = _ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                       global_batch_info=_global(b["mask"], 40.0))
    theirs, their_metrics = verl.compute_policy_loss_vanilla(b["old"], b["logp"], b["adv"], b["mask"], mode, cfg)
    ours, our_metrics = ppo_policy_loss(b["logp"], b["old"], b["adv"], b["mask"], clip_low=0.2, clip_high=0.28,
                                        dual_clip=3.0, agg_mode=mode, counts=GlobalCounts.of(b["mask"]), norm_length=40.0)
    close(ours, theirs)
    assert our_metrics["actor/pg_clipfrac"] == pytest.approx(their_metrics["actor/pg_clipfrac"], abs=1e-6)
    assert our_metrics["actor/ppo_kl"] == pytest.approx(their_metrics["actor/ppo_kl"], abs=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_clipped_value_loss_matches_verl(seed, mode):
    b = multi_turn_batch(seed)
    returns = b["values"] + torch.randn(b["values"].shape, generator=torch.Generator().manual_seed(seed)) * 0.3
    old = b["values"] + 0.1 * torch.sign(torch.randn(b["values"].shape, generator=torch.Generator().manual_seed(seed + 1)))
    theirs, their_clipfrac = verl.compute_value_loss(b["values"], returns, old, b["mask"], 0.05, mode,
                                                     **_global(b["mask"], 40.0))
    ours, metrics = value_loss(b["values"], old, returns, b["mask"], clip=0.05, agg_mode=mode,
                               counts=GlobalCounts.of(b["mask"]), norm_length=40.0)
    close(ours, theirs)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(float(their_clipfrac), abs=1e-6)


def test_the_batches_have_multi_turn_holes():
    """The inputs really exercise masked gaps: some row has a model turn after an observation."""
    m = multi_turn_batch(0)["mask"]
    starts = (m[:, 1:] - m[:, :-1] > 0).sum(1)
    assert int(starts.max()) >= 2 and bool(np.any(m.sum(1).numpy() > 0))

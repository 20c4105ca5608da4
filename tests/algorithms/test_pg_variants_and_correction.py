"""pg_variant losses and the train/infer correction against hand-computed values, and their wiring
into the actor's loss function."""

import math

import pytest
import torch
from pytest import approx

from roll.algorithms.losses import ActorLossConfig, GlobalCounts, actor_loss, variant_token_loss
from roll.algorithms.train_infer import Correction, FilterRule, gap, train_infer_correction
from roll.distributed.batch import Batch
from roll.strategies.base import ForwardOutput
from roll.workers.actor_train import make_actor_loss_fn

T = torch.tensor
LOGP, OLD, ADV = [[-1.0, -2.0]], [[-1.5, -1.0]], [[1.0, -2.0]]  # ratios e^0.5 = 1.6487 and e^-1 = 0.3679


def _loss(variant, positive=None, **kw):
    logp = T(LOGP, requires_grad=True)
    cfg = ActorLossConfig(agg_mode="token-mean", pg_variant=variant, **kw)
    loss, metrics = actor_loss(logp, T(OLD), T(ADV), torch.ones(1, 2), cfg, positive_rows=positive)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), metrics


@pytest.mark.parametrize("variant, value, grad", [
    # -A log p: (1 x 1 + (-2) x (-2) x -1) / 2 = (1 - 4) / 2; grad -A / 2
    ("vanilla", -1.5, [-0.5, 1.0]),
    # weights clip(r, 0, 1) = (1, e^-1): (1 - 4 e^-1) / 2; grad -w A / 2 (no gradient through w)
    ("tis", (1 - 4 * math.exp(-1)) / 2, [-0.5, math.exp(-1)]),
    # weights clip(r, 0.9, 1.1) = (1.1, 0.9): (1.1 - 3.6) / 2
    ("cispo", -1.25, [-0.55, 0.9]),
    # -A log p + 0.05 (log p - log p_old)^2: (1 + 0.0125 - 4 + 0.05) / 2; grad (-A + 0.1 (log p - old)) / 2
    ("kimi15", (1.0125 - 3.95) / 2, [(-1 + 0.05) / 2, (2 - 0.1) / 2]),
])
def test_pg_variants_by_hand(variant, value, grad):
    loss, g, _ = _loss(variant)
    assert loss == approx(value, abs=1e-6)
    assert g == approx(grad, abs=1e-6)


def test_topr_splits_by_episode_score_not_by_advantage_sign():
    """ROLL's PG worker: rows of episodes with score > 0 get plain REINFORCE, the others the truncated weight."""
    assert _loss("topr", positive=T([True]))[0] == approx(-1.5, abs=1e-6)  # = vanilla
    assert _loss("topr", positive=T([False]))[0] == approx((1 - 4 * math.exp(-1)) / 2, abs=1e-6)  # = tis
    weighted = _loss("topr", positive=T([False]), topr_negative_weight=0.5)[0]
    assert weighted == approx((1 - 4 * math.exp(-1)) / 4, abs=1e-6)
    with pytest.raises(ValueError, match="positive_rows"):
        variant_token_loss("topr", T(LOGP), T(OLD), T(ADV), torch.ones(1, 2))


def test_ppo_variant_is_the_ppo_loss():
    assert _loss("ppo")[0] == approx(_loss(None)[0], abs=1e-7)
    with pytest.raises(ValueError, match="unknown pg_variant"):
        variant_token_loss("reinforce", T(LOGP), T(OLD), T(ADV), torch.ones(1, 2))


def test_a_token_weight_multiplies_each_tokens_policy_loss():
    """The IS weight scales token losses before aggregation: weight (1, 0) leaves token 0 only."""
    for variant in (None, "vanilla", "tis"):
        logp = T(LOGP, requires_grad=True)
        cfg = ActorLossConfig(agg_mode="token-mean", pg_variant=variant)
        full, _ = actor_loss(logp, T(OLD), T(ADV), torch.ones(1, 2), cfg, weight=T([[1.0, 0.0]]))
        first, _ = actor_loss(logp, T(OLD), T([[1.0, 0.0]]), torch.ones(1, 2), cfg)
        assert full.item() == approx(first.item(), abs=1e-7), variant


OLD_LP, INFER_LP, MASK = T([[-1.0, -2.0, -0.5]]), T([[-1.1, -1.5, -0.3]]), T([[1.0, 1.0, 0.0]])


def test_gap_at_each_granularity_by_hand():
    # masked log-ratios 0.1 and -0.5 (the third token is off the mask)
    assert gap(OLD_LP, INFER_LP, MASK, "token")[0][0, :2].tolist() == approx([math.exp(0.1), math.exp(-0.5)])
    assert gap(OLD_LP, INFER_LP, MASK, "geometric")[0][0, 0].item() == approx(math.exp(-0.2))
    assert gap(OLD_LP, INFER_LP, MASK, "segment")[0][0, 1].item() == approx(math.exp(-0.2))  # one turn
    assert gap(OLD_LP, INFER_LP, MASK, "sequence")[0][0, 0].item() == approx(math.exp(-0.4))
    diffs = [math.exp(-1.0) - math.exp(-1.1), math.exp(-2.0) - math.exp(-1.5)]
    assert gap(OLD_LP, INFER_LP, MASK, "token")[1][0, :2].tolist() == approx(diffs)
    assert gap(OLD_LP, INFER_LP, MASK, "sequence")[1][0, 0].item() == approx(sum(diffs))


def test_correction_weight_filters_and_metrics_by_hand():
    cfg = Correction(weight_enabled=True, weight_type="token", upper_bound=1.0,
                     filters=(FilterRule("token", ratio_low=0.8, ratio_high=1.2),
                              FilterRule("token", ratio_enabled=False, diff_enabled=True, diff_low=-0.05, diff_high=0.05)))
    weight, keep, m = train_infer_correction(cfg, MASK, OLD_LP, INFER_LP)
    assert weight[0, :2].tolist() == approx([1.0, math.exp(-0.5)])  # e^0.1 clipped to the bound 1.0
    assert keep[0, :2].tolist() == [1.0, 0.0]  # ratio e^-0.5 = 0.61 < 0.8, diff -0.088 < -0.05
    assert m["actor/is_weight_clipfrac"] == approx(0.5)
    assert m["actor/is_weight_max"] == approx(1.0)  # over the mask (the third token's ratio e^-0.2 is off it)
    assert m["actor/train_infer_token_ratio_pass"] == approx(0.5)
    assert m["actor/train_infer_token_diff_pass"] == approx(0.5)
    assert m["actor/train_infer_kept"] == approx(0.5)
    assert m["actor/train_infer_ratio_token_mean"] == approx((math.exp(0.1) + math.exp(-0.5)) / 2)
    assert m["actor/train_infer_logprob_abs_diff"] == approx(0.3)
    none, keep_all, m2 = train_infer_correction(Correction(), MASK, OLD_LP, INFER_LP)
    assert none is None and keep_all.tolist() == [[1.0, 1.0, 1.0]] and "actor/train_infer_ratio_geometric_mean" in m2


def test_the_actor_loss_applies_the_correction_on_its_first_forward():
    """Without old log-probs in the batch, the old ones are this forward's and the gap is to the sampler's:
    a sampler log-prob log 2 below the trainer's gives weight 2 (token level, no bound) on that token; a
    filter with bounds [0.5, 1.5] drops it."""
    logp = T([[-1.0, -1.0]])
    micro = Batch({"response_mask": T([[1, 1]]), "advantages": T([[1.0, 1.0]]),
                   "infer_logprobs": logp - T([[0.0, math.log(2.0)]])})
    out = ForwardOutput(logprobs=logp.clone().requires_grad_(True))
    weighted = ActorLossConfig(agg_mode="token-mean", correction=Correction(weight_enabled=True, upper_bound=None))
    loss, metrics = make_actor_loss_fn(weighted)(micro, out, None)
    assert loss.item() == approx(-(1 + 2) / 2)  # PPO at ratio 1: -A per token, times the weights (1, 2)
    assert metrics["actor/train_infer_ratio_token_mean"] == approx(1.5)
    filtered = ActorLossConfig(agg_mode="token-mean", correction=Correction(filters=(FilterRule(ratio_low=0.5, ratio_high=1.5),)))
    counts = GlobalCounts.of(micro["response_mask"].float())  # as the strategy gives them: of the batch's own mask
    loss, metrics = make_actor_loss_fn(filtered)(micro, ForwardOutput(logprobs=logp.clone().requires_grad_(True)), counts)
    assert loss.item() == approx(-1 / 2)  # token 1 left the mask; the count stays the batch's (ROLL's rule)
    assert metrics["actor/train_infer_kept"] == approx(0.5)


def test_step_stats_take_maxima_of_max_metrics_and_sum_the_rest():
    from roll.strategies.base import StepStats

    stats = StepStats()
    stats.add_micro({"actor/is_weight_max": 1.1, "actor/pg_loss": 0.25})
    stats.add_micro({"actor/is_weight_max": 1.3, "actor/pg_loss": 0.5})
    stats.add_step(1.0, 1e-3)
    out = stats.summary("actor", reduce=lambda v: [x * 2 for x in v], reduce_max=lambda v: [max(x, 2.0) for x in v])
    assert out["actor/is_weight_max"] == 2.0 and out["actor/pg_loss"] == 1.5
    assert StepStats(maxima={"a_max": 3.0}).summary("actor")["a_max"] == 3.0

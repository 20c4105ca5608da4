"""Every estimator, normaliser, KL estimator and loss mode against values worked out by hand
(the arithmetic is in the comments)."""

import math

import pytest
import torch

from roll.algorithms.advantages import (
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    discounted_returns,
    gae,
    gigpo_advantages,
    place_on_last_token,
    postprocess_advantages,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo_advantages,
    step_returns,
    token_level_rewards,
    turn_index,
    turn_level_returns,
)
from roll.algorithms.kl import AdaptiveKLController, FixedKLController, kl_controller, kl_penalty
from roll.algorithms.losses import (
    ActorLossConfig,
    GlobalCounts,
    actor_loss,
    aggregate,
    entropy_from_logits,
    ppo_policy_loss,
    segment_mean,
    topr_policy_loss,
    value_loss,
)
from roll.algorithms.masked import group_ids, masked_whiten
from roll.algorithms.reward_norm import (
    NormSpec,
    RunningMeanStd,
    method_scopes,
    normalize_scores,
    singleton_share,
)

T = torch.tensor
approx = pytest.approx
# A two-turn row (tokens 1-2 and 4 are the model's; 0, 3 prompt/observation; 5 padding) and a one-turn row.
MULTI = T([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0]])


def test_outcome_reward_on_last_response_token():
    assert place_on_last_token(T([1.0, 2.0]), MULTI).tolist() == [[0, 0, 0, 0, 1, 0], [0, 0, 0, 2, 0, 0]]
    # KL penalty 0.1 x kl on every response token; the outcome stays on the last one.
    r = token_level_rewards(T([1.0]), T([[1, 1, 0]]), kl=T([[0.5, 1.0, 9.0]]), kl_coef=0.1)
    assert r.tolist() == [[approx(-0.05), approx(1 - 0.1), 0.0]]


def test_discounted_returns_skip_observation_tokens():
    r = place_on_last_token(T([1.0, 2.0]), MULTI)
    # row 0 response tokens 1,2,4: G4 = 1, G2 = 0.5, G1 = 0.25; row 1: 2, 1, 0.5, 0.25 backwards
    assert discounted_returns(r, MULTI, 0.5).tolist() == [[0, 0.25, 0.5, 0, 1, 0], [0.25, 0.5, 1, 2, 0, 0]]


def test_gae_by_hand():
    # rewards [0,0,1], values [.5,.6,.7], gamma .9, lambda .8:
    # d2 = 1 - .7 = .3, A2 = .3; d1 = .9*.7 - .6 = .03, A1 = .03 + .72*.3 = .246
    # d0 = .9*.6 - .5 = .04, A0 = .04 + .72*.246 = .21712; returns = A + V
    adv, ret = gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1, 1, 1]]), 0.9, 0.8)
    assert adv[0].tolist() == [approx(0.21712), approx(0.246), approx(0.3)]
    assert ret[0].tolist() == [approx(0.71712), approx(0.846), approx(1.0)]
    # The same row with an observation token inserted (its reward and value must not matter).
    adv2, _ = gae(T([[0.0, 5.0, 0.0, 1.0]]), T([[0.5, 99.0, 0.6, 0.7]]), T([[1, 0, 1, 1]]), 0.9, 0.8)
    assert adv2[0].tolist() == [approx(0.21712), 0.0, approx(0.246), approx(0.3)]


def test_grpo_by_hand():
    # GRPO = the configured reward normalisation (traj_group_id, mean_std) broadcast by the estimator:
    # group 0 scores 1,0,0,1: mean .5, unbiased std sqrt(4 * .25 / 3) = .57735 -> +-.86603; group 1 alone -> 0
    scores, groups = T([1.0, 0.0, 0.0, 1.0, 5.0]), T([0, 0, 0, 0, 1])
    normed, _ = normalize_scores(scores, method_scopes("mean_std", "traj_group_id"), groups)
    adv, _ = compute_advantages("grpo", AdvantageInputs(torch.ones(5, 2), scores=normed, groups=groups), AdvantageParams())
    assert adv[:, 0].tolist() == [approx(0.86603, abs=1e-4), approx(-0.86603, abs=1e-4), approx(-0.86603, abs=1e-4),
                                  approx(0.86603, abs=1e-4), 0.0]
    # the estimator adds no second normalisation: batch-scope scores reach the advantages unchanged
    batch_normed, _ = normalize_scores(scores, method_scopes("mean_std", "batch"), groups)
    adv, _ = compute_advantages("grpo", AdvantageInputs(torch.ones(5, 1), scores=batch_normed, groups=groups), AdvantageParams())
    torch.testing.assert_close(adv[:, 0], batch_normed)
    # Dr.GRPO (method mean): no division by the std
    dr, _ = normalize_scores(scores, method_scopes("mean", "traj_group_id"), groups)
    assert dr.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0]


def test_rloo_by_hand():
    # scores 1,2,3: baselines (2+3)/2, (1+3)/2, (1+2)/2 -> -1.5, 0, 1.5; a lone row -> 0
    adv = rloo_advantages(T([1.0, 2.0, 3.0, 7.0]), T([0, 0, 0, 1]), torch.ones(4, 1))
    assert adv[:, 0].tolist() == [-1.5, 0.0, 1.5, 0.0]


def test_reinforce_plus_plus_by_hand():
    # returns [[1,1],[3,3]]: mean 2, unbiased var 4/3 -> whitened +-(1 / 1.1547) = +-.86603
    adv = reinforce_plus_plus(T([[0.0, 1.0], [0.0, 3.0]]), torch.ones(2, 2), gamma=1.0)
    assert adv.flatten().tolist() == [approx(-0.86603, abs=1e-4)] * 2 + [approx(0.86603, abs=1e-4)] * 2


def test_reinforce_plus_plus_baseline_by_hand():
    # scores 1,3 in one group -> -1, +1 on the valid tokens [-1, -1, 1]: mean -1/3, var 4/3, std 1.1547
    adv = reinforce_plus_plus_baseline(T([1.0, 3.0]), T([0, 0]), T([[1, 1], [1, 0]]))
    assert adv.tolist() == [[approx(-0.57735, abs=1e-4)] * 2, [approx(1.1547, abs=1e-4), 0.0]]


def test_turn_level_returns_by_hand():
    assert turn_index(MULTI).tolist() == [[-1, 0, 0, -1, 1, -1], [0, 0, 0, 0, -1, -1]]
    # row 0: turn rewards 1, 2, gamma .5: R1 = 2, R0 = 1 + .5 * 2 = 2; row 1 has one turn: 3
    out = turn_level_returns(T([[1.0, 2.0], [3.0, 100.0]]), MULTI, 0.5)
    assert out.tolist() == [[0, 2, 2, 0, 2, 0], [3, 3, 3, 3, 0, 0]]


def test_step_returns_and_step_reinforce_by_hand():
    # trajectory 0 steps 0,1,2 rewards 1,0,2, gamma .5: G2 = 2, G1 = 1, G0 = 1.5; trajectory 1: 5
    g = step_returns(T([1.0, 0.0, 2.0, 5.0]), T([0, 0, 0, 1]), T([0, 1, 2, 0]), 0.5)
    assert g.tolist() == [1.5, 1.0, 2.0, 5.0]
    adv, _ = compute_advantages("step_reinforce", AdvantageInputs(torch.ones(4, 1), step_return=g), AdvantageParams())
    assert adv[:, 0].tolist() == [1.5, 1.0, 2.0, 5.0]


def test_gigpo_by_hand():
    # episode advantages (already normalised in their group) +-.86603; step returns 2,1 share a state ->
    # +-.70711 (std .70711), the other two states are alone -> 0; weights 1 and .5
    episode = T([0.86603, -0.86603, 0.86603, -0.86603])
    adv = gigpo_advantages(episode, T([2.0, 1.0, 3.0, 3.0]), T([0, 0, 1, 2]), 1.0, 0.5)
    expected = [0.86603 + 0.35355, -0.86603 - 0.35355, 0.86603, -0.86603]
    assert adv.tolist() == [approx(e, abs=1e-4) for e in expected]


def test_group_normalisation_methods_by_hand():
    scores, groups = T([0.0, 0.0, 0.0, 10.0]), T([0, 0, 0, 0])
    # mean 2.5, unbiased std sqrt((3 * 6.25 + 56.25) / 3) = 5
    assert by_method(scores, groups, "identity").tolist() == [0, 0, 0, 10]
    assert by_method(scores, groups, "mean").tolist() == [-2.5, -2.5, -2.5, 7.5]
    assert by_method(scores, groups, "mean_std").tolist() == [approx(-0.5), approx(-0.5), approx(-0.5), approx(1.5)]
    # asym_clip: one -10 among 16 zeros -> z = -3.88 clipped to -1, zeros 0.2425; one +10 -> 3.88 clipped to 3
    neg = by_method(T([-10.0] + [0.0] * 16), torch.zeros(17, dtype=torch.long), "asym_clip")
    assert neg[0] == -1.0 and neg[1] == approx(0.24254, abs=1e-4)
    pos = by_method(T([10.0] + [0.0] * 16), torch.zeros(17, dtype=torch.long), "asym_clip")
    assert pos[0] == 3.0


def test_reward_norm_scopes_by_hand():
    x = T([2.0, 4.0, 6.0])  # mean 4, unbiased std 2
    assert normalize_scores(x, NormSpec("batch", "batch"))[0].tolist() == [approx(-1), 0, approx(1)]
    assert normalize_scores(x, NormSpec("batch", None))[0].tolist() == [-2, 0, 2]
    assert normalize_scores(x, NormSpec(None, "batch"))[0].tolist() == [approx(1), approx(2), approx(3)]
    grouped = normalize_scores(x, NormSpec("group", "group"), T([0, 0, 1]))[0]
    assert grouped.tolist() == [approx(-0.70711, abs=1e-4), approx(0.70711, abs=1e-4), 0.0]
    # different scopes stay different: the batch mean 4, each group's std (group 0: 1.41421; group 1 alone: no signal)
    mixed = normalize_scores(x, NormSpec("batch", "group"), T([0, 0, 1]))[0]
    assert mixed.tolist() == [approx(-1.41421, abs=1e-4), 0.0, 0.0]
    running, stats = normalize_scores(x, NormSpec("running", "running"))  # population var 8/3
    assert running.tolist() == [approx(-1.22474, abs=1e-4), 0, approx(1.22474, abs=1e-4)] and stats.count == 3
    assert normalize_scores(x, NormSpec(clip=(-1.0, 3.0)))[0].tolist() == [2, 3, 3]
    assert normalize_scores(x, NormSpec())[0].tolist() == [2, 4, 6]
    # ROLL's method -> scopes mapping
    assert method_scopes("mean_std", "batch") == NormSpec("batch", "batch")
    assert method_scopes("mean", "traj_group_id") == NormSpec("group", None)
    assert method_scopes("asym_clip", "tags") == NormSpec("group", "group", (-1.0, 3.0))
    assert singleton_share(T([0, 0, 1, 2])) == approx(2 / 3)


def test_running_stats_combine_like_one_pass():
    s = RunningMeanStd().update(T([1.0, 2.0])).update(T([3.0, 4.0, 5.0]))
    assert (s.mean, s.var, s.count) == (approx(3.0), approx(2.0), 5)


def test_kl_estimators_by_hand():
    lp, ref = T([-1.0]), T([-1.5])
    assert kl_penalty(lp, ref, "kl").item() == approx(0.5) and kl_penalty(lp, ref, "k1").item() == approx(0.5)
    assert kl_penalty(T([-1.5]), T([-1.0]), "abs").item() == approx(0.5)
    assert kl_penalty(lp, ref, "mse").item() == approx(0.125) == kl_penalty(lp, ref, "k2").item()
    # k3: x = ref - logp = -.5: e^-.5 + .5 - 1 = .10653
    assert kl_penalty(lp, ref, "low_var_kl").item() == approx(0.10653, abs=1e-5) == kl_penalty(lp, ref, "k3").item()
    # full: p = (.25, .75) vs uniform: .25 ln .5 + .75 ln 1.5 = .13081
    full = kl_penalty(lp, ref, "full", logits=T([[0.0, math.log(3.0)]]), ref_logits=T([[0.0, 0.0]]))
    assert full.item() == approx(0.13081, abs=1e-5)


def test_kl_controllers_by_hand():
    assert isinstance(kl_controller(0.2, None, 100), FixedKLController)
    ctl = kl_controller(0.1, 1.0, 10)
    assert isinstance(ctl, AdaptiveKLController)
    # KL 2 vs target 1: error clipped to .2; x (1 + .2 * 5 / 10) = 1.1
    assert ctl.update(2.0, 5).value == approx(0.11)
    assert ctl.update(0.0, 10).value == approx(0.1 * 0.8)


def _logp_pair(ratios):
    old = torch.zeros(1, len(ratios))
    return torch.log(T([ratios])), old


def test_ppo_loss_by_hand():
    logp, old = _logp_pair([1.5, 0.5, 1.0])
    adv = T([[1.0, -1.0, 2.0]])
    # t0: max(-1.5, -1.2) = -1.2; t1: max(.5, .8) = .8; t2: -2 -> token mean -.8; clipped tokens: 2 of 3
    loss, m = ppo_policy_loss(logp, old, adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.2)
    assert loss.item() == approx(-0.8) and m["actor/pg_clipfrac"] == approx(2 / 3)
    # separate upper clip .28: t0 -> max(-1.5, -1.28)
    loss, _ = ppo_policy_loss(*_logp_pair([1.5]), T([[1.0]]), torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    assert loss.item() == approx(-1.28)
    # dual clip: A = -1, ratio 5 -> max(5, 1.2) = 5, capped at -A * 3 = 3
    loss, m = ppo_policy_loss(*_logp_pair([5.0]), T([[-1.0]]), torch.ones(1, 1), dual_clip=3.0)
    assert loss.item() == approx(3.0) and m["actor/dual_clipfrac"] == 1.0


def test_value_loss_by_hand():
    # V 1, old 0, R 2, clip .5: (1-2)^2 = 1 vs clipped V .5: (.5-2)^2 = 2.25 -> .5 * 2.25
    loss, m = value_loss(T([[1.0]]), T([[0.0]]), T([[2.0]]), torch.ones(1, 1), clip=0.5)
    assert loss.item() == approx(1.125) and m["critic/vf_clipfrac"] == 1.0 and m["critic/value_loss"] == approx(1.125)
    assert value_loss(T([[1.0]]), T([[0.0]]), T([[2.0]]), torch.ones(1, 1))[0].item() == approx(0.5)


def test_loss_aggregation_modes_by_hand():
    loss, mask = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]), T([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == approx((2 + 4) / 2)
    # the norm length is the run's constant (here 10), not the batch's padded width (3)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=10).item() == approx((6 + 4) / (2 * 10))
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(loss, mask, "seq-mean-token-sum-norm")
    # global counts from a bigger batch: 8 tokens, 4 rows
    assert aggregate(loss, mask, "token-mean", GlobalCounts(8, 4)).item() == approx(10 / 8)


def test_entropy_and_topr_by_hand():
    assert entropy_from_logits(T([[0.0, 0.0]])).item() == approx(math.log(2))
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach() - torch.log(T([[2.0, 0.5]]))  # ratios 2 and .5
    loss, _ = topr_policy_loss(logp, old, T([[1.0, -1.0]]), torch.ones(1, 2))
    # t0 positive: -1 * 1 * -1 = 1; t1 negative, weight min(.5, 1): -.5 * -1 * -2 = -1 -> mean 0
    assert loss.item() == approx(0.0)
    loss.backward()
    assert logp.grad.tolist() == [[approx(-0.5), approx(0.25)]]


def test_actor_loss_composes_its_terms():
    logp = torch.log(T([[0.5, 0.25]]))
    old = logp.clone()  # ratios 1
    mask = torch.ones(1, 2)
    adv = T([[1.0, 1.0]])
    cfg = ActorLossConfig(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1", entropy_loss_coef=0.1,
                          sft_loss_coef=2.0, rl_loss_coef=3.0, agg_mode="token-mean")
    total, m = actor_loss(logp, old, adv, mask, cfg, ref_logprob=logp - 0.2, entropy=T([[1.0, 3.0]]), positive_rows=T([1]))
    # pg = -1; kl = .2; entropy 2; sft = -mean(ln .5, ln .25) = 1.03972 -> 3 * -1 + .5 * .2 - .1 * 2 + 2 * 1.03972
    assert total.item() == approx(-3.0 + 0.1 - 0.2 + 2 * 1.03972, abs=1e-4)
    assert m["actor/kl_loss"] == approx(0.2) and m["actor/entropy"] == approx(2.0)
    assert m["actor/sft_loss"] == approx(1.03972, abs=1e-4)
    # a row that is not positive gets no SFT term
    total, m = actor_loss(logp, old, adv, mask, cfg, ref_logprob=logp - 0.2, entropy=T([[1.0, 3.0]]), positive_rows=T([0]))
    assert m["actor/sft_loss"] == 0.0 and total.item() == approx(-3.0 + 0.1 - 0.2)


def test_segment_ratio_by_hand():
    # mask: one turn at 1-2, one at 4; log-ratios 0, .4 -> .2 on both; -.3 alone; prompt positions ignored
    mask = T([[0, 1, 1, 0, 1]])
    log_ratio = T([[9.0, 0.0, 0.4, 9.0, -0.3]])
    assert segment_mean(log_ratio, mask).tolist() == [[0.0, approx(0.2), approx(0.2), 0.0, approx(-0.3)]]
    # PPO, A = 1, ratio_type segment: e^.2 = 1.2214 clipped to 1.2 on both tokens of turn one, e^-.3 = .74082
    old = torch.zeros(1, 5)
    loss, _ = ppo_policy_loss(log_ratio, old, torch.ones(1, 5), mask, ratio_type="segment")
    assert loss.item() == approx(-(1.2 + 1.2 + 0.74082) / 3, abs=1e-4)
    # per token: e^0 = 1, e^.4 clipped to 1.2, .74082
    token, _ = ppo_policy_loss(log_ratio, old, torch.ones(1, 5), mask)
    assert token.item() == approx(-(1.0 + 1.2 + 0.74082) / 3, abs=1e-4)


def test_whiten_and_clip_advantages():
    adv = postprocess_advantages(T([[1.0, 3.0, 99.0]]), T([[1, 1, 0]]), whiten=True, clip=0.5)
    # valid 1, 3: mean 2, unbiased std 1.4142 -> -.7071, .7071, clipped to +-.5
    assert adv.tolist() == [[-0.5, 0.5, 0.0]]
    assert masked_whiten(T([5.0]), T([1])).tolist() == [0.0]  # one valid value: no NaN


def test_group_ids_from_keys():
    assert group_ids(["a", ("s", 1), "a", 7]).tolist() == [0, 1, 0, 2]


def by_method(scores, groups, method):
    """Scores normalised within ``groups`` by a reward_normalization method."""
    return normalize_scores(scores, method_scopes(method, "traj_group_id"), groups)[0]

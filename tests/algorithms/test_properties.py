"""Properties over random tensors: masking, special cases, micro-batching, numerical safety."""

import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    discounted_returns,
    gae,
    rloo_advantages,
    turn_index,
    turn_level_returns,
)
from roll.algorithms.kl import KL_ESTIMATORS, kl_penalty
from roll.algorithms.losses import LOSS_AGG_MODES, GlobalCounts, aggregate, ppo_policy_loss, value_loss
from roll.algorithms.masked import masked_whiten
from roll.algorithms.reward_norm import NORM_METHODS, NormSpec, method_scopes, normalize_scores
from roll.configs import schema

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def batches(draw, min_rows=1, max_rows=6, max_len=8):
    rows = draw(st.integers(min_rows, max_rows))
    length = draw(st.integers(1, max_len))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, length, generator=g) < draw(st.floats(0.0, 1.0))).long()
    return {
        "mask": mask,
        "rewards": torch.randn(rows, length, generator=g),
        "values": torch.randn(rows, length, generator=g),
        "logp": -torch.rand(rows, length, generator=g) * 3,
        "old": -torch.rand(rows, length, generator=g) * 3,
        "adv": torch.randn(rows, length, generator=g),
        "scores": torch.randn(rows, generator=g),
        "groups": torch.randint(0, max(1, rows // 2), (rows,), generator=g),
        "garbage": torch.randn(rows, length, generator=g) * 1e6,
    }


def _scramble(x, mask, garbage):
    return torch.where(mask.bool(), x, garbage)


@SETTINGS
@given(b=batches())
def test_masked_positions_never_affect_results(b):
    m, junk = b["mask"], b["garbage"]
    r2, v2, lp2, old2, adv2 = (_scramble(b[k], m, junk) for k in ("rewards", "values", "logp", "old", "adv"))
    torch.testing.assert_close(discounted_returns(b["rewards"], m, 0.9), discounted_returns(r2, m, 0.9))
    a1, ret1 = gae(b["rewards"], b["values"], m, 0.9, 0.8)
    a2, ret2 = gae(r2, v2, m, 0.9, 0.8)
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(ret1, ret2)
    turns = torch.randn(m.shape[0], m.shape[1])
    n_turns = (turn_index(m).max(dim=1).values + 1)[:, None]
    beyond = torch.arange(m.shape[1])[None, :] >= n_turns  # entries past a row's last turn
    torch.testing.assert_close(turn_level_returns(turns, m, 0.7), turn_level_returns(torch.where(beyond, junk, turns), m, 0.7))
    torch.testing.assert_close(masked_whiten(b["adv"], m), masked_whiten(adv2, m))
    for mode in LOSS_AGG_MODES:
        l1, _ = ppo_policy_loss(b["logp"], b["old"], b["adv"], m, agg_mode=mode, norm_length=8)
        l2, _ = ppo_policy_loss(lp2, old2, adv2, m, agg_mode=mode, norm_length=8)
        torch.testing.assert_close(l1, l2)
        v1, _ = value_loss(b["values"], b["old"], b["rewards"], m, clip=0.2, agg_mode=mode, norm_length=8)
        v2_, _ = value_loss(v2, old2, r2, m, clip=0.2, agg_mode=mode, norm_length=8)
        torch.testing.assert_close(v1, v2_)


@SETTINGS
@given(b=batches())
def test_gae_with_lambda_one_gamma_one_zero_values_is_the_reinforce_return(b):
    adv, _ = gae(b["rewards"], torch.zeros_like(b["values"]), b["mask"], 1.0, 1.0)
    torch.testing.assert_close(adv, discounted_returns(b["rewards"], b["mask"], 1.0))


@SETTINGS
@given(b=batches(min_rows=1, max_rows=8))
def test_rloo_is_the_explicit_leave_one_out_formula(b):
    scores, groups = b["scores"], b["groups"]
    adv = rloo_advantages(scores, groups, torch.ones(len(scores), 1))[:, 0]
    for i in range(len(scores)):
        others = [float(scores[j]) for j in range(len(scores)) if j != i and groups[j] == groups[i]]
        expected = float(scores[i]) - sum(others) / len(others) if others else 0.0
        assert adv[i].item() == pytest.approx(expected, abs=1e-5)


@SETTINGS
@given(b=batches(min_rows=2, max_rows=8), split=st.integers(1, 7), mode=st.sampled_from(LOSS_AGG_MODES))
def test_micro_batches_add_up_to_the_full_batch_loss(b, split, mode):
    m = b["mask"]
    counts = GlobalCounts.of(m)
    norm = 16.0  # the run's constant length (at least any row's width)
    full, full_metrics = ppo_policy_loss(b["logp"], b["old"], b["adv"], m, agg_mode=mode, counts=counts, norm_length=norm)
    cut = min(split, m.shape[0] - 1)
    parts = [slice(0, cut), slice(cut, None)]
    results = [ppo_policy_loss(b["logp"][s], b["old"][s], b["adv"][s], m[s], agg_mode=mode, counts=counts, norm_length=norm)
               for s in parts]
    torch.testing.assert_close(sum(r[0] for r in results), full)
    for key, value in full_metrics.items():  # every metric adds up as the loss does
        assert sum(r[1][key] for r in results) == pytest.approx(value, abs=1e-5), key

    # data-parallel ranks pad their rows to their own width: each part cut to its last valid column
    def trimmed(s):
        cols = m[s].sum(0).nonzero()
        width = int(cols.max()) + 1 if len(cols) else 1
        return aggregate(b["adv"][s][:, :width], m[s][:, :width], mode, counts, norm)

    torch.testing.assert_close(sum(trimmed(s) for s in parts), aggregate(b["adv"], m, mode, counts, norm))


def _finite(x):
    return bool(torch.isfinite(x).all())


@SETTINGS
@given(n=st.integers(1, 6), value=st.floats(-5, 5))
def test_no_nan_on_degenerate_inputs(n, value):
    all_masked = torch.zeros(n, 4, dtype=torch.long)
    same = torch.full((n,), value)
    singletons = torch.arange(n)
    one_group = torch.zeros(n, dtype=torch.long)
    for method in NORM_METHODS:
        for groups in (singletons, one_group):
            out = by_method(same, groups, method)
            assert _finite(out)
            if method != "identity":
                assert out.abs().max() == 0.0  # zero variance or a lone row: zero advantage
    assert rloo_advantages(same, singletons, torch.ones(n, 2)).abs().max() == 0.0
    for mode in LOSS_AGG_MODES:
        loss, metrics = ppo_policy_loss(torch.zeros(n, 4), torch.zeros(n, 4), torch.ones(n, 4), all_masked, agg_mode=mode,
                                        norm_length=4)
        assert _finite(loss) and loss.item() == 0.0 and all(map(lambda v: v == v, metrics.values()))
    assert _finite(masked_whiten(torch.randn(n, 4), all_masked))
    for mean_scope in (None, "batch", "group", "running"):
        for std_scope in (None, "batch", "group", "running"):
            for groups in (singletons, one_group):
                out = normalize_scores(same, NormSpec(mean_scope, std_scope), groups)[0]
                assert _finite(out)
                if std_scope is not None or (mean_scope is not None and (mean_scope != "group" or groups is one_group)):
                    assert out.abs().max() == 0.0  # constant scores carry no signal
    for estimator in ADVANTAGE_ESTIMATORS:
        adv, ret = compute_advantages(estimator, _inputs(n, all_masked, same, singletons), AdvantageParams())
        assert _finite(adv) and _finite(ret) and adv.abs().max() == 0.0


def _inputs(n, mask, scores, groups):
    length = mask.shape[1]
    return AdvantageInputs(
        response_mask=mask, token_rewards=torch.randn(n, length), scores=scores, groups=groups,
        values=torch.randn(n, length), turn_rewards=torch.randn(n, 3), step_return=scores, state_groups=groups,
    )


def _literal_values(cls, name):
    tp = typing.get_type_hints(cls)[name]
    out = []
    for arg in (tp, *typing.get_args(tp)):
        if typing.get_origin(arg) is typing.Literal:
            out.extend(typing.get_args(arg))
    return out


@pytest.mark.parametrize("name", _literal_values(schema.PipelineConfig, "adv_estimator"))
def test_every_adv_estimator_name_in_the_schema_reaches_its_function(name):
    mask = torch.ones(4, 3, dtype=torch.long)
    adv, _ = compute_advantages(name, _inputs(4, mask, torch.tensor([1.0, 0.0, 2.0, 0.5]), torch.tensor([0, 0, 1, 1])),
                                AdvantageParams(gamma=0.9))
    assert adv.shape == (4, 3) and _finite(adv) and adv.abs().sum() > 0


@pytest.mark.parametrize("field", ["kl_penalty", "kl_loss_type"])
def test_every_kl_name_in_the_schema_reaches_its_function(field):
    names = _literal_values(schema.PipelineConfig, field)
    assert set(names) == set(KL_ESTIMATORS)
    for name in names:
        out = kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0]), name, logits=torch.randn(1, 5), ref_logits=torch.randn(1, 5))
        assert _finite(out)


def test_every_loss_agg_mode_and_norm_name_in_the_schema_reaches_its_function():
    assert set(_literal_values(schema.PipelineConfig, "loss_agg_mode")) == set(LOSS_AGG_MODES)
    for mode in LOSS_AGG_MODES:
        assert _finite(aggregate(torch.ones(2, 2), torch.ones(2, 2), mode, norm_length=2))
    assert set(_literal_values(schema.RewardNormalizationConfig, "method")) == set(NORM_METHODS)
    for method in NORM_METHODS:
        assert _finite(by_method(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), method))
    for scope in _literal_values(schema.PipelineConfig, "reward_norm"):
        assert _finite(normalize_scores(torch.tensor([1.0, 2.0]), NormSpec(scope, scope), torch.tensor([0, 0]))[0])
    for field in ("norm_mean_type", "norm_std_type"):
        for scope in _literal_values(schema.RewardNormalizationConfig, field):
            assert _finite(normalize_scores(torch.tensor([1.0, 2.0]), NormSpec(scope, scope), torch.tensor([0, 0]))[0])
    with pytest.raises(ValueError, match="unknown"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "mean")


def by_method(scores, groups, method):
    """Scores normalised within ``groups`` by a reward_normalization method."""
    return normalize_scores(scores, method_scopes(method, "traj_group_id"), groups)[0]

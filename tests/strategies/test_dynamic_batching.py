"""Dynamic batching (micro-batches by token count) changes speed, never the numbers."""

import dataclasses

import pytest
import torch

from roll.algorithms.losses import ActorLossConfig
from roll.distributed.batch import Batch
from roll.strategies.base import StrategyContext
from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy
from roll.strategies.hf_infer import HFInferStrategy
from roll.strategies.micro_batching import (
    dynamic_micro_batches,
    scatter_rows,
    split_to,
    token_budget_groups,
    trimmed,
)
from roll.workers.actor_train import make_actor_loss_fn

from .helpers import SGD_LIKE, sgd_step, with_old_logprobs, worker_config


def ragged_batch(lengths, width=24, seed=0, vocab=500):
    g = torch.Generator().manual_seed(seed)
    rows = len(lengths)
    ids = torch.randint(3, vocab, (rows, width), generator=g)
    attention = torch.zeros(rows, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        attention[i, :n] = 1
    response = attention.clone()
    response[:, :3] = 0
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    adv = torch.linspace(-1, 1, rows)[:, None].expand(rows, width).contiguous()
    return Batch({"input_ids": ids, "attention_mask": attention, "position_ids": position, "response_mask": response,
                  "advantages": adv})


def test_groups_respect_the_budget_and_put_similar_lengths_together():
    lengths = [20, 5, 18, 6, 4, 19]
    groups = token_budget_groups(lengths, max_tokens=40, round_to=4)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        width = -(-max(lengths[i] for i in g) // 4) * 4
        assert len(g) == 1 or len(g) * width <= 40
    # longest first: 20 and 19 fit (2 x 20 = 40); 18 opens a group of width 20 that takes 6; 5 and 4 share width 8
    assert groups == [[0, 5], [2, 3], [1, 4]]
    assert token_budget_groups([100], max_tokens=10) == [[0]]  # a row over budget still runs, alone


def test_split_to_reaches_the_count_with_empty_groups_when_rows_run_out():
    assert split_to([[0, 1, 2, 3]], 2) == [[0, 1], [2, 3]]
    assert split_to([[0]], 3) == [[0], [], []]
    with pytest.raises(ValueError):
        split_to([[0], [1]], 1)


def test_trim_and_scatter_restore_the_row_order():
    batch = ragged_batch([5, 9, 3])
    t = trimmed(batch, round_to=4)
    assert t["input_ids"].shape == (3, 12) and torch.equal(t["input_ids"], batch["input_ids"][:, :12])
    micros, groups = dynamic_micro_batches(batch, max_tokens=16, round_to=4)
    parts = [m["input_ids"].float() for m in micros]
    back = scatter_rows(parts, groups, 3, 24)
    assert torch.equal(back * batch["attention_mask"], batch["input_ids"].float() * batch["attention_mask"])


@pytest.fixture
def lengths():
    return [24, 7, 22, 6, 9, 20, 5, 8]


def _train(path, dynamic, **kw):
    cfg = worker_config(path, micro=2, gas=4, **SGD_LIKE, infer_batch_size=2)
    cfg = dataclasses.replace(cfg, use_dynamic_batching_in_train=dynamic, max_tokens_per_microbatch_in_train=48,
                              use_dynamic_batching_in_infer=dynamic, max_tokens_per_microbatch_in_infer=40, **kw)
    s = DeepSpeedTrainStrategy(cfg, StrategyContext(role="actor_train", seed=1))
    s.initialize()
    return s


def test_deepspeed_dynamic_batching_gives_the_same_logprobs_loss_and_step(tiny_model_path, lengths):
    batch = ragged_batch(lengths)
    loss_fn = make_actor_loss_fn(ActorLossConfig(agg_mode="seq-mean-token-mean"))
    results = []
    for dynamic in (False, True):
        s = _train(tiny_model_path, dynamic)
        logprobs = s.compute_log_probs(batch)
        before = {n: p.detach().clone() for n, p in s.engine.module.named_parameters()}
        metrics = s.train_step(with_old_logprobs(batch, logprobs), loss_fn)
        after = {n: p.detach().clone() for n, p in s.engine.module.named_parameters()}
        results.append((logprobs, metrics, sgd_step(before, after)))
    (lp0, m0, d0), (lp1, m1, d1) = results
    mask = batch["attention_mask"].bool()
    assert torch.allclose(lp0[mask], lp1[mask], atol=1e-5)
    assert m1["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], abs=1e-6)
    for name in d0:
        assert torch.allclose(d0[name], d1[name], atol=1e-5), name
    assert max(float(d.abs().max()) for d in d0.values()) > 1e-3  # a real step was compared


def test_hf_infer_dynamic_batching_gives_the_same_logprobs(tiny_model_path, lengths):
    batch = ragged_batch(lengths)
    out = []
    for dynamic in (False, True):
        cfg = dataclasses.replace(worker_config(tiny_model_path, "hf_infer", infer_batch_size=3),
                                  use_dynamic_batching_in_infer=dynamic, max_tokens_per_microbatch_in_infer=30)
        s = HFInferStrategy(cfg)
        s.initialize()
        out.append(s.compute_log_probs(batch))
    mask = batch["attention_mask"].bool()
    assert torch.allclose(out[0][mask], out[1][mask], atol=1e-5)

"""The weight-sync check's arithmetic: which tokens count, the largest and mean gap, the tolerance by precision."""

import torch

from roll.agentic.sync_check import TOLERANCE_FP32, TOLERANCE_HALF, probe_batch, sync_gap, tolerance


def test_gap_over_every_engine_leaves_out_position_zero_and_padding():
    train = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    same = train.clone()
    off = train.clone()
    off[0, 0] = 9.0  # position 0 has no log-prob: not scored
    off[0, 3] = 9.0  # padding: not scored
    off[1, 2] = -0.8  # a scored token 0.3 off
    gap = sync_gap(train, [same, off], mask, 0.25)
    assert abs(gap.max_abs - 0.3) < 1e-6
    assert abs(gap.mean_abs - 0.3 / 10) < 1e-6  # 5 scored tokens per engine, 2 engines
    assert not gap.ok and sync_gap(train, [same], mask, 0.25).ok
    assert gap.metrics()["weight_sync/logprob_max_abs_diff"] == gap.max_abs


def test_probe_is_fixed_by_the_seed_and_tolerance_by_the_precisions():
    a, b = probe_batch(100, seed=3), probe_batch(100, seed=3)
    assert torch.equal(a["input_ids"], b["input_ids"]) and int(a["input_ids"].max()) < 100
    assert not torch.equal(a["input_ids"], probe_batch(100, seed=4)["input_ids"])
    assert tolerance(True) == TOLERANCE_FP32 < tolerance(False) == TOLERANCE_HALF

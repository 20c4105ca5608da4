"""The weight-sync check's arithmetic: which tokens count, the largest and mean gap, the tolerance by precision."""

import torch

from roll.agentic.sync_check import PROBE_TEXT, TOLERANCE_FP32, TOLERANCE_HALF, probe_batch, sync_gap


def test_gap_over_every_engine_leaves_out_position_zero_and_padding():
    train = torch.tensor([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    same = train.clone()
    off = train.clone()
    off[0, 0] = 9.0  # position 0 has no log-prob: not scored
    off[0, 3] = 9.0  # padding: not scored
    off[1, 2] = -0.8  # a scored token 0.3 off
    gap = sync_gap(train, [same, off], mask, fp32=True)
    assert abs(gap.max_abs - 0.3) < 1e-6
    assert abs(gap.mean_abs - 0.3 / 10) < 1e-6  # 5 scored tokens per engine, 2 engines
    assert not gap.ok and sync_gap(train, [same], mask, fp32=True).ok
    assert gap.metrics()["weight_sync/logprob_max_abs_diff"] == gap.max_abs
    half = sync_gap(train, [same, off], mask, fp32=False)  # half precision: the mean (0.03) is held to 0.15
    assert half.ok and half.tolerance == TOLERANCE_HALF and gap.tolerance == TOLERANCE_FP32
    far = train.clone()
    far[:, 1:] -= 0.5
    assert not sync_gap(train, [far], mask, fp32=False).ok


def test_the_probe_is_the_fixed_text_in_the_runs_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    probe = probe_batch(tokenizer)
    assert tokenizer.decode(probe["input_ids"][0]) == PROBE_TEXT
    assert probe["attention_mask"].all() and probe["input_ids"].shape[1] > 16

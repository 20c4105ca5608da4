"""batch_adjust_mode: whole optimizer steps for every training role, every added or removed row counted."""

import numpy as np
import pytest
import torch

from roll.agentic.batch_adjust import adjust_batch
from roll.distributed.batch import Batch


def rows(n: int) -> Batch:
    return Batch({"x": torch.arange(n)}, {"id": [f"r{i}" for i in range(n)]})


@pytest.mark.parametrize("mode, n, divisor, size, added, removed", [
    ("copy", 10, 4, 12, 2, 0),
    ("delete", 10, 4, 8, 0, 2),
    ("auto", 10, 4, 8, 0, 2),  # remainder 2 < half of 10: delete
    ("auto", 7, 4, 4, 0, 3),  # remainder 3 < half of 7: delete
    ("auto", 3, 4, 4, 1, 0),  # less than one step: copy
    ("random_sample", 10, 4, 4, 0, 6),  # one step's worth
    ("random_sample", 3, 4, 4, 1, 0),  # too few to sample a step: copy
    ("delete", 3, 4, 4, 1, 0),  # deleting would leave nothing: copy
    ("copy", 8, 4, 8, 0, 0),  # divides already
])
def test_modes_by_hand(mode, n, divisor, size, added, removed):
    out, metrics = adjust_batch(rows(n), mode, divisor, np.random.default_rng(0))
    assert len(out) == size and len(out) % divisor == 0
    assert (metrics["batch/rows_added"], metrics["batch/rows_removed"]) == (added, removed)
    ids = out["x"].tolist()
    assert set(ids) <= set(range(n))
    if added:
        assert ids[:n] == list(range(n))  # the collected rows stay, copies follow
    if removed:
        assert len(set(ids)) == size  # rows are removed, never duplicated


def test_copies_are_drawn_without_replacement_when_possible():
    out, _ = adjust_batch(rows(10), "copy", 8, np.random.default_rng(1))  # 6 copies of 10 rows
    extra = out["x"].tolist()[10:]
    assert len(extra) == 6 and len(set(extra)) == 6


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="batch_adjust_mode"):
        adjust_batch(rows(3), "pad", 2, np.random.default_rng(0))

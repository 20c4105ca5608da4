"""Checking a weight sync: the same probe sequences scored by every actor_infer engine and by actor_train.

After a sync the engines must hold the trainer's weights, so their log-probs of any sequence agree with the
trainer's up to the arithmetic of the two precisions. A sync that missed a layer, wrote a stale bucket or left an
engine's re-packed kernels on old weights shows as a gap far above that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.distributed.batch import Batch

# Largest per-token |log-prob difference| the two sides may show: both in fp32 (only summation order differs), or
# either side computing in bf16/fp16 (the bound scripts/gpu/_common.py holds the GPU engines to).
TOLERANCE_FP32 = 1e-4
TOLERANCE_HALF = 0.3


@dataclass(frozen=True)
class SyncGap:
    max_abs: float
    mean_abs: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.tolerance

    def metrics(self) -> dict[str, float]:
        return {"weight_sync/logprob_max_abs_diff": self.max_abs, "weight_sync/logprob_mean_abs_diff": self.mean_abs,
                "weight_sync/logprob_tolerance": self.tolerance}


def probe_batch(vocab_size: int, seed: int, rows: int = 2, length: int = 48) -> Batch:
    """``rows`` sequences of ``length`` token ids drawn with ``seed`` (the same probe at every check)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (rows, length), generator=g)
    return Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def tolerance(fp32_both: bool) -> float:
    return TOLERANCE_FP32 if fp32_both else TOLERANCE_HALF


def sync_gap(train: torch.Tensor, engines: list[torch.Tensor], mask: torch.Tensor, tol: float) -> SyncGap:
    """The largest and the mean |difference| over every engine and every scored token (position 0 has no
    log-prob: it is left out)."""
    scored = mask.bool().clone()
    scored[:, 0] = False
    diffs = torch.cat([(e.float() - train.float()).abs()[scored] for e in engines])
    return SyncGap(float(diffs.max()), float(diffs.mean()), tol)

"""Checking a weight sync: the same probe sequences scored by every actor_infer engine and by actor_train.

After a sync the engines must hold the trainer's weights, so their log-probs of any sequence agree with the
trainer's up to the arithmetic of the two precisions. A sync that missed a layer, wrote a stale bucket or left an
engine's re-packed kernels on old weights shows as a gap far above that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll.distributed.batch import Batch

# What the two sides may differ by. Both in fp32, only summation order differs: every token within 1e-4. With either
# side in bf16/fp16 the rounding alone moves the log-probs: SmolLM2-135M scoring PROBE_TEXT gave a mean gap of 0.059
# (largest 0.59) between vLLM in bf16 and the fp32 trainer holding identical weights, so half precision is held to a
# mean of 0.15: it stops a sync that missed the engine, not one a step stale (one step's update mostly falls below
# bf16's resolution, so a bf16 engine cannot show it).
TOLERANCE_FP32 = 1e-4  # on the largest gap
TOLERANCE_HALF = 0.15  # on the mean gap
PROBE_TEXT = (
    "A weight sync hands the trainer's newest parameters to the generation engine. Afterwards both sides should "
    "score any sentence the same way, apart from rounding, so this paragraph is scored by each of them and the two "
    "lists of numbers are compared token by token. Nothing here depends on the task being trained.")


@dataclass(frozen=True)
class SyncGap:
    max_abs: float
    mean_abs: float
    tolerance: float
    on_mean: bool = False  # half precision: the tolerance bounds the mean gap, not the largest

    @property
    def ok(self) -> bool:
        return (self.mean_abs if self.on_mean else self.max_abs) <= self.tolerance

    def describe(self) -> str:
        return f"{'mean' if self.on_mean else 'largest'} gap within {self.tolerance:g}"

    def metrics(self) -> dict[str, float]:
        return {"weight_sync/logprob_max_abs_diff": self.max_abs, "weight_sync/logprob_mean_abs_diff": self.mean_abs,
                "weight_sync/logprob_tolerance": self.tolerance}


def probe_batch(tokenizer: Any) -> Batch:
    """PROBE_TEXT in the run's tokenizer: one row, the same at every check."""
    ids = torch.tensor([tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]])
    return Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def sync_gap(train: torch.Tensor, engines: list[torch.Tensor], mask: torch.Tensor, fp32: bool) -> SyncGap:
    """The largest and the mean |difference| over every engine and every scored token (position 0 has no
    log-prob: it is left out), held to the tolerance of the precisions (``fp32``: both sides compute in fp32)."""
    scored = mask.bool().clone()
    scored[:, 0] = False
    diffs = torch.cat([(e.float() - train.float()).abs()[scored] for e in engines])
    tol = TOLERANCE_FP32 if fp32 else TOLERANCE_HALF
    return SyncGap(float(diffs.max()), float(diffs.mean()), tol, on_mean=not fp32)

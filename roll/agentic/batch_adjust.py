"""``batch_adjust_mode``: bring a collected batch to a row count the trainers split into whole
optimizer steps (a multiple of each training role's global mini-batch).

Step-wise env managers emit one row per turn, and lost episodes shorten any batch, so the row count
rarely divides on its own. The modes (ROLL's): ``copy`` appends copies of randomly drawn rows (drawn
without replacement while the batch has enough rows); ``delete`` removes random rows; ``auto``
copies when the remainder is at least half the batch (or the batch is smaller than one step) and
deletes otherwise; ``random_sample`` keeps one step's worth of random rows. Added and removed rows
are counted in the metrics, so no row disappears unseen.
"""

from __future__ import annotations

import numpy as np

from roll.distributed.batch import Batch

BATCH_ADJUST_MODES = ("copy", "delete", "auto", "random_sample")


def adjust_batch(batch: Batch, mode: str, divisor: int, rng: np.random.Generator) -> tuple[Batch, dict[str, float]]:
    """The adjusted batch and its metrics (``batch/rows_added``, ``batch/rows_removed``)."""
    if mode not in BATCH_ADJUST_MODES:
        raise ValueError(f"unknown batch_adjust_mode {mode!r}; use one of {', '.join(BATCH_ADJUST_MODES)}")
    n = len(batch)
    metrics = {"batch/rows_added": 0.0, "batch/rows_removed": 0.0}
    remainder = n % divisor if divisor > 1 else 0
    if n == 0 or remainder == 0:
        return batch, metrics
    if mode == "auto":
        mode = "copy" if remainder >= 0.5 * n or n < divisor else "delete"
    if mode == "random_sample" and n < divisor:
        mode = "copy"
    if mode == "delete" and remainder >= n:
        mode = "copy"  # deleting would leave nothing
    if mode == "copy":
        add = divisor - remainder
        extra = rng.choice(n, add, replace=add > n)
        metrics["batch/rows_added"] = float(add)
        return Batch.concat([batch, batch.select(extra)]), metrics
    keep_count = n - remainder if mode == "delete" else divisor  # random_sample: one step's worth
    keep = np.sort(rng.choice(n, keep_count, replace=False))
    metrics["batch/rows_removed"] = float(n - keep_count)
    return batch.select(keep), metrics

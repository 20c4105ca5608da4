"""Training rollouts collected now (synchronous) or ahead of the trainer (``async_generation_ratio``).

With ratio k > 0 a producer thread collects the batch of step j as soon as the trainer has reached
step j - k (its weights for that step are on the inference side), so generation for the next k steps
runs while the trainer updates. A weight sync pauses generation between turns; the trajectories in
flight continue with the new weights (partial rollouts), and every token records the version that
sampled it (``policy_version``). At training time ``bound_staleness`` drops any group holding a
token more than k versions behind the trainer, and reports the staleness.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from roll.distributed.batch import Batch

Collect = Callable[[int], Any]  # step -> RolloutResult


class RolloutsNow:
    """Synchronous: each step's batch is collected when the trainer asks for it."""

    def __init__(self, collect: Collect) -> None:
        self.collect = collect

    def trainer_at(self, step: int) -> None:
        pass

    def take(self, step: int) -> Any:
        return self.collect(step)

    def stop(self) -> None:
        pass


class RolloutsAhead:
    """Asynchronous: a producer thread collects steps ``start, start + 1, ...`` in order, the batch of step
    j starting once ``trainer_at(s)`` was called with s >= j - ratio."""

    def __init__(self, collect: Collect, start: int, stop: int, ratio: int) -> None:
        if ratio < 1:
            raise ValueError(f"async rollouts need a ratio >= 1, got {ratio}")
        self.collect, self.ratio = collect, ratio
        self._cond = threading.Condition()
        self._trainer: int | None = None  # the step whose weights the inference side has; None before the first sync
        self._stopped = False
        self._ready: queue.Queue = queue.Queue()
        self.started: dict[int, int] = {}  # step -> the trainer step when its collection began (for tests and metrics)
        self._thread = threading.Thread(target=self._produce, args=(start, stop), daemon=True, name="rollouts-ahead")
        self._thread.start()

    def trainer_at(self, step: int) -> None:
        """The trainer starts ``step`` with its weights synced: collections up to step + ratio may begin."""
        with self._cond:
            self._trainer = step
            self._cond.notify_all()

    def take(self, step: int) -> Any:
        got, result = self._ready.get()
        if isinstance(result, BaseException):
            raise result
        if got != step:
            raise RuntimeError(f"async rollouts: the trainer asked for step {step} but the next batch is step {got}")
        return result

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _produce(self, start: int, stop: int) -> None:
        for step in range(start, stop):
            with self._cond:
                while not self._stopped and (self._trainer is None or self._trainer < step - self.ratio):
                    self._cond.wait()
                if self._stopped:
                    return
                self.started[step] = self._trainer
            try:
                result = self.collect(step)
            except BaseException as e:  # noqa: BLE001 - raised in the trainer's thread by take()
                self._ready.put((step, e))
                return
            self._ready.put((step, result))


def row_versions(batch: Batch) -> torch.Tensor:
    """Each row's oldest policy version among its sampled tokens (rows without any: a large number)."""
    versions = batch["policy_version"]
    sampled = versions >= 0
    big = torch.iinfo(versions.dtype).max
    return torch.where(sampled, versions, torch.full_like(versions, big)).min(-1).values


def bound_staleness(batch: Batch, version: int, ratio: int) -> tuple[Batch, dict[str, float]]:
    """``batch`` without the groups (``traj_group_id``) that hold a token sampled more than ``ratio`` versions
    before ``version`` (the trainer's), and the staleness metrics of the rows kept."""
    oldest = row_versions(batch)
    has_tokens = oldest != torch.iinfo(oldest.dtype).max
    staleness = torch.where(has_tokens, version - oldest, torch.zeros_like(oldest))
    too_old = staleness > ratio
    groups = batch["traj_group_id"] if "traj_group_id" in batch else np.arange(len(batch)).astype(object)
    bad = {g for g, old in zip(groups, too_old.tolist()) if old}
    keep = [i for i, g in enumerate(groups) if g not in bad]
    kept = staleness[keep].float() if keep else torch.zeros(1)
    metrics = {"async/staleness_mean": float(kept.mean()), "async/staleness_max": float(kept.max()),
               "async/dropped_rows": float(len(batch) - len(keep)), "async/version": float(version)}
    return (batch if len(keep) == len(batch) else batch.select(keep)), metrics

"""The learning rate of each optimizer step, from ``transformers.get_scheduler``.

How many optimizer steps a run takes is not known when training starts: a step-wise env manager
emits one row per turn, so a pipeline step holds as many rows as its episodes had turns. Before each
``train_step`` the strategy says how many optimizer steps this call takes; the schedule's length is
then re-derived as the steps already taken plus this call's count for every call still to come.
With a fixed row count (trajectory-wise rollouts) that is exact from the first call; otherwise it
converges, and the last call always ends the schedule exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# transformers' schedules that need nothing beyond the warmup and the length
SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial", "inverse_sqrt")


class LRSchedule:
    def __init__(self, name: str, base_lr: float, train_calls: int, warmup_steps: int = 0, warmup_ratio: float = 0.0) -> None:
        if name not in SCHEDULES:
            raise ValueError(f"unknown lr_scheduler_type {name!r}; use one of {', '.join(SCHEDULES)}")
        self.name, self.base_lr = name, float(base_lr)
        self.train_calls = max(1, int(train_calls))  # train_step calls the run will make
        self.warmup_steps, self.warmup_ratio = int(warmup_steps), float(warmup_ratio)
        self.steps_done = 0  # optimizer steps taken
        self.calls_done = 0
        self.total: int | None = None
        self.warmup: int | None = None
        self._factor: Any = None

    def plan(self, steps_now: int) -> None:
        """Before a train_step call that will take ``steps_now`` optimizer steps."""
        calls_left = max(1, self.train_calls - self.calls_done)
        total = max(1, self.steps_done + steps_now * calls_left)
        if self.warmup is None:  # fixed once: a warmup must not move after it started
            self.warmup = self.warmup_steps or math.ceil(self.warmup_ratio * total)
        if total != self.total or self._factor is None:
            self.total = total
            self._factor = _schedule_factor(self.name, self.warmup, total)

    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        if self._factor is None:
            self.plan(1)
        return self.base_lr * float(self._factor(self.steps_done))

    def step_taken(self) -> None:
        self.steps_done += 1

    def call_done(self) -> None:
        self.calls_done += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done, "calls_done": self.calls_done, "total": self.total, "warmup": self.warmup}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done, self.calls_done = int(state["steps_done"]), int(state["calls_done"])
        self.warmup = state["warmup"]
        self.total, self._factor = state["total"], None
        if self.total is not None:
            self._factor = _schedule_factor(self.name, self.warmup or 0, self.total)


def _schedule_factor(name: str, warmup: int, total: int) -> Any:
    """transformers' multiplier function step -> factor for ``name`` (built on a throwaway optimizer)."""
    from transformers import get_scheduler

    dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return get_scheduler(name, dummy, num_warmup_steps=warmup, num_training_steps=total).lr_lambdas[0]

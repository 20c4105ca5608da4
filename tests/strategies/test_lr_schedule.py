"""The learning-rate schedule: transformers' schedules over the optimizer steps a role really runs."""

import pytest
import torch
from transformers import get_scheduler

from roll.strategies.lr_schedule import SCHEDULES, LRSchedule


def run(schedule: LRSchedule, steps_per_call: list[int]) -> list[float]:
    lrs = []
    for n in steps_per_call:
        schedule.plan(n)
        for _ in range(n):
            lrs.append(schedule.lr())
            schedule.step_taken()
        schedule.call_done()
    return lrs


def reference(name: str, warmup: int, total: int, base: float = 1.0) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_fixed_step_count_is_transformers_schedule(name):
    """Trajectory-wise batches give the same optimizer steps every call: the plan is exact from the start."""
    lrs = run(LRSchedule(name, 1.0, train_calls=5, warmup_steps=3), [4] * 5)
    assert lrs == pytest.approx(reference(name, 3, 20), abs=1e-12)


def test_varying_step_counts_end_the_schedule_on_the_last_call():
    """Step-wise batches: the length is re-derived every call, and linear decay reaches its last value on the
    last step actually taken (it used to hit 0 after the trajectory count's worth of steps)."""
    lrs = run(LRSchedule("linear", 1.0, train_calls=3), [2, 5, 3])
    assert len(lrs) == 10 and all(lr > 0 for lr in lrs)
    assert lrs[-1] == pytest.approx(1 / 10)  # the last of 10 steps of a 10-step linear decay
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # never rises


def test_warmup_ratio_is_fixed_at_the_first_plan_and_state_round_trips():
    s = LRSchedule("cosine", 2.0, train_calls=4, warmup_ratio=0.25)
    first = run(s, [2, 2])
    assert s.warmup == 2 and first[0] == pytest.approx(0.0) and first[1] == pytest.approx(1.0)
    resumed = LRSchedule("cosine", 2.0, train_calls=4, warmup_ratio=0.25)
    resumed.load_state_dict(s.state_dict())
    assert run(resumed, [2, 2]) == run(s, [2, 2])


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        LRSchedule("onecycle", 1.0, 1)

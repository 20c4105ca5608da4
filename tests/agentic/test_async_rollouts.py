"""Rollouts ahead of the trainer: the staleness bound under random timings, version stamps across a
weight sync, and the drop of groups that are too old."""

import random
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll.agentic.async_rollouts import RolloutsAhead, RolloutsNow, bound_staleness, row_versions
from roll.agentic.generation import RequestBatcher
from roll.distributed.batch import Batch
from roll.strategies.base import Generation, SamplingParams


class FakeTrainer:
    """Stands for the inference side's weights: collect() stamps each 'token' with the version in force."""

    def __init__(self, rng):
        self.version = -1
        self.rng = rng
        self.lock = threading.Lock()

    def collect(self, step):
        stamps = []
        for _ in range(3):  # three turns; the weights may change between them
            with self.lock:
                stamps.append(self.version)
            time.sleep(self.rng.random() * 0.004)
        return stamps


@settings(max_examples=25, deadline=None)
@given(ratio=st.integers(1, 3), seed=st.integers(0, 10_000), steps=st.integers(2, 7))
def test_no_batch_is_ever_more_than_ratio_versions_behind(ratio, seed, steps):
    rng = random.Random(seed)
    trainer = FakeTrainer(rng)
    ahead = RolloutsAhead(trainer.collect, 0, steps, ratio)
    try:
        for step in range(steps):
            with trainer.lock:
                trainer.version = step  # the weight sync at the start of the step
            ahead.trainer_at(step)
            stamps = ahead.take(step)
            assert min(stamps) >= step - ratio  # staleness at training time <= ratio
            assert max(stamps) <= step
            time.sleep(rng.random() * 0.006)  # the trainer's work
        assert all(ahead.started[s] >= s - ratio for s in range(steps))
    finally:
        ahead.stop()


def test_collection_runs_ahead_while_the_trainer_works():
    log = []
    ahead = RolloutsAhead(lambda s: log.append(("collect", s)) or s, 0, 3, 1)
    ahead.trainer_at(0)
    assert ahead.take(0) == 0
    time.sleep(0.05)  # the trainer trains step 0 ...
    assert ("collect", 1) in log  # ... while step 1's episodes were already played
    ahead.stop()


def test_no_collection_starts_before_the_first_weight_sync():
    log = []
    ahead = RolloutsAhead(lambda s: log.append(s) or s, 5, 8, 2)
    time.sleep(0.05)
    assert log == []  # resumed weights are not on the inference side yet
    ahead.trainer_at(5)
    assert ahead.take(5) == 5
    ahead.stop()


def test_a_collection_error_surfaces_in_the_trainer():
    def boom(step):
        raise RuntimeError("env crashed")

    ahead = RolloutsAhead(boom, 0, 2, 1)
    ahead.trainer_at(0)
    with pytest.raises(RuntimeError, match="env crashed"):
        ahead.take(0)
    assert RolloutsNow(lambda s: s * 2).take(3) == 6


def _batch(versions, groups):
    v = torch.tensor(versions)
    return Batch({"policy_version": v, "response_mask": (v >= 0).long()}, {"traj_group_id": groups})


def test_bound_staleness_drops_whole_groups_and_reports_by_hand():
    # rows' oldest sampled versions: 3, 4, 1, 4 (trainer at 4, ratio 2): row 2 is 3 versions old -> its group goes
    b = _batch([[-1, 3, 4], [-1, 4, 4], [-1, 1, 4], [-1, -1, 4]], ["g0", "g0", "g1", "g1"])
    assert row_versions(b).tolist() == [3, 4, 1, 4]
    kept, m = bound_staleness(b, version=4, ratio=2)
    assert len(kept) == 2 and list(kept["traj_group_id"]) == ["g0", "g0"]
    assert m["async/dropped_rows"] == 2.0 and m["async/staleness_mean"] == 0.5 and m["async/staleness_max"] == 1.0
    same, m2 = bound_staleness(b, version=4, ratio=3)
    assert same is b and m2["async/dropped_rows"] == 0.0 and m2["async/staleness_max"] == 3.0


def test_weight_sync_pauses_between_batches_and_results_carry_the_version():
    """pause() waits for the running batch; batches after resume(v) are stamped v; no batch runs during the sync."""
    running = threading.Event()
    release = threading.Event()
    active = []

    def backend(rank, prompts, params):
        active.append(1)
        running.set()
        release.wait(5)
        active.pop()
        return [Generation([1], [0.0], "stop") for _ in prompts]

    batcher = RequestBatcher(backend, 1, max_batch_size=4, max_wait_s=0.0)
    out = {}
    first = threading.Thread(target=lambda: out.setdefault("a", batcher.generate("e", [1], SamplingParams())))
    first.start()
    running.wait(5)
    paused = threading.Thread(target=batcher.pause)
    paused.start()
    time.sleep(0.05)
    assert paused.is_alive()  # waiting for the running batch
    release.set()
    paused.join(5)
    assert not paused.is_alive() and not active
    second = threading.Thread(target=lambda: out.setdefault("b", batcher.generate("e", [2], SamplingParams())))
    second.start()
    time.sleep(0.05)
    assert "b" not in out  # nothing starts while paused
    batcher.resume(7)
    second.join(5)
    first.join(5)
    assert out["a"].version == 0 and out["b"].version == 7
    batcher.close()


def test_rows_record_the_version_of_each_turn(tiny_model_path):
    from transformers import AutoTokenizer

    from roll.agentic.conversation import TokenRow
    from roll.agentic.rollout import _pad_rows

    row = TokenRow()
    row.add_context([5, 6])
    row.add_response([7, 8], [-0.1, -0.2], version=3)
    row.add_context([9])
    row.add_response([10], [-0.3], version=4)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    batch = _pad_rows([row, TokenRow([1], [0], [0.0], versions=[-1])], tok.pad_token_id)
    assert batch["policy_version"][0].tolist() == [-1, -1, 3, 3, -1, 4]
    assert batch["policy_version"][1].tolist() == [-1] * 6
    assert row_versions(batch).tolist()[0] == 3  # the row's oldest sampled token

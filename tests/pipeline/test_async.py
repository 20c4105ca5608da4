"""Asynchronous training end to end with the tiny model (slow; CI runs it): rollouts run ahead within
the staleness bound, validation overlaps the training rollout, resume never trains on rows sampled
before the checkpoint's weights, and the digits env is still learned."""

import pytest

from .helpers import run_recorded, tiny_config
from .learning import digits_config

pytestmark = pytest.mark.slow


run = run_recorded


def test_rollouts_run_ahead_within_the_bound_and_overlap_training(tiny_model_path, tmp_path):
    steps = run(tiny_config(tiny_model_path, tmp_path, "async_generation_ratio=1", "max_steps=4", "save_steps=0",
                            "eval_steps=0"))
    assert sorted(steps) == [0, 1, 2, 3]
    for s, m in steps.items():
        assert m["async/version"] == s
        assert 0 <= m["async/staleness_max"] <= 1 and m["async/dropped_rows"] == 0
    # the episodes of step s + 1 began before step s's actor update ended: generation overlapped training
    overlapped = [s for s in range(3) if steps[s + 1]["time/train_began_s"] < steps[s]["time/actor_train_ended_s"]]
    assert overlapped, {s: (steps[s]["time/train_began_s"], steps[s]["time/actor_train_ended_s"]) for s in steps}
    assert any(steps[s]["async/staleness_max"] == 1 for s in range(1, 4))  # some tokens came from the older weights


def test_validation_overlaps_the_training_rollout_and_changes_no_training_data(tiny_model_path, tmp_path):
    common = ("max_steps=2", "save_steps=0", "deterministic=true")
    with_val = run(tiny_config(tiny_model_path, tmp_path / "a", *common, "eval_steps=1"))
    without = run(tiny_config(tiny_model_path, tmp_path / "b", *common, "eval_steps=0"))
    m = with_val[0]
    assert m["time/val_began_s"] < m["time/train_ended_s"] and m["time/train_began_s"] < m["time/val_ended_s"]
    for s in (0, 1):
        for key in ("rollout/score", "tokens/step", "actor/pg_loss"):
            assert with_val[s][key] == without[s][key], (s, key)


def test_async_resume_trains_only_on_rows_of_the_resumed_weights_or_newer(tiny_model_path, tmp_path):
    first = run(tiny_config(tiny_model_path, tmp_path, "async_generation_ratio=1", "max_steps=2", "save_steps=1",
                            "eval_steps=0"))
    assert sorted(first) == [0, 1]
    resumed = run(tiny_config(tiny_model_path, tmp_path, "async_generation_ratio=1", "max_steps=4", "save_steps=1",
                              "eval_steps=0", "resume_from_checkpoint=true"))
    assert sorted(resumed) == [2, 3]
    # step 2's rows were all sampled after the resumed weights reached the inference side (version 2)
    assert resumed[2]["async/staleness_max"] == 0 and resumed[2]["async/version"] == 2
    assert resumed[3]["async/staleness_max"] <= 1


def test_digits_are_learned_with_rollouts_one_step_ahead(tiny_model_path, tmp_path):
    cfg = digits_config(tiny_model_path, tmp_path, 10, 1e-2, "seed=1", "async_generation_ratio=1",
                        "train_infer_correction.is_weight.enabled=true")
    steps = run(cfg)
    scores = [steps[s]["rollout/score"] for s in sorted(steps)]
    print("mean episode reward per step (async, ratio 1):", [round(x, 3) for x in scores])
    assert scores[0] < 0.15
    assert max(scores[-3:]) > scores[0] + 0.25

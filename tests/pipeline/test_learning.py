"""Learning, shown honestly: a tiny random-init model on the digits env (a random policy scores
~0.03) must raise its mean episode reward well above its first-step level within 10 steps."""

import pytest

from roll.agentic.pipeline import AgenticPipeline
from roll.utils.tracking import Tracker

from .learning import digits_config

pytestmark = pytest.mark.slow


class Recorder(Tracker):
    def __init__(self):
        self.scores = []

    def log(self, metrics, step):
        self.scores.append(metrics["rollout/score"])

    def close(self):
        pass


def test_mean_episode_reward_rises(tiny_model_path, tmp_path):
    cfg = digits_config(tiny_model_path, tmp_path, 10, 1e-2, "deterministic=true", "seed=1")
    pipeline = AgenticPipeline(cfg)
    pipeline.tracker = recorder = Recorder()
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    first, best_late = recorder.scores[0], max(recorder.scores[-3:])
    print("mean episode reward per step:", [round(s, 3) for s in recorder.scores])
    assert first < 0.15
    assert best_late > first + 0.25

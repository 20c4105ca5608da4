"""Learning, shown honestly: a tiny random-init model on the digits env (a random policy scores
~0.03) must raise its mean episode reward well above its first-step level within 10 steps."""

import pytest

from .helpers import run_recorded
from .learning import digits_config

pytestmark = pytest.mark.slow


def test_mean_episode_reward_rises(tiny_model_path, tmp_path):
    cfg = digits_config(tiny_model_path, tmp_path, 10, 1e-2, "deterministic=true", "seed=1")
    steps = run_recorded(cfg)
    scores = [steps[s]["rollout/score"] for s in sorted(steps)]
    first, best_late = scores[0], max(scores[-3:])
    print("mean episode reward per step:", [round(s, 3) for s in scores])
    assert first < 0.15
    assert best_late > first + 0.25

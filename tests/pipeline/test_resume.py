"""Kill-and-resume: a run SIGKILLed once step 1 is checkpointed, then resumed, produces the same
metrics for the following steps as an uninterrupted run with the same seed (CPU, deterministic mode)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from roll.configs.loading import load_config
from roll.utils.checkpoint import complete_checkpoints

from ..configs.conftest import REPO
from .helpers import run_recorded
from .learning import digits_overrides

pytestmark = pytest.mark.slow
COMPARED = ("rollout/score", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "critic/advantages_mean",
            "reward/score_mean", "tokens/step")


def run_in_process(overrides):
    steps = run_recorded(load_config("agentic_sokoban", overrides=overrides).config)
    return {step: {k: m[k] for k in COMPARED if k in m} for step, m in steps.items()}


def kill_after_step_one(overrides, out: str) -> int:
    """Start a run in its own process, SIGKILL it (driver and workers) once step 1 is checkpointed; the
    newest complete checkpoint's step."""
    proc = subprocess.Popen([sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban", *overrides],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and "step_000001" not in [p.name for p in complete_checkpoints(out)]:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and every worker it started
    proc.wait()
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
    return int(complete_checkpoints(out)[-1].name.split("_")[1])


def test_sigkill_after_step_one_then_resume_matches_an_uninterrupted_run(tiny_model_path, tmp_path):
    common = ["deterministic=true", "seed=3", "save_steps=1"]
    straight = run_in_process(digits_overrides(tiny_model_path, tmp_path / "a", 4, 1e-2, *common))

    resumed_dir = tmp_path / "b"
    overrides = digits_overrides(tiny_model_path, resumed_dir, 4, 1e-2, *common)
    latest = kill_after_step_one(overrides, str(resumed_dir / "out"))
    assert 1 <= latest < 3, f"killed after step {latest}: nothing left to resume"
    resumed = run_in_process(overrides + ["resume_from_checkpoint=true"])
    assert sorted(resumed) == list(range(latest + 1, 4))
    for step, metrics in resumed.items():
        for key, value in straight[step].items():
            assert metrics[key] == pytest.approx(value, abs=1e-6), (step, key)
    print(json.dumps({"killed_after": latest, "uninterrupted": straight, "resumed": resumed}))


def test_async_sigkill_then_resume_trains_no_row_from_before_the_checkpoint(tiny_model_path, tmp_path):
    """With rollouts one step ahead, a run killed mid-flight resumes on fresh rollouts: the first resumed step's
    rows were all sampled by the checkpoint's weights (staleness 0), later ones stay within the bound."""
    overrides = digits_overrides(tiny_model_path, tmp_path, 5, 1e-2, "seed=3", "save_steps=1", "async_generation_ratio=1",
                                 "train_infer_correction.is_weight.enabled=true")
    latest = kill_after_step_one(overrides, str(tmp_path / "out"))
    assert 1 <= latest < 4, f"killed after step {latest}: nothing left to resume"
    steps = run_recorded(load_config("agentic_sokoban", overrides=overrides + ["resume_from_checkpoint=true"]).config)
    assert sorted(steps) == list(range(latest + 1, 5))
    first = steps[latest + 1]
    assert first["async/version"] == latest + 1 and first["async/staleness_max"] == 0
    assert all(m["async/staleness_max"] <= 1 and m["async/dropped_rows"] == 0 for m in steps.values())
    assert all("actor/is_weight_mean" in m for m in steps.values())

"""A real run (tiny model) meets the faults a user or a machine brings (issue 29): Ctrl-C in the middle of a
step, and a checkpoint edited consistently with its manifest. Each ends in one line with its documented exit
status, leaves nothing half-written, and a resume afterwards continues exactly."""

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from roll.utils.checkpoint import complete_checkpoints, verify_checkpoint, write_manifest

from ..configs.conftest import REPO
from .learning import digits_overrides
from .test_resume import run_in_process

pytestmark = pytest.mark.slow
COMMON = ("deterministic=true", "seed=3", "save_steps=1")


def start(overrides):
    # An ignored SIGINT is inherited across exec, and something earlier in a test session (Ray) may have left it
    # ignored in this process: the run must get Ctrl-C as a terminal gives it.
    return subprocess.Popen([sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban",
                             *overrides], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def stop_ray():
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)


def test_ctrl_c_mid_step_is_one_line_exit_130_and_a_resume_continues_exactly(tiny_model_path, tmp_path):
    straight = run_in_process(digits_overrides(tiny_model_path, tmp_path / "a", 4, 1e-2, *COMMON))

    out = tmp_path / "b" / "out"
    overrides = digits_overrides(tiny_model_path, tmp_path / "b", 4, 1e-2, *COMMON)
    proc = start(overrides)
    deadline = time.time() + 600
    while time.time() < deadline and "step_000001" not in [p.name for p in complete_checkpoints(str(out))]:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.1)
    time.sleep(0.5)  # into step 2
    proc.send_signal(signal.SIGINT)  # the driver only, as a terminal's Ctrl-C reaches the foreground command
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        stop_ray()
    assert proc.returncode == 130, err[-3000:]
    assert len([line for line in err.splitlines() if line.startswith("interrupted: stopped at Ctrl-C")]) == 1, err[-3000:]
    assert "Traceback (most recent call last)" not in err, err[-3000:]
    assert not list((out / "checkpoints").glob("*.partial"))
    latest = int(complete_checkpoints(str(out))[-1].name.split("_")[1])

    resumed = run_in_process(overrides + ["resume_from_checkpoint=true"])
    assert sorted(resumed) == list(range(latest + 1, 4))
    for step, metrics in resumed.items():
        for key, value in straight[step].items():
            assert metrics[key] == pytest.approx(value, abs=1e-6), (step, key)


def test_weights_edited_consistently_with_the_manifest_stop_the_resume_in_one_line(tiny_model_path, tmp_path):
    overrides = digits_overrides(tiny_model_path, tmp_path, 1, 1e-2, *COMMON)
    run_in_process(overrides)
    (ckpt,) = complete_checkpoints(str(tmp_path / "out"))
    weights = max((p for p in (ckpt / "actor_train").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    weights.write_bytes(b"not a tensor file" * 100)
    write_manifest(ckpt, 0)  # the manifest agrees with the edit: only loading can tell
    proc = subprocess.run([sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban",
                           *overrides, "max_steps=2", "resume_from_checkpoint=true"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    stop_ray()
    # (Ray may still relay a worker's progress bar after the line: the line is found, not assumed last)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("checkpoint error: ")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"checkpoint error: {ckpt / 'actor_train'}: cannot be loaded: ")
    assert "Traceback (most recent call last)" not in proc.stderr
    assert json.loads((ckpt / "pipeline_state.json").read_text())["step"] == 0  # the checkpoint was left as it was


def test_ctrl_c_while_a_checkpoint_is_written_leaves_no_partial_folder(tmp_path):
    """SIGINT the moment a checkpoint folder appears (.partial): the write is abandoned and its folder removed;
    the complete checkpoints before it still verify. The model is wider than the tiny one (25M parameters)
    so that writing a checkpoint takes long enough to be caught in the middle."""
    from roll.models.tiny import build_tiny_model

    wide = build_tiny_model(tmp_path / "wide", hidden_size=512, num_layers=8, num_heads=8)
    out = tmp_path / "out"
    proc = start(digits_overrides(str(wide), tmp_path, 3, 1e-2, *COMMON))
    root = out / "checkpoints"
    deadline = time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None and not list(root.glob("*.partial")):
            time.sleep(0.002)
        caught = bool(list(root.glob("*.partial")))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        stop_ray()
    assert caught, "no checkpoint was being written"
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback (most recent call last)" not in err, err[-3000:]
    assert not list(root.glob("*.partial"))
    for ckpt in complete_checkpoints(str(out)):
        verify_checkpoint(ckpt)


def test_a_full_disk_is_one_line_and_leaves_no_partial_folder(tiny_model_path, tmp_path):
    """output_dir on a 1 MiB tmpfs: the first checkpoint does not fit."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    try:
        overrides = digits_overrides(tiny_model_path, tmp_path, 2, 1e-2, *COMMON, f"output_dir={disk}/out",
                                     f"logging_dir={tmp_path}/logs", f"tracker_kwargs.log_dir={tmp_path}/tb")
        proc = subprocess.run([sys.executable, "examples/start_agentic_pipeline.py", "--config_name", "agentic_sokoban",
                               *overrides], cwd=REPO, capture_output=True, text=True, timeout=600)
        stop_ray()
        errors = [line for line in proc.stderr.splitlines() if line.startswith("checkpoint error: writing ")]
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert len(errors) == 1 and re.search(r"failed with 0\.\d MiB free on its disk: ", errors[0]), proc.stderr[-3000:]
        assert "Traceback (most recent call last)" not in proc.stderr
        assert not list((disk / "out" / "checkpoints").glob("*.partial"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)

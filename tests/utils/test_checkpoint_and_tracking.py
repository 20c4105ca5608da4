import io
import json

import pytest

from roll.utils.checkpoint import (
    CheckpointWriteError,
    complete_checkpoints,
    latest_checkpoint,
    read_state,
    resolve_resume,
    save_checkpoint,
)
from roll.utils.tracking import StdoutTracker, make_tracker


def parts_ok(folder):
    (folder / "actor_train").mkdir()
    (folder / "actor_train" / "weights.bin").write_bytes(b"x")


def test_save_is_atomic_and_latest_is_found(tmp_path):
    out = str(tmp_path)
    save_checkpoint(out, 0, parts_ok, {"kl_coef": 0.1})
    save_checkpoint(out, 1, parts_ok, {"kl_coef": 0.2})

    def crash(folder):
        parts_ok(folder)
        raise RuntimeError("killed mid-save")

    with pytest.raises(CheckpointWriteError, match="killed mid-save"):
        save_checkpoint(out, 2, crash, {})
    assert [p.name for p in complete_checkpoints(out)] == ["step_000000", "step_000001"]  # the partial one is gone
    assert latest_checkpoint(out).name == "step_000001"
    assert read_state(resolve_resume(True, out)) == {"step": 1, "kl_coef": 0.2}
    save_checkpoint(out, 3, parts_ok, {}, keep=2)
    assert [p.name for p in complete_checkpoints(out)] == ["step_000001", "step_000003"]


def test_resume_options(tmp_path):
    assert resolve_resume(False, str(tmp_path)) is None
    assert resolve_resume(True, str(tmp_path)) is None  # nothing yet: start fresh
    from roll.utils.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="nope is not a folder"):
        resolve_resume(str(tmp_path / "nope"), str(tmp_path))


def test_trackers(tmp_path):
    stream = io.StringIO()
    StdoutTracker(stream).log({"a": 1.0, "bad": float("nan")}, 3)
    assert json.loads(stream.getvalue()) == {"step": 3, "a": 1.0}
    tb = make_tracker("tensorboard", {"log_dir": str(tmp_path / "tb")}, str(tmp_path), "x")
    tb.log({"rollout/score": 0.5}, 0)
    tb.close()
    assert any((tmp_path / "tb").iterdir())


def test_tensorboard_gets_an_episode_transcript_and_its_frames(tmp_path):
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from roll.agentic.render import filmstrip
    from roll.utils.tracking import make_tracker

    tracker = make_tracker("tensorboard", {"log_dir": str(tmp_path)}, str(tmp_path), "x")
    frames = [np.full((16, 16, 3), v, dtype=np.uint8) for v in (0, 100, 200)]
    tracker.log_episode("episode/SimpleSokoban", "turn 1: <answer>Up</answer>", filmstrip(frames), 3)
    tracker.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    image = acc.Images("episode/SimpleSokoban")[0]
    assert image.step == 3 and image.width == 3 * 16 + 2 * 4 and image.height == 16
    text = acc.Tensors("episode/SimpleSokoban/text_summary")[0]
    assert b"<answer>Up</answer>" in text.tensor_proto.string_val[0]


def _renamed_step(ckpt):
    ckpt.rename(ckpt.parent / "step_000007")


@pytest.mark.parametrize("damage, message", [
    (lambda c: (c / "actor_train" / "weights.bin").unlink(), "weights.bin: missing"),
    (lambda c: (c / "actor_train" / "weights.bin").write_bytes(b"garbage!"), "weights.bin: 8 bytes, the manifest says 1"),
    (lambda c: (c / "actor_train" / "weights.bin").write_bytes(b"y"), "weights.bin: contents differ"),
    (lambda c: (c / "pipeline_state.json").write_text("{broken"), "pipeline_state.json"),
    (lambda c: (c / "pipeline_state.json").unlink(), "pipeline_state.json: missing"),
    (lambda c: (c / "manifest.json").unlink(), "no manifest.json"),
    (_renamed_step, "the manifest says step 1, the folder name says 7"),
])
def test_every_checkpoint_corruption_is_named_before_anything_starts(tmp_path, capsys, damage, message):
    from roll.cli import main

    out = tmp_path / "run"
    save_checkpoint(str(out), 1, parts_ok, {"kl_coef": 0.1})
    damage(out / "checkpoints" / "step_000001")
    assert main(["--config_name", "agentic_sokoban", "--dry_run", f"output_dir={out}", "resume_from_checkpoint=true"]) == 2
    err = capsys.readouterr().err
    assert "config error: resume_from_checkpoint" in err and message in err, err


def test_a_state_file_that_disagrees_with_its_manifest_is_refused(tmp_path):
    from roll.utils.checkpoint import CheckpointError, write_manifest

    out = str(tmp_path)
    ckpt = save_checkpoint(out, 2, parts_ok, {})
    (ckpt / "pipeline_state.json").write_text(json.dumps({"step": 5}))
    write_manifest(ckpt, 2)  # a manifest rewritten over the edited state: the step still disagrees
    with pytest.raises(CheckpointError, match="step 5, the manifest says 2"):
        resolve_resume(True, out)


def _manifest(c, edit):
    path = c / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _consistent_state(c, edit):
    """Edit pipeline_state.json and rewrite the manifest over it, as a careful tamperer would."""
    from roll.utils.checkpoint import write_manifest

    path = c / "pipeline_state.json"
    state = json.loads(path.read_text())
    edit(state)
    path.write_text(json.dumps(state))
    write_manifest(c, 1)


@pytest.mark.parametrize("damage, message", [
    (lambda c: _manifest(c, lambda m: m.update(files=list(m["files"]))), "'files' must be a mapping"),
    (lambda c: _manifest(c, lambda m: m["files"].update({"pipeline_state.json": "abc"})), "must be {size: int"),
    (lambda c: _manifest(c, lambda m: m["files"].update({"../outside": {"size": 1, "sha256": "0" * 64}})),
     "points outside the checkpoint folder"),
    (lambda c: _manifest(c, lambda m: m["files"]["pipeline_state.json"].update(size="12")), "must be {size: int"),
    (lambda c: _consistent_state(c, lambda s: s.update(kl_coef="abc")), "kl_coef must be a number"),
    (lambda c: _consistent_state(c, lambda s: s.update(running=[1, 2])), "running must be dict"),
])
def test_a_manifest_of_the_wrong_shape_or_a_consistently_edited_state_is_one_line(tmp_path, capsys, damage, message):
    from roll.cli import main

    out = tmp_path / "run"
    save_checkpoint(str(out), 1, parts_ok, {"kl_coef": 0.1})
    damage(out / "checkpoints" / "step_000001")
    assert main(["--config_name", "agentic_sokoban", "--dry_run", f"output_dir={out}", "resume_from_checkpoint=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: resume_from_checkpoint") and message in err and "\n" not in err, err


@pytest.mark.parametrize("fault", [KeyboardInterrupt, lambda: OSError(28, "No space left on device")])
def test_a_checkpoint_write_that_fails_midway_leaves_nothing_half_written(tmp_path, fault):
    from roll.utils.checkpoint import complete_checkpoints, sweep_partial

    out = str(tmp_path)
    save_checkpoint(out, 0, parts_ok, {})

    def parts_then_fault(folder):
        parts_ok(folder)
        raise fault()

    from roll.utils.checkpoint import CheckpointWriteError

    with pytest.raises((KeyboardInterrupt, CheckpointWriteError)) as e:
        save_checkpoint(out, 1, parts_then_fault, {})
    if e.type is CheckpointWriteError:
        assert "step_000001 failed with" in str(e.value) and "No space left on device" in str(e.value)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_000000"]  # no step_000001.partial
    assert [p.name for p in complete_checkpoints(out)] == ["step_000000"]
    (root / "step_000002.partial").mkdir()  # what a SIGKILL mid-write leaves: swept at the next start
    assert [p.name for p in sweep_partial(out)] == ["step_000002.partial"] and not (root / "step_000002.partial").exists()

"""Atomic pipeline checkpoints: ``output_dir/checkpoints/step_000123``.

A checkpoint is written into ``step_000123.partial`` and renamed once every part (each role's
strategy state and ``pipeline_state.json``) is there, so a crash mid-save never leaves a folder
that looks complete. The last file written before the rename is ``manifest.json``: the step and
every file's size and SHA-256. ``verify_checkpoint`` checks a folder against it before a resume
starts anything, and names the first file that differs. ``latest_checkpoint`` finds the newest
complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE_FILE = "pipeline_state.json"
MANIFEST_FILE = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint folder that is incomplete, corrupted or not what its name says."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a role that failed to save); nothing of it was left."""


_NAME = re.compile(r"^step_(\d+)$")


def checkpoint_root(output_dir: str) -> Path:
    return Path(output_dir) / "checkpoints"


def save_checkpoint(output_dir: str, step: int, write_parts: Callable[[Path], None], state: dict[str, Any],
                    keep: int = 0) -> Path:
    """Write a checkpoint for ``step``: ``write_parts(folder)`` saves the roles' states, then the
    pipeline state is written and the folder is renamed into place. Keeps the newest ``keep``."""
    root = checkpoint_root(output_dir)
    final = root / f"step_{step:06d}"
    partial = root / f"step_{step:06d}.partial"
    sweep_partial(output_dir)
    partial.mkdir(parents=True)
    try:
        write_parts(partial)
        tmp_state = partial / (STATE_FILE + ".tmp")
        tmp_state.write_text(json.dumps({"step": step, **state}, indent=1))
        os.replace(tmp_state, partial / STATE_FILE)
        write_manifest(partial, step)
    except Exception as e:  # a full disk, a failing role: nothing half-written stays behind, and one line says why
        free = shutil.disk_usage(partial).free
        shutil.rmtree(partial, ignore_errors=True)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]  # a worker's error: its last line
        raise CheckpointWriteError(f"writing {final} failed with {free / 2**20:.1f} MiB free on its disk: "
                                   f"{lines[-1][:300] if lines else type(e).__name__}") from e
    except BaseException:  # Ctrl-C
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    if keep > 0:
        for old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def sweep_partial(output_dir: str) -> list[Path]:
    """Remove the unfinished checkpoint folders (``*.partial``) a killed run left; returns what was removed."""
    root = checkpoint_root(output_dir)
    found = sorted(root.glob("step_*.partial")) if root.is_dir() else []
    for folder in found:
        shutil.rmtree(folder, ignore_errors=True)
    return found


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: Path, step: int) -> None:
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE}
    tmp = folder / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
    os.replace(tmp, folder / MANIFEST_FILE)


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """The pipeline state of a checkpoint folder whose every file matches its manifest; CheckpointError
    naming the first problem otherwise."""
    match = _NAME.match(folder.name)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CheckpointError(f"{folder}: no {MANIFEST_FILE} (an incomplete checkpoint, or one written before manifests)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files, step = manifest["files"], int(manifest["step"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{manifest_path}: unreadable ({type(e).__name__}: {e})") from None
    _check_manifest_shape(manifest_path, files)
    if match is not None and int(match.group(1)) != step:
        raise CheckpointError(f"{folder}: the manifest says step {step}, the folder name says {int(match.group(1))}")
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        if path.stat().st_size != entry["size"]:
            raise CheckpointError(f"{path}: {path.stat().st_size} bytes, the manifest says {entry['size']}")
        if _sha256(path) != entry["sha256"]:
            raise CheckpointError(f"{path}: contents differ from the manifest (SHA-256)")
    if STATE_FILE not in files:
        raise CheckpointError(f"{folder}: the manifest lists no {STATE_FILE}")
    try:
        state = json.loads((folder / STATE_FILE).read_text())
    except ValueError as e:
        raise CheckpointError(f"{folder / STATE_FILE}: not valid JSON ({e})") from None
    if not isinstance(state, dict) or state.get("step") != step:
        got = state.get("step") if isinstance(state, dict) else state
        raise CheckpointError(f"{folder / STATE_FILE}: step {got!r}, the manifest says {step}")
    _check_state_shape(folder / STATE_FILE, state)
    return state


def _check_manifest_shape(path: Path, files: Any) -> None:
    """``files`` maps relative paths inside the folder to {size: int, sha256: 64 hex digits}."""
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: 'files' must be a mapping of file names, got {type(files).__name__}")
    for name, entry in files.items():
        parts = Path(str(name)).parts
        if not name or Path(str(name)).is_absolute() or ".." in parts:
            raise CheckpointError(f"{path}: file name {str(name)[:80]!r} points outside the checkpoint folder")
        if (not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or isinstance(entry.get("size"), bool)
                or not isinstance(entry.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])):
            raise CheckpointError(f"{path}: the entry of {str(name)[:80]!r} must be {{size: int, sha256: 64 hex digits}}")


def _check_state_shape(path: Path, state: dict[str, Any]) -> None:
    """The pipeline state's values have the types a resume reads (a consistent edit cannot smuggle others in)."""
    kinds = {"step": int, "version": int, "seed": int, "kl_coef": (int, float), "running": dict}
    for key, kind in kinds.items():
        value = state.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise CheckpointError(f"{path}: {key} must be {getattr(kind, '__name__', 'a number')}, got {value!r}"[:300])


def complete_checkpoints(output_dir: str) -> list[Path]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    # a final name is only ever given by the atomic rename; what is inside is checked by verify_checkpoint
    found = [p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(output_dir: str) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume(resume_from_checkpoint: bool | str, output_dir: str, verify: bool = True) -> Path | None:
    """``true``: the newest checkpoint in output_dir (None when there is none yet); a path: that
    checkpoint folder. Either way the folder must match its manifest (CheckpointError naming the first
    bad file otherwise): a damaged checkpoint is never skipped over or silently restarted from step 0."""
    if resume_from_checkpoint is False or resume_from_checkpoint in ("", None):
        return None
    if resume_from_checkpoint is True:
        path = latest_checkpoint(output_dir)
        if path is None:
            return None
    else:
        path = Path(str(resume_from_checkpoint)).expanduser()
        if not path.is_dir():
            raise CheckpointError(f"{path} is not a folder")
    if verify:
        verify_checkpoint(path)
    return path


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())

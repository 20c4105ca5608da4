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
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    write_parts(partial)
    tmp_state = partial / (STATE_FILE + ".tmp")
    tmp_state.write_text(json.dumps({"step": step, **state}, indent=1))
    os.replace(tmp_state, partial / STATE_FILE)
    write_manifest(partial, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    if keep > 0:
        for old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


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
    if state.get("step") != step:
        raise CheckpointError(f"{folder / STATE_FILE}: step {state.get('step')!r}, the manifest says {step}")
    return state


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

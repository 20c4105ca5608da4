"""Atomic pipeline checkpoints: ``output_dir/checkpoints/step_000123``.

A checkpoint is written into ``step_000123.partial`` and renamed once every part (each role's
strategy state and ``pipeline_state.json``) is there, so a crash mid-save never leaves a folder
that looks complete. ``latest_checkpoint`` finds the newest complete one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE_FILE = "pipeline_state.json"
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
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    if keep > 0:
        for old in complete_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(output_dir: str) -> list[Path]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(output_dir: str) -> Path | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume(resume_from_checkpoint: bool | str, output_dir: str) -> Path | None:
    """``true``: the newest complete checkpoint in output_dir (None when there is none yet);
    a path: that checkpoint, which must be complete."""
    if resume_from_checkpoint is False or resume_from_checkpoint in ("", None):
        return None
    if resume_from_checkpoint is True:
        return latest_checkpoint(output_dir)
    path = Path(str(resume_from_checkpoint))
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"resume_from_checkpoint: {path} is not a complete checkpoint (no {STATE_FILE})")
    return path


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())

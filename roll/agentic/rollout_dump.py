"""Rollouts kept on disk: readable dumps (``rollout_dump_dir``) and exact replays (``rollout_mock``).

- ``write_rows``: one JSON line per training row (text, masks, sampler log-probs, rewards, ids), one
  file per step and mode, for reading and analysis.
- ``save_rollout`` / ``load_rollout``: the whole rollout batch and its metrics, so a later run with
  ``rollout_mock.mode: mock`` trains on exactly the same data without running envs or sampling.

Files are written to a temporary name and renamed, so a crash never leaves half a file behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll.distributed.batch import Batch

FORMAT_VERSION = 1


def step_file(folder: str | os.PathLike[str], mode: str, step: int, suffix: str) -> Path:
    return Path(folder).expanduser() / mode / f"step_{step:06d}{suffix}"


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    return value


def write_rows(folder: str | os.PathLike[str], mode: str, step: int, batch: Batch, decode: Any) -> Path:
    """One JSON line per row of ``batch``: its text, the response text, masks, sampler log-probs and every
    per-row field (tags, env id, group, scores). ``decode`` turns token ids into text."""
    path = step_file(folder, mode, step, ".jsonl")
    mask = batch["attention_mask"].bool()
    lines = []
    for i in range(len(batch)):
        ids = batch["input_ids"][i][mask[i]].tolist()
        response = batch["response_mask"][i][mask[i]].tolist()
        row: dict[str, Any] = {"step": step, "mode": mode, "row": i, "text": decode(ids),
                               "response_text": decode([t for t, r in zip(ids, response) if r]),
                               "input_ids": ids, "response_mask": response}
        if "infer_logprobs" in batch:
            row["infer_logprobs"] = [round(float(x), 6) for x in batch["infer_logprobs"][i][mask[i]].tolist()]
        for key, value in batch.tensors.items():
            if key not in row and value.dim() == 1:
                row[key] = value[i].item()
            elif key == "turn_rewards":
                row[key] = value[i].tolist()
        for key, values in batch.non_tensors.items():
            row[key] = _plain(values[i])
        lines.append(json.dumps(row, ensure_ascii=False))
    _atomic_write(path, lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"))
    return path


def save_rollout(folder: str | os.PathLike[str], mode: str, step: int, batch: Batch, metrics: dict[str, float]) -> Path:
    """The rollout batch (all fields) and its metrics, for ``load_rollout``."""
    path = step_file(folder, mode, step, ".pt")
    payload = {"version": FORMAT_VERSION, "step": step, "mode": mode, "tensors": batch.tensors,
               "non_tensors": {k: _plain(v) for k, v in batch.non_tensors.items()}, "meta": dict(batch.meta),
               "metrics": dict(metrics)}
    _atomic_write(path, lambda tmp: torch.save(payload, tmp))
    return path


def load_rollout(folder: str | os.PathLike[str], mode: str, step: int) -> tuple[Batch, dict[str, float]]:
    """The batch and metrics ``save_rollout`` wrote for ``mode`` at ``step``; FileNotFoundError names the file."""
    path = step_file(folder, mode, step, ".pt")
    if not path.is_file():
        raise FileNotFoundError(f"rollout_mock: no dump for {mode} step {step} ({path}); dump it first with "
                                "rollout_mock.mode: dump")
    # our own file (lists and tensors), written by save_rollout
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("version") != FORMAT_VERSION:
        raise ValueError(f"rollout_mock: {path} has format version {payload.get('version')}, expected {FORMAT_VERSION}")
    return Batch(payload["tensors"], payload["non_tensors"], payload["meta"]), payload["metrics"]


def dumped_steps(folder: str | os.PathLike[str], mode: str) -> list[int]:
    """The steps that have a ``save_rollout`` file for ``mode``."""
    root = Path(folder).expanduser() / mode
    return sorted(int(p.stem.split("_")[1]) for p in root.glob("step_*.pt")) if root.is_dir() else []

"""Rendered trajectories for people: a text transcript per episode and, where the env draws
pictures (Sokoban), one PNG per state, the episode as an animated GIF and as a filmstrip (one
image with every state side by side, which TensorBoard shows beside the curves). Images go
through Pillow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

GIF_FRAME_MS = 600


def write_png(path: Path, rgb: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.asarray(rgb, dtype=np.uint8)).save(path)


def write_gif(path: Path, frames: list[np.ndarray], frame_ms: int = GIF_FRAME_MS) -> None:
    from PIL import Image

    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=frame_ms, loop=0)


def filmstrip(frames: list[np.ndarray], gap: int = 4) -> np.ndarray:
    """Every frame left to right, separated by white columns: [H, W, 3] uint8."""
    height = max(f.shape[0] for f in frames)
    parts = []
    for i, f in enumerate(frames):
        padded = np.full((height, f.shape[1], 3), 255, dtype=np.uint8)
        padded[: f.shape[0]] = f
        parts.append(padded)
        if i + 1 < len(frames):
            parts.append(np.full((height, gap, 3), 255, dtype=np.uint8))
    return np.concatenate(parts, axis=1)


def transcript(name: str, messages: list[dict[str, Any]], rewards: list[float], metrics: dict[str, float]) -> str:
    lines = [f"# {name}", f"score: {sum(rewards):.3f}  rewards per turn: {[round(r, 3) for r in rewards]}",
             f"metrics: {json.dumps({k: round(v, 4) for k, v in metrics.items()})}", ""]
    for m in messages:
        lines += [f"--- {m['role']} ---", str(m["content"]), ""]
    return "\n".join(lines)


def write_trajectory(folder: Path, name: str, messages: list[dict[str, Any]], rewards: list[float],
                     metrics: dict[str, float], frames: list[np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.txt"
    path.write_text(transcript(name, messages, rewards, metrics))
    for i, frame in enumerate(frames):
        write_png(folder / f"{name}_frame{i:02d}.png", frame)
    if frames:
        write_gif(folder / f"{name}.gif", frames)
    return path

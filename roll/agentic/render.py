"""Rendered trajectories for people: a text transcript per episode and, where the env draws
pictures (Sokoban), one PNG per state. PNGs are written with zlib, no imaging library needed."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np


def write_png(path: Path, rgb: np.ndarray) -> None:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[r].astype(np.uint8).tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def write_trajectory(folder: Path, name: str, messages: list[dict[str, Any]], rewards: list[float],
                     metrics: dict[str, float], frames: list[np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"# {name}", f"score: {sum(rewards):.3f}  rewards per turn: {[round(r, 3) for r in rewards]}",
             f"metrics: {json.dumps({k: round(v, 4) for k, v in metrics.items()})}", ""]
    for m in messages:
        lines += [f"--- {m['role']} ---", str(m["content"]), ""]
    path = folder / f"{name}.txt"
    path.write_text("\n".join(lines))
    for i, frame in enumerate(frames):
        write_png(folder / f"{name}_frame{i:02d}.png", frame)
    return path

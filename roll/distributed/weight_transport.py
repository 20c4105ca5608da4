"""Moving weights from a training worker to inference workers on the same node.

A persistent shared-memory buffer (``/dev/shm``) holds the model's bytes: the sender copies each
bucket into it and the receivers copy from it straight into their parameters. The buffer is
allocated once and reused every sync; fresh memory is what costs (first-touch page faults run
at a fraction of memcpy speed here), so reuse is the point. Workers on other nodes get the
buckets through Ray's object store instead.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import torch

_TORCH_TO_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16, torch.float64: np.float64}


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str  # torch dtype name


class SharedWeightsSender:
    """Owns the buffer (the training worker): writes buckets, unlinks the buffer at exit."""

    def __init__(self) -> None:
        self.shm: shared_memory.SharedMemory | None = None
        self.offsets: dict[str, int] = {}
        atexit.register(self.close)

    def prepare(self, sizes: list[tuple[str, int]]) -> str:
        """Lay out every tensor (name, bytes) once; reuse the buffer while the layout holds."""
        total, offsets = 0, {}
        for name, nbytes in sizes:
            offsets[name] = total
            total += (nbytes + 63) // 64 * 64  # 64-byte aligned slots
        if self.shm is None or self.offsets != offsets:
            self.close()
            self.shm = shared_memory.SharedMemory(create=True, size=max(total, 1))
            self.offsets = offsets
        return self.shm.name

    def write(self, bucket: list[tuple[str, torch.Tensor]]) -> list[Slot]:
        assert self.shm is not None, "prepare() first"
        slots = []
        for name, t in bucket:
            t = t.detach().cpu().contiguous()
            offset = self.offsets[name]
            src = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
            dst = np.ndarray(src.shape, dtype=_TORCH_TO_NP[t.dtype], buffer=self.shm.buf, offset=offset)
            np.copyto(dst, src.numpy())
            slots.append(Slot(name, offset, tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        return slots

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm.unlink()
            self.shm = None


class SharedWeightsReceiver:
    """Attaches to a sender's buffer (an inference worker) and hands out tensor views of it."""

    def __init__(self) -> None:
        self.shm: shared_memory.SharedMemory | None = None

    def views(self, buffer_name: str, slots: list[Slot]) -> list[tuple[str, torch.Tensor]]:
        if self.shm is None or self.shm.name != buffer_name:
            if self.shm is not None:
                self.shm.close()
            self.shm = shared_memory.SharedMemory(name=buffer_name)
            _untrack(self.shm)
        out = []
        for s in slots:
            dtype = getattr(torch, s.dtype)
            arr = np.ndarray(s.shape, dtype=_TORCH_TO_NP[dtype], buffer=self.shm.buf, offset=s.offset)
            t = torch.from_numpy(arr)
            out.append((s.name, t.view(torch.bfloat16) if dtype == torch.bfloat16 else t))
        return out


def _untrack(shm: shared_memory.SharedMemory) -> None:
    """Only the sender owns the buffer: stop this process's resource tracker from unlinking it."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - tracking is best effort; the sender unlinks anyway
        pass

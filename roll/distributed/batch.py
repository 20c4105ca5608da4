"""Batch: per-row tensors + per-row non-tensor values + batch-level meta.

Rows are the unit everything splits on: data-parallel dispatch splits a batch into balanced
chunks (by token count) and gathers results back in the original row order. Pickling turns
tensors into numpy arrays so Ray moves them through its object store without extra copies
(numpy buffers travel out of band and come back zero-copy).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ORDER_KEY = "_row_order"  # meta key holding the original row indices of a split chunk
PADDING_ROW = -1  # the order index of a padding row (see split_equal)


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)  # object arrays, one entry per row
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensors = {k: _object_array(v) for k, v in self.non_tensors.items()}
        sizes = {k: len(v) for k, v in self.tensors.items()} | {k: len(v) for k, v in self.non_tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch fields disagree on the number of rows: {sizes}")

    # --- basics
    def __len__(self) -> int:
        for v in self.tensors.values():
            return len(v)
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.non_tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def to(self, device: torch.device | str) -> Batch:
        """The same rows with every tensor on ``device`` (a GPU strategy's loss sees one device)."""
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.non_tensors), dict(self.meta))

    # --- row operations
    def select(self, rows: Sequence[int] | torch.Tensor | np.ndarray) -> Batch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        np_idx = idx.numpy()
        return Batch(
            {k: v[idx] for k, v in self.tensors.items()},
            {k: v[np_idx] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        batches = [b for b in batches if len(b) or b.keys()]
        if not batches:
            return Batch()
        keys = set(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != keys:
                raise ValueError(f"cannot concatenate batches with different fields: {sorted(keys ^ set(b.keys()))}")
        tensors = {k: _cat([b.tensors[k] for b in batches]) for k in batches[0].tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in batches[0].non_tensors}
        meta = {k: v for k, v in batches[0].meta.items() if k != ORDER_KEY}
        return Batch(tensors, non_tensors, meta)

    def union(self, other: Batch) -> Batch:
        """Add ``other``'s fields to the same rows; a field present in both must be equal."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"union of batches with {len(self)} and {len(other)} rows")
        tensors, non_tensors = dict(self.tensors), dict(self.non_tensors)
        for k, v in other.tensors.items():
            if k in tensors and not torch.equal(tensors[k], v):
                raise ValueError(f"union: field {k!r} differs between the batches")
            tensors[k] = v
        for k, v in other.non_tensors.items():
            if k in non_tensors and not np.array_equal(non_tensors[k], v):
                raise ValueError(f"union: field {k!r} differs between the batches")
            non_tensors[k] = v
        return Batch(tensors, non_tensors, {**self.meta, **other.meta})

    def __or__(self, other: Batch) -> Batch:
        return self.union(other)

    def chunk(self, n: int) -> list[Batch]:
        """``n`` contiguous chunks of (nearly) equal row counts."""
        return [self.select(part) for part in np.array_split(np.arange(len(self)), n)]

    def split(self, n: int, weight_key: str | None = "attention_mask") -> list[Batch]:
        """``n`` chunks with equal row counts (+-1) and balanced token counts; each chunk records its
        original rows in ``meta['_row_order']`` so ``gather`` restores the order."""
        if n < 1:
            raise ValueError(f"cannot split into {n} chunks")
        weights = self.tensors[weight_key].sum(-1).tolist() if weight_key in self.tensors else [1] * len(self)
        parts = balanced_partition(weights, n)
        chunks = []
        for part in parts:
            chunk = self.select(part)
            chunk.meta[ORDER_KEY] = list(part)
            chunks.append(chunk)
        return chunks

    def split_equal(self, n: int) -> list[Batch]:
        """``split`` into ``n`` chunks of exactly equal row counts: the shorter chunks get copies of a
        row that carry ``response_mask`` 0 (no loss, no token count) and are dropped by ``gather``.
        Data-parallel ranks then run the same number of micro-batches and optimizer steps, so their
        collectives always meet."""
        chunks = self.split(n)
        rows = max((len(c) for c in chunks), default=0)
        if all(len(c) == rows for c in chunks):
            return chunks
        base = self if "response_mask" in self else self | Batch({"response_mask": self.tensors["attention_mask"].clone()})
        filler = base.select([0])
        filler.tensors["response_mask"] = torch.zeros_like(filler.tensors["response_mask"])
        out = []
        for chunk in base.split(n):  # the same partition as above: it depends on the token counts only
            missing = rows - len(chunk)
            if missing:
                order = [*chunk.meta[ORDER_KEY], *([PADDING_ROW] * missing)]
                chunk = Batch.concat([chunk] + [filler] * missing)
                chunk.meta[ORDER_KEY] = order
            out.append(chunk)
        return out

    @staticmethod
    def gather(chunks: Sequence[Batch]) -> Batch:
        """Concatenate chunks from ``split`` back into the original row order (padding rows dropped)."""
        order = [i for c in chunks for i in c.meta.get(ORDER_KEY, [])]
        merged = Batch.concat(chunks)
        if len(order) != len(merged):
            return merged  # chunks were not made by split: keep their order
        order_arr = np.asarray(order, dtype=np.int64)
        real = np.nonzero(order_arr != PADDING_ROW)[0]
        inverse = np.empty(len(real), dtype=np.int64)
        inverse[order_arr[real]] = real
        return merged.select(inverse)

    def group_by(self, key: str) -> dict[Hashable, Batch]:
        values = self.non_tensors[key] if key in self.non_tensors else self.tensors[key].tolist()
        groups: dict[Hashable, list[int]] = {}
        for i, v in enumerate(values):
            groups.setdefault(v if isinstance(v, Hashable) else repr(v), []).append(i)
        return {k: self.select(rows) for k, rows in groups.items()}

    # --- transport
    def __reduce__(self):
        packed = {k: tensor_to_numpy(v) for k, v in self.tensors.items()}
        return (_rebuild, (packed, self.non_tensors, self.meta))


def balanced_partition(weights: Sequence[float], n: int) -> list[list[int]]:
    """Split row indices into ``n`` parts of equal size (+-1) with balanced weight sums (greedy:
    heaviest rows first, each to the lightest part that still has room)."""
    size = len(weights)
    capacity = [size // n + (1 if i < size % n else 0) for i in range(n)]
    parts: list[list[int]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for i in sorted(range(size), key=lambda j: -weights[j]):
        open_parts = [p for p in range(n) if len(parts[p]) < capacity[p]]
        target = min(open_parts, key=lambda p: (loads[p], p))
        parts[target].append(i)
        loads[target] += weights[i]
    return [sorted(p) for p in parts]


def _object_array(values: Iterable[Any]) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    values = list(values)
    out = np.empty(len(values), dtype=object)
    out[:] = values  # element-wise, so tuples/lists stay single objects per row
    return out


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate along rows, right-padding dim 1 when sequence lengths differ."""
    if tensors[0].dim() >= 2 and len({t.shape[1] for t in tensors}) > 1:
        width = max(t.shape[1] for t in tensors)
        tensors = [torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in tensors]
    return torch.cat(tensors)


def tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A numpy view of a tensor for out-of-band transport, plus a tag (bf16 travels as int16 bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ship the bits
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), ""


def numpy_to_tensor(arr: np.ndarray, tag: str) -> torch.Tensor:
    """Inverse of ``tensor_to_numpy``; a read-only buffer (Ray's object store) is copied."""
    t = torch.from_numpy(arr) if arr.flags.writeable else torch.from_numpy(arr.copy())
    return t.view(torch.bfloat16) if tag == "bfloat16" else t


def _rebuild(packed: dict[str, tuple[np.ndarray, str]], non_tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> Batch:
    return Batch({k: numpy_to_tensor(arr, tag) for k, (arr, tag) in packed.items()}, non_tensors, meta)

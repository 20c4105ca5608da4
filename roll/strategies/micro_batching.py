"""Micro-batches cut by token count (ROLL's dynamic batching).

Rows of similar length go together and each micro-batch is padded only to its own longest row
(rounded up to a multiple), so short rows stop paying for the longest row of the batch. Losses
are normalised by global counts, so how rows are grouped changes neither the loss nor the
gradients, only speed and memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roll.distributed.batch import Batch


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def token_budget_groups(lengths: Sequence[int], max_tokens: int, round_to: int = 1) -> list[list[int]]:
    """Row indices grouped so that rows x (longest row, rounded up to ``round_to``) stays within
    ``max_tokens`` per group. Longest rows first, each group filled greedily; a row longer than the
    budget gets a group of its own."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    width = 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * width <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
            width = round_up(max(lengths[i], 1), round_to)
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` split (largest first, in halves) into exactly ``count`` groups; when there are fewer
    rows than ``count``, empty groups fill up (data-parallel ranks must run as many micro-batches)."""
    if len(groups) > count:
        raise ValueError(f"cannot merge {len(groups)} groups into {count}")
    groups = [list(g) for g in groups]
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda j: len(groups[j])) if groups else None
        if largest is None or len(groups[largest]) < 2:
            groups.append([])
            continue
        g = groups.pop(largest)
        groups[largest:largest] = [g[: len(g) // 2], g[len(g) // 2:]]
    return groups


def trimmed(batch: Batch, round_to: int = 1) -> Batch:
    """``batch`` with every [rows, T] field cut to the longest row (right padding), rounded up."""
    if len(batch) == 0 or "attention_mask" not in batch:
        return batch
    mask = batch["attention_mask"]
    full = mask.shape[1]
    used = int(mask.sum(-1).max()) if mask.numel() else 0
    width = min(full, round_up(max(used, 1), round_to))
    if width == full:
        return batch
    tensors = {k: (v[:, :width] if v.dim() >= 2 and v.shape[1] == full else v) for k, v in batch.tensors.items()}
    return Batch(tensors, batch.non_tensors, batch.meta)


def empty_like_row(batch: Batch) -> Batch:
    """One copy of the first row with nothing to learn from (zero loss masks): a placeholder micro-batch."""
    row = batch.select([0])
    tensors = dict(row.tensors)
    for key in ("response_mask",):
        if key in tensors:
            tensors[key] = torch.zeros_like(tensors[key])
    return Batch(tensors, row.non_tensors, row.meta)


def dynamic_micro_batches(batch: Batch, max_tokens: int, round_to: int, count: int | None = None) -> tuple[list[Batch], list[list[int]]]:
    """(micro-batches, the rows of each) by token budget; with ``count``, exactly that many (see split_to).
    A placeholder micro-batch (``empty_like_row``) stands for an empty group."""
    groups = budget_groups(batch, max_tokens, round_to)
    if count is not None:
        groups = split_to(groups, count)
    return micro_batches_of(batch, groups, round_to), groups


def budget_groups(batch: Batch, max_tokens: int, round_to: int) -> list[list[int]]:
    """``token_budget_groups`` of the batch's rows (their lengths from the attention mask)."""
    return token_budget_groups(batch["attention_mask"].sum(-1).tolist(), max_tokens, round_to)


def micro_batches_of(batch: Batch, groups: list[list[int]], round_to: int) -> list[Batch]:
    """The rows of each group, trimmed; a placeholder micro-batch (``empty_like_row``) for an empty group."""
    return [trimmed(batch.select(g), round_to) if g else empty_like_row(batch) for g in groups]


def scatter_rows(parts: Sequence[torch.Tensor], groups: Sequence[Sequence[int]], rows: int, width: int) -> torch.Tensor:
    """Per-group [len(group), w] results back into one [rows, width] tensor in the original row order
    (zero beyond each part's width)."""
    ref = next((p for p, g in zip(parts, groups) if g), None)
    out = torch.zeros((rows, width), dtype=ref.dtype if ref is not None else torch.float32)
    for part, group in zip(parts, groups):
        if group:
            out[torch.as_tensor(list(group)), : part.shape[1]] = part.to(out.dtype)
    return out

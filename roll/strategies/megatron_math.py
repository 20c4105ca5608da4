"""Pure tensor helpers of the megatron strategy (no megatron import; checked on CPU).

- Rows are right-aligned (real tokens first) so a plain causal mask is exact for them.
- Context parallel: each rank takes two of 2 x CP sequence chunks (r and 2CP-1-r), which balances
  the causal attention work; labels are taken before the split.
- Log-probs and entropy from vocabulary-parallel logits: each tensor-parallel rank holds a slice of
  the vocabulary; the softmax sums are all-reduced with a differentiable all-reduce. Rows of the
  padded vocabulary (beyond the tokenizer's size) are excluded, so the result equals the HF model's.
"""

from __future__ import annotations

from typing import Any

import torch

NEG = -1e9  # a finite "minus infinity": exp() is 0 and 0 * NEG stays 0 (no NaN in the entropy)


def right_align(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids with each row's attended tokens moved to the front, order) where order[i, j] is the
    original position of the token now at j."""
    keys = (~mask.bool()).long() * ids.shape[1] + torch.arange(ids.shape[1])  # stable: attended first, in order
    order = keys.argsort(dim=1)
    return ids.gather(1, order), order


def restore(values: torch.Tensor, order: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Inverse of right_align for per-token outputs; positions that were padding get 0."""
    return torch.zeros_like(values).scatter(1, order, values) * mask.to(values.dtype)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def cp_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Positions a context-parallel rank holds: chunks cp_rank and 2cp-1-cp_rank of 2cp equal chunks."""
    if cp == 1:
        return torch.arange(seq_len)
    if seq_len % (2 * cp):
        raise ValueError(f"sequence length {seq_len} must be a multiple of 2 x context_parallel_size = {2 * cp}")
    size = seq_len // (2 * cp)
    first, second = cp_rank * size, (2 * cp - 1 - cp_rank) * size
    return torch.cat([torch.arange(first, first + size), torch.arange(second, second + size)])


class _AllReduceSum(torch.autograd.Function):
    """Sum over a process group in forward; identity in backward (each rank's slice owns its grads)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.clone()
        if group is not None and torch.distributed.get_world_size(group) > 1:
            torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _sum(x: torch.Tensor, group: Any) -> torch.Tensor:
    return _AllReduceSum.apply(x, group)


def vocab_parallel_logprobs(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, vocab_size: int,
                            group: Any = None, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(label) and (optionally) the entropy, from this rank's vocabulary slice of the logits
    [..., V_local] covering global ids [vocab_start, vocab_start + V_local). Differentiable."""
    logits = logits.float()
    local = logits.shape[-1]
    ids = torch.arange(vocab_start, vocab_start + local, device=logits.device)
    logits = logits.masked_fill(ids >= vocab_size, NEG)  # padded vocabulary rows never score
    m = logits.detach().max(dim=-1, keepdim=True).values
    if group is not None and torch.distributed.get_world_size(group) > 1:
        torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=group)
    z = logits - m
    e = z.exp()
    log_total = _sum(e.sum(dim=-1, keepdim=True), group).log()
    owned = (labels >= vocab_start) & (labels < vocab_start + local)
    local_label = (labels - vocab_start).clamp(0, local - 1)
    picked = torch.where(owned, z.gather(-1, local_label.unsqueeze(-1)).squeeze(-1), torch.zeros_like(labels, dtype=z.dtype))
    logprob = _sum(picked, group) - log_total.squeeze(-1)
    if not with_entropy:
        return logprob, None
    expected_z = _sum((e * z).sum(dim=-1, keepdim=True), group) / log_total.exp()
    return logprob, (log_total - expected_z).squeeze(-1)


class _GatherPositions(torch.autograd.Function):
    """Context parallel: every rank's per-position values [B, t_local] -> the whole sequence
    [B, T] on every rank. Backward hands each rank the gradient of its own positions, so the
    loss computed on the full sequence (identically on each rank) trains each rank's slice once."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, positions: torch.Tensor, seq_len: int, group: Any) -> torch.Tensor:
        world = torch.distributed.get_world_size(group)
        parts = [torch.empty_like(local) for _ in range(world)]
        torch.distributed.all_gather(parts, local.contiguous(), group=group)
        full = local.new_zeros(local.shape[0], seq_len)
        for r, part in enumerate(parts):
            full[:, cp_positions(seq_len, world, r).to(local.device)] = part
        ctx.save_for_backward(positions)
        return full

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (positions,) = ctx.saved_tensors
        return grad[:, positions], None, None, None


def gather_positions(local: torch.Tensor, positions: torch.Tensor, seq_len: int, group: Any = None) -> torch.Tensor:
    """[B, T] from each context-parallel rank's [B, t_local] (identity without context parallel)."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return local
    return _GatherPositions.apply(local, positions, seq_len, group)

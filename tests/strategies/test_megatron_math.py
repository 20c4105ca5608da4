"""The megatron strategy's tensor helpers: alignment, context-parallel split, vocab-parallel log-probs."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from roll.models.logprobs import shifted_entropy, shifted_token_logprobs
from roll.strategies.megatron_math import (
    cp_positions,
    restore,
    right_align,
    round_up,
    vocab_parallel_logprobs,
)


def test_right_align_and_restore() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    aligned, order = right_align(ids, mask)
    assert aligned[0, :3].tolist() == [5, 6, 7] and aligned[1, :3].tolist() == [1, 2, 3]
    values = aligned.float() * 10
    back = restore(values, order, mask)
    assert back.tolist() == [[0, 0, 50, 60, 70], [10, 20, 30, 0, 0]]
    assert round_up(10, 4) == 12 and round_up(12, 4) == 12


def test_context_parallel_positions_balance_the_causal_work() -> None:
    # 8 tokens, CP 2: chunks of 2; rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2
    assert cp_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert sorted(torch.cat([cp_positions(12, 3, r) for r in range(3)]).tolist()) == list(range(12))
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel_size = 4"):
        cp_positions(10, 2, 0)


def _reference(logits: torch.Tensor, labels: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    real = logits[..., :vocab]
    lp = torch.log_softmax(real.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    p = torch.softmax(real.float(), -1)
    return lp, -(p * torch.log_softmax(real.float(), -1)).sum(-1)


def test_single_rank_matches_log_softmax_and_ignores_padded_vocab() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 16, requires_grad=True)
    labels = torch.randint(0, 13, (2, 5))
    lp, ent = vocab_parallel_logprobs(logits, labels, 0, 13, with_entropy=True)
    ref_lp, ref_ent = _reference(logits, labels, 13)
    assert torch.allclose(lp, ref_lp, atol=1e-6) and torch.allclose(ent, ref_ent, atol=1e-6)
    # same values as the shared HF implementation on a shifted sequence
    seq = torch.randint(0, 13, (2, 6))
    full = torch.randn(2, 6, 13)
    lp2, ent2 = vocab_parallel_logprobs(full[:, :-1], seq[:, 1:], 0, 13, with_entropy=True)
    assert torch.allclose(lp2, shifted_token_logprobs(full, seq)[:, 1:], atol=1e-6)
    assert torch.allclose(ent2, shifted_entropy(full)[:, 1:], atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert torch.all(logits.grad[..., 13:] == 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, logits: torch.Tensor, labels: torch.Tensor, vocab: int, queue: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    half = logits.shape[-1] // 2
    shard = logits[..., rank * half:(rank + 1) * half].clone().requires_grad_(True)
    lp, ent = vocab_parallel_logprobs(shard, labels, rank * half, vocab, torch.distributed.group.WORLD, with_entropy=True)
    (lp.sum() + 0.5 * ent.sum()).backward()
    # numpy pickles by value: torch tensors would travel as shared memory that dies with this process
    queue.put((rank, lp.detach().numpy(), ent.detach().numpy(), shard.grad.numpy()))
    torch.distributed.destroy_process_group()


def test_two_tensor_parallel_ranks_equal_one_full_vocab() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 16)
    labels = torch.randint(0, 14, (3, 4))
    labels[0, 0], labels[1, 1] = 2, 12  # labels on both halves of the vocabulary
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, logits, labels, 14, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=120) for _ in range(2)), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=60)
    full = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = _reference(full, labels, 14)
    (ref_lp.sum() + 0.5 * ref_ent.sum()).backward()
    for rank, lp, ent, grad in results:
        lp, ent, grad = torch.from_numpy(lp), torch.from_numpy(ent), torch.from_numpy(grad)
        assert torch.allclose(lp, ref_lp.detach(), atol=1e-5)
        assert torch.allclose(ent, ref_ent.detach(), atol=1e-5)
        assert torch.allclose(grad, full.grad[..., rank * 8:(rank + 1) * 8], atol=1e-5)

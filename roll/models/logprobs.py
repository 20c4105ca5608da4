"""Token log-probs and entropies from a causal LM: the one implementation every backend uses.

Row convention: ``logprobs[:, t]`` is log p(x_t | x_<t) for t >= 1 (0 at t = 0), aligned with
``input_ids`` and ``response_mask``; computed in fp32. Values follow the same convention: the value
used at t is V(x_<t), read from the hidden state of position t - 1, so it never sees token t.
"""

from __future__ import annotations

import torch


def shifted_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] log-probs of ``input_ids`` under ``logits`` [B, T, V] (position t predicted at t-1)."""
    logits = logits[:, :-1].float()
    chosen = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    lp = chosen - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(lp, (1, 0))


def shifted_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[B, T] entropy of the distribution that predicts each position (0 at t = 0)."""
    logits = logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))


def values_before_tokens(per_position: torch.Tensor) -> torch.Tensor:
    """[B, T] values aligned with the tokens they judge: entry t is the head's output at position
    t - 1 (the state before token t); t = 0 has no state before it and gets 0."""
    return torch.nn.functional.pad(per_position[:, :-1], (1, 0))


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens (left or right padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def forward_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     position_ids: torch.Tensor | None = None, micro_batch_size: int = 8) -> torch.Tensor:
    """Log-probs of whole rows, computed ``micro_batch_size`` rows at a time."""
    out = []
    for start in range(0, input_ids.shape[0], micro_batch_size):
        sl = slice(start, start + micro_batch_size)
        pos = position_ids[sl] if position_ids is not None else position_ids_from_mask(attention_mask[sl])
        logits = model(input_ids=input_ids[sl], attention_mask=attention_mask[sl], position_ids=pos).logits
        out.append(shifted_token_logprobs(logits, input_ids[sl]))
    return torch.cat(out) if out else torch.zeros(input_ids.shape, dtype=torch.float32)

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


# Model types whose logits are exactly output_embeddings(final hidden state): no logit scale or soft-capping
# after the head, so the head may run on pieces of the sequence.
PLAIN_HEAD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
CHUNK_TOKENS = 256  # positions whose fp32 logits exist at once (256 x 49,152 x 4 B = 48 MiB for SmolLM2)
# Chunking recomputes the head in the backward pass (SmolLM2 at 2 x 640 tokens: 0.90x the speed, 0.1-0.5 GB
# less memory, scripts/bench/train_step.py --logits); it pays where whole logits are big, past this size.
CHUNK_ABOVE_BYTES = 1 << 30


def chunking_pays(tokens: int, vocab_size: int, above: int = CHUNK_ABOVE_BYTES) -> bool:
    """Whether a micro-batch of ``tokens`` positions should take its log-probs in chunks: its fp32 logits
    would exceed ``above`` bytes."""
    return tokens * vocab_size * 4 > above


def split_causal_lm(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(body giving the final hidden states, output head) of an HF causal LM whose logits are just the head
    applied to them; None for any other model (its logits are taken whole)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    body = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (body, head) if body is not None and head is not None else None


def _chunk_logprobs(hidden: torch.Tensor, weight_holder: torch.nn.Module, targets: torch.Tensor) -> torch.Tensor:
    logits = weight_holder(hidden).float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _chunk_entropy(hidden: torch.Tensor, weight_holder: torch.nn.Module) -> torch.Tensor:
    logp = torch.log_softmax(weight_holder(hidden).float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _over_chunks(fn, hidden: torch.Tensor, *rest: torch.Tensor, chunk: int) -> torch.Tensor:
    """fn over pieces of ``chunk`` positions of flattened [N, H] hidden states; under autograd each piece is
    recomputed in the backward pass (torch.utils.checkpoint) instead of keeping its [chunk, V] logits."""
    from torch.utils.checkpoint import checkpoint

    parts = []
    for start in range(0, hidden.shape[0], chunk):
        pieces = (hidden[start:start + chunk], *(r[start:start + chunk] for r in rest))
        if torch.is_grad_enabled() and hidden.requires_grad:
            parts.append(checkpoint(fn, *pieces, use_reentrant=False))
        else:
            parts.append(fn(*pieces))
    return torch.cat(parts) if parts else hidden.new_zeros(0)


def chunked_token_logprobs(hidden: torch.Tensor, head: torch.nn.Module, input_ids: torch.Tensor,
                           chunk: int = CHUNK_TOKENS) -> torch.Tensor:
    """shifted_token_logprobs(head(hidden), input_ids) without the whole [B, T, V] logits: the head and the
    fp32 log-softmax run ``chunk`` positions at a time."""
    b, t, h = hidden.shape
    flat = hidden[:, :-1].reshape(-1, h)
    targets = input_ids[:, 1:].reshape(-1)
    lp = _over_chunks(lambda x, y: _chunk_logprobs(x, head, y), flat, targets, chunk=chunk).view(b, t - 1)
    return torch.nn.functional.pad(lp, (1, 0))


def chunked_entropy(hidden: torch.Tensor, head: torch.nn.Module, chunk: int = CHUNK_TOKENS) -> torch.Tensor:
    """shifted_entropy(head(hidden)), ``chunk`` positions at a time."""
    b, t, h = hidden.shape
    ent = _over_chunks(lambda x: _chunk_entropy(x, head), hidden[:, :-1].reshape(-1, h), chunk=chunk).view(b, t - 1)
    return torch.nn.functional.pad(ent, (1, 0))

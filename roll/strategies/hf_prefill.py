"""hf_infer's batched prefill: one forward for requests whose cached prefixes and new tokens differ in length.

A conversation's next turn brings ~70 new tokens (the previous reply's tail and a new message). Encoding them one
request at a time runs every layer on a 70-row matrix, which on a CPU uses the cores poorly; 64 validation episodes
spent ~45 s that way. Here the rows of one wave go through the model together:

* each row's cached KV is left-padded to the longest cached prefix (``P`` columns), its new tokens left-padded to
  the most new tokens (``S`` columns), so padding sits before each row's cached part and before its new part;
* a 2-D attention mask hides the padding and position ids number each row's real tokens from its cached length,
  so every real token sees exactly its own prefix, at the positions it would have alone;
* each row's KV is then cut back out without the padding (the prefix cache and the decode batch keep rows
  unpadded), and the logits after each row's last token are those after the last column.

Padding costs compute, so :func:`plan_groups` puts rows of similar new lengths together.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, tokens, dim]

PAD_SHARE = 0.25  # padding a group may add, as a share of its real new tokens
MAX_GROUP_TOKENS = 8192  # new tokens (padding included) one forward encodes: bounds the attention scores' memory


def plan_groups(new_lengths: Sequence[int], pad_share: float = PAD_SHARE, max_tokens: int = MAX_GROUP_TOKENS) -> list[list[int]]:
    """Rows (indices) grouped for one forward each: sorted by new length, a group grows while its padding stays
    within ``pad_share`` of its real tokens and its padded size within ``max_tokens``."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(new_lengths)), key=lambda j: new_lengths[j]):
        n = new_lengths[i]  # the group's longest so far: rows come shortest first
        if groups:
            size = (len(groups[-1]) + 1) * n
            if size - (real + n) <= pad_share * (real + n) and size <= max_tokens:
                groups[-1].append(i)
                real += n
                continue
        groups.append([i])
        real = n
    return groups


def prefill_rows(model: torch.nn.Module, rows: Sequence[tuple[KV | None, torch.Tensor]]) -> tuple[list[KV], torch.Tensor]:
    """Encode each row's new tokens after its cached KV (None: nothing cached) in one forward.

    Returns each row's KV over its cached and new tokens, unpadded and in its own memory, and the logits after
    each row's last token, [rows, vocab]."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cached = [0 if kv is None else kv[0][0].shape[2] for kv, _ in rows]
    new = [len(ids) for _, ids in rows]
    if min(new) < 1:
        raise ValueError("prefill_rows: a row without new tokens")
    if len(rows) == 1:  # nothing to pad: the plain call, without a mask
        kv, ids = rows[0]
        cache = DynamicCache(ddp_cache_data=kv) if kv is not None else DynamicCache()
        out = model(input_ids=ids[None].to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
        return [[(layer.keys, layer.values) for layer in out.past_key_values.layers]], out.logits[:, -1]

    width, span = max(cached), max(new)
    ids = torch.zeros(len(rows), span, dtype=torch.long)  # padding reads token 0; its output is never used
    mask = torch.zeros(len(rows), width + span, dtype=torch.long)
    positions = torch.zeros(len(rows), span, dtype=torch.long)
    for i, (c, n, (_, tokens)) in enumerate(zip(cached, new, rows)):
        ids[i, span - n:] = tokens
        mask[i, width - c:width] = 1
        mask[i, width + span - n:] = 1
        positions[i, span - n:] = torch.arange(c, c + n)
    cache = DynamicCache()
    if width:
        cache = DynamicCache(ddp_cache_data=_padded_past(rows, width))
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    kvs = []
    for i, (c, n) in enumerate(zip(cached, new)):
        kvs.append([(_unpad(k[i:i + 1], width, c, n), _unpad(v[i:i + 1], width, c, n)) for k, v in layers])
    return kvs, out.logits[:, -1]


def _padded_past(rows: Sequence[tuple[KV | None, torch.Tensor]], width: int) -> KV:
    """The rows' cached KV stacked, each left-padded with zeros to ``width`` tokens (a row without any: all zeros)."""
    template = next(kv for kv, _ in rows if kv is not None)
    empty = [(k[:, :, :0], v[:, :, :0]) for k, v in template]
    return stack_left_padded([kv if kv is not None else empty for kv, _ in rows], width)


def stack_left_padded(kvs: Sequence[KV], width: int) -> KV:
    """Rows' KV stacked along the batch, each left-padded with zeros to ``width`` tokens."""
    return [(torch.cat([left_pad(kv[li][0], width) for kv in kvs]), torch.cat([left_pad(kv[li][1], width) for kv in kvs]))
            for li in range(len(kvs[0]))]


def left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """[1, heads, tokens, dim] padded with zeros on the left to ``width`` tokens."""
    return torch.nn.functional.pad(t, (0, 0, width - t.shape[2], 0))


def _unpad(t: torch.Tensor, width: int, cached: int, new: int) -> torch.Tensor:
    """One row's [1, heads, width + span, dim] tensor without its two paddings, as a new tensor."""
    return torch.cat([t[:, :, width - cached:width], t[:, :, t.shape[2] - new:]], dim=2)

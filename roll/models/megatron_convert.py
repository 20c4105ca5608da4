"""HF <-> megatron-core GPT weight conversion, and model-parallel sharding of the megatron weights.

Pure tensor functions (no megatron import), so the whole round trip is checked on CPU. Covered:
Llama / Mistral / Qwen2 / Qwen3 dense models (GQA, QKV bias, QK norm, tied embeddings) and
Qwen2-MoE / Qwen3-MoE style experts (router, experts, shared expert and its gate).

megatron-core names (``GPTModel.state_dict()``):

- ``embedding.word_embeddings.weight`` [padded vocab, h], ``output_layer.weight`` (absent when tied),
  ``decoder.final_layernorm.weight``;
- per layer ``decoder.layers.{i}.``: ``self_attention.linear_qkv.{weight,bias}`` (Q, K, V interleaved per
  key/value group), ``self_attention.linear_proj.weight``, ``self_attention.{q,k}_layernorm.weight``,
  ``mlp.linear_fc1.weight`` (gate and up stacked), ``mlp.linear_fc2.weight``; MoE: ``mlp.router.weight``,
  ``mlp.experts.local_experts.{e}.linear_fc{1,2}.weight`` (or ``mlp.experts.linear_fc{1,2}.weight{e}``
  with grouped GEMM), ``mlp.shared_experts.linear_fc{1,2}.weight``, ``mlp.shared_experts.gate_weight``;
- norms: with Transformer Engine layers the pre-attention and pre-MLP norms are fused into the next
  linear (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``); with megatron-core's
  local layers (and always before an MoE block) they are ``input_layernorm.weight`` and
  ``pre_mlp_layernorm.weight``.

Sharding: ``shard`` cuts the full megatron state dict into what one (tensor, pipeline, virtual
pipeline, expert) rank holds, with layer and expert numbers local to that rank, as megatron-core
numbers them; ``merge`` is its inverse over all ranks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class GPTLayout:
    """The shape facts the conversion needs, read from an HF config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    fused_norms: bool = True  # Transformer Engine layers (norm fused into the next linear)
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    shared_expert_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    grouped_gemm: bool = False

    @staticmethod
    def from_hf_config(config: Any, *, fused_norms: bool = True, vocab_divisible_by: int = 128,
                       tensor_parallel: int = 1, grouped_gemm: bool = False) -> GPTLayout:
        heads = config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        experts = int(getattr(config, "num_experts", 0) or getattr(config, "num_local_experts", 0) or 0)
        model_type = getattr(config, "model_type", "")
        shared = int(getattr(config, "shared_expert_intermediate_size", 0) or 0)
        if experts and getattr(config, "mlp_only_layers", None):
            raise ValueError(f"{model_type}: models with dense layers among MoE layers (mlp_only_layers) are not supported")
        if experts and getattr(config, "decoder_sparse_step", 1) not in (1, None):
            raise ValueError(f"{model_type}: decoder_sparse_step != 1 is not supported")
        return GPTLayout(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            ffn_hidden_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            padded_vocab_size=padded_vocab(config.vocab_size, vocab_divisible_by, tensor_parallel),
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=bool(getattr(config, "attention_bias", False)) or model_type in ("qwen2", "qwen2_moe"),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            fused_norms=fused_norms,
            num_experts=experts,
            moe_ffn_hidden_size=int(getattr(config, "moe_intermediate_size", 0) or (config.intermediate_size if experts else 0)),
            shared_expert_ffn_hidden_size=shared,
            shared_expert_gate=shared > 0 and model_type == "qwen2_moe",
            grouped_gemm=grouped_gemm,
        )


def padded_vocab(vocab: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x TP."""
    multiple = divisible_by * tensor_parallel
    return int(math.ceil(vocab / multiple) * multiple)


# ---------------------------------------------------------------- HF <-> megatron (full tensors)

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MC_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def unfuse_experts(hf: Mapping[str, torch.Tensor]) -> Tensors:
    """Per-expert checkpoint names from transformers' fused expert parameters
    (``mlp.experts.gate_up_proj`` [E, 2*ffn, h] and ``mlp.experts.down_proj`` [E, h, ffn])."""
    out: Tensors = {}
    for name, t in hf.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = t[e].chunk(2)
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def hf_to_megatron(hf: Mapping[str, torch.Tensor], layout: GPTLayout) -> Tensors:
    """Megatron-core tensors from HF tensors (checkpoint names, or transformers' fused experts).
    Works on any subset of whole layers (a bucket)."""
    out: Tensors = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in unfuse_experts(hf).items():
        m = _HF_LAYER.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif name == "model.embed_tokens.weight":
            out["embedding.word_embeddings.weight"] = _pad_rows(tensor, layout.padded_vocab_size)
        elif name == "lm_head.weight":
            if not layout.tied_embeddings:
                out["output_layer.weight"] = _pad_rows(tensor, layout.padded_vocab_size)
        elif name == "model.norm.weight":
            out["decoder.final_layernorm.weight"] = tensor
        elif name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer recomputed from the config
        else:
            raise KeyError(f"HF weight {name!r} has no megatron-core counterpart in this converter")
    for i, parts in sorted(layers.items()):
        out.update({f"decoder.layers.{i}.{k}": v for k, v in _layer_to_megatron(parts, layout, i).items()})
    return out


def megatron_to_hf(mc: Mapping[str, torch.Tensor], layout: GPTLayout) -> Tensors:
    """HF tensors in checkpoint naming (one name per expert, as safetensors files and vLLM / SGLang
    weight loaders use) from megatron-core tensors (full, unsharded; any subset of whole layers)."""
    out: Tensors = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in mc.items():
        if name.endswith("_extra_state"):
            continue
        m = _MC_LAYER.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor[: layout.vocab_size]  # tied: HF's lm_head follows it
        elif name == "output_layer.weight":
            if not layout.tied_embeddings:
                out["lm_head.weight"] = tensor[: layout.vocab_size]
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        else:
            raise KeyError(f"megatron-core weight {name!r} has no HF counterpart in this converter")
    for i, parts in sorted(layers.items()):
        out.update({f"model.layers.{i}.{k}": v for k, v in _layer_to_hf(parts, layout, i).items()})
    return out


def _taker(p: dict[str, torch.Tensor], side: str, i: int) -> Any:
    """take(name): remove and return one of layer i's weights; what is left at the end was not mapped."""

    def take(name: str) -> torch.Tensor:
        if name not in p:
            raise KeyError(f"{side} layer {i} is missing {name!r} (a bucket must hold whole layers)")
        return p.pop(name)

    return take


def _layer_to_megatron(p: dict[str, torch.Tensor], L: GPTLayout, i: int) -> Tensors:
    out: Tensors = {}
    moe = L.num_experts > 0
    take = _taker(p, "HF", i)

    attn_norm = "self_attention.linear_qkv.layer_norm_weight" if L.fused_norms else "input_layernorm.weight"
    out[attn_norm] = take("input_layernorm.weight")
    out["self_attention.linear_qkv.weight"] = interleave_qkv(
        take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"), take("self_attn.v_proj.weight"), L)
    if L.qkv_bias:
        out["self_attention.linear_qkv.bias"] = interleave_qkv(
            take("self_attn.q_proj.bias"), take("self_attn.k_proj.bias"), take("self_attn.v_proj.bias"), L)
    out["self_attention.linear_proj.weight"] = take("self_attn.o_proj.weight")
    if L.qk_norm:
        out["self_attention.q_layernorm.weight"] = take("self_attn.q_norm.weight")
        out["self_attention.k_layernorm.weight"] = take("self_attn.k_norm.weight")
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if L.fused_norms and not moe else "pre_mlp_layernorm.weight"
    out[mlp_norm] = take("post_attention_layernorm.weight")
    if not moe:
        out["mlp.linear_fc1.weight"] = torch.cat([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")])
        out["mlp.linear_fc2.weight"] = take("mlp.down_proj.weight")
    else:
        out["mlp.router.weight"] = take("mlp.gate.weight")
        for e in range(L.num_experts):
            fc1 = torch.cat([take(f"mlp.experts.{e}.gate_proj.weight"), take(f"mlp.experts.{e}.up_proj.weight")])
            fc2 = take(f"mlp.experts.{e}.down_proj.weight")
            out[_expert_name(1, e, L)] = fc1
            out[_expert_name(2, e, L)] = fc2
        if L.shared_expert_ffn_hidden_size:
            out["mlp.shared_experts.linear_fc1.weight"] = torch.cat(
                [take("mlp.shared_expert.gate_proj.weight"), take("mlp.shared_expert.up_proj.weight")])
            out["mlp.shared_experts.linear_fc2.weight"] = take("mlp.shared_expert.down_proj.weight")
            if L.shared_expert_gate:
                out["mlp.shared_experts.gate_weight"] = take("mlp.shared_expert_gate.weight")
    if p:
        raise KeyError(f"HF layer {i} has weights this converter does not map: {sorted(p)}")
    return out


def _layer_to_hf(p: dict[str, torch.Tensor], L: GPTLayout, i: int) -> Tensors:
    out: Tensors = {}
    moe = L.num_experts > 0
    p = {k: v for k, v in p.items() if not k.endswith("_extra_state")}
    take = _taker(p, "megatron", i)
    out["input_layernorm.weight"] = take(
        "self_attention.linear_qkv.layer_norm_weight" if L.fused_norms else "input_layernorm.weight")
    q, k, v = split_qkv(take("self_attention.linear_qkv.weight"), L)
    out.update({"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v})
    if L.qkv_bias:
        q, k, v = split_qkv(take("self_attention.linear_qkv.bias"), L)
        out.update({"self_attn.q_proj.bias": q, "self_attn.k_proj.bias": k, "self_attn.v_proj.bias": v})
    out["self_attn.o_proj.weight"] = take("self_attention.linear_proj.weight")
    if L.qk_norm:
        out["self_attn.q_norm.weight"] = take("self_attention.q_layernorm.weight")
        out["self_attn.k_norm.weight"] = take("self_attention.k_layernorm.weight")
    out["post_attention_layernorm.weight"] = take(
        "mlp.linear_fc1.layer_norm_weight" if L.fused_norms and not moe else "pre_mlp_layernorm.weight")
    if not moe:
        gate, up = take("mlp.linear_fc1.weight").chunk(2)
        out.update({"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up,
                    "mlp.down_proj.weight": take("mlp.linear_fc2.weight")})
    else:
        out["mlp.gate.weight"] = take("mlp.router.weight")
        for e in range(L.num_experts):
            gate, up = take(_expert_name(1, e, L)).chunk(2)
            out.update({f"mlp.experts.{e}.gate_proj.weight": gate, f"mlp.experts.{e}.up_proj.weight": up,
                        f"mlp.experts.{e}.down_proj.weight": take(_expert_name(2, e, L))})
        if L.shared_expert_ffn_hidden_size:
            gate, up = take("mlp.shared_experts.linear_fc1.weight").chunk(2)
            out.update({"mlp.shared_expert.gate_proj.weight": gate, "mlp.shared_expert.up_proj.weight": up,
                        "mlp.shared_expert.down_proj.weight": take("mlp.shared_experts.linear_fc2.weight")})
            if L.shared_expert_gate:
                out["mlp.shared_expert_gate.weight"] = take("mlp.shared_experts.gate_weight")
    if p:
        raise KeyError(f"megatron layer {i} has weights this converter does not map: {sorted(p)}")
    return out


def _expert_name(fc: int, e: int, L: GPTLayout) -> str:
    if L.grouped_gemm:
        return f"mlp.experts.linear_fc{fc}.weight{e}"
    return f"mlp.experts.local_experts.{e}.linear_fc{fc}.weight"


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, L: GPTLayout) -> torch.Tensor:
    """[Q of group 0, K0, V0, Q of group 1, K1, V1, ...]: megatron's fused QKV row order, which keeps
    whole key/value groups together when the rows are split over tensor-parallel ranks."""
    g, d = L.num_kv_heads, L.head_dim
    per = L.num_heads // g
    tail = q.shape[1:]
    parts = [q.reshape(g, per * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail)]
    return torch.cat(parts, dim=1).reshape(g * (per + 2) * d, *tail)


def split_qkv(qkv: torch.Tensor, L: GPTLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d = L.num_kv_heads, L.head_dim
    per = L.num_heads // g
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *tail)
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return q.reshape(g * per * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    if t.shape[0] > rows:
        raise ValueError(f"vocabulary of {t.shape[0]} rows does not fit the padded size {rows}")
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


# ---------------------------------------------------------------- model-parallel sharding

@dataclass(frozen=True)
class ParallelRank:
    """One rank's position in the model-parallel grid (data and context parallel ranks hold the
    same weights, so they do not appear)."""

    tp: int = 1
    tp_rank: int = 0
    pp: int = 1
    pp_rank: int = 0
    vpp: int = 1  # model chunks per pipeline stage
    vpp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0
    etp: int | None = None  # expert tensor parallel; None: same as tp
    etp_rank: int | None = None

    @property
    def expert_tp(self) -> tuple[int, int]:
        if self.etp is None:
            return self.tp, self.tp_rank
        return self.etp, self.etp_rank or 0


def layers_of(rank: ParallelRank, num_layers: int) -> range:
    """Global layer ids on this (pipeline stage, virtual chunk), in megatron-core's assignment:
    chunk c of stage p holds layers c*L/vpp + p*L/(pp*vpp) onward."""
    per_chunk = num_layers // (rank.pp * rank.vpp)
    if per_chunk * rank.pp * rank.vpp != num_layers:
        raise ValueError(f"{num_layers} layers do not split into {rank.pp} stages x {rank.vpp} chunks")
    start = rank.vpp_rank * (num_layers // rank.vpp) + rank.pp_rank * per_chunk
    return range(start, start + per_chunk)


def is_first_stage(rank: ParallelRank) -> bool:
    return rank.pp_rank == 0 and rank.vpp_rank == 0


def is_last_stage(rank: ParallelRank) -> bool:
    return rank.pp_rank == rank.pp - 1 and rank.vpp_rank == rank.vpp - 1


# How each weight splits over tensor-parallel ranks: dim 0 (column parallel), dim 1 (row parallel),
# "glu" (gate and up halves each split on dim 0), or None (replicated).
def tp_split_kind(local_name: str) -> int | str | None:
    if local_name.endswith(("linear_qkv.weight", "linear_qkv.bias")) or local_name in (
            "embedding.word_embeddings.weight", "output_layer.weight"):
        return 0
    if re.search(r"linear_fc1\.weight\d*$", local_name):
        return "glu"
    if local_name.endswith(("linear_proj.weight",)) or re.search(r"linear_fc2\.weight\d*$", local_name):
        return 1
    return None


def _split(t: torch.Tensor, kind: int | str | None, parts: int, index: int) -> torch.Tensor:
    if kind is None or parts == 1:
        return t
    if kind == "glu":
        gate, up = t.chunk(2)
        return torch.cat([gate.chunk(parts)[index], up.chunk(parts)[index]])
    return t.chunk(parts, dim=int(kind))[index]


def _join(pieces: list[torch.Tensor], kind: int | str | None) -> torch.Tensor:
    if kind is None or len(pieces) == 1:
        return pieces[0]
    if kind == "glu":
        halves = [p.chunk(2) for p in pieces]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    return torch.cat(pieces, dim=int(kind))


_EXPERT = re.compile(r"^mlp\.experts\.(?:local_experts\.(\d+)\.(linear_fc\d\.weight)|(linear_fc\d\.weight)(\d+))$")


def shard(full: Mapping[str, torch.Tensor], layout: GPTLayout, rank: ParallelRank) -> Tensors:
    """What ``rank`` holds of the full megatron-core state dict, named as megatron-core names it there."""
    out: Tensors = {}
    layer_ids = layers_of(rank, layout.num_layers)
    local_of = {g: j for j, g in enumerate(layer_ids)}
    experts_per_rank = layout.num_experts // rank.ep if layout.num_experts else 0
    etp, etp_rank = rank.expert_tp
    for name, tensor in full.items():
        m = _MC_LAYER.match(name)
        if m:
            g, rest = int(m.group(1)), m.group(2)
            if g not in local_of:
                continue
            e = _EXPERT.match(rest)
            if e:
                expert = int(e.group(1) if e.group(1) is not None else e.group(4))
                if expert // experts_per_rank != rank.ep_rank:
                    continue
                local_e = expert % experts_per_rank
                rest = (f"mlp.experts.local_experts.{local_e}.{e.group(2)}" if e.group(1) is not None
                        else f"mlp.experts.{e.group(3)}{local_e}")
                out[f"decoder.layers.{local_of[g]}.{rest}"] = _split(tensor, tp_split_kind(rest), etp, etp_rank)
            else:
                out[f"decoder.layers.{local_of[g]}.{rest}"] = _split(tensor, tp_split_kind(rest), rank.tp, rank.tp_rank)
        elif name == "embedding.word_embeddings.weight":
            if is_first_stage(rank):
                out[name] = _split(tensor, 0, rank.tp, rank.tp_rank)
            if layout.tied_embeddings and is_last_stage(rank) and rank.pp > 1:
                out["output_layer.weight"] = _split(tensor, 0, rank.tp, rank.tp_rank)  # the last stage's copy
        elif name in ("output_layer.weight", "decoder.final_layernorm.weight"):
            if is_last_stage(rank):
                out[name] = _split(tensor, tp_split_kind(name), rank.tp, rank.tp_rank)
        else:
            raise KeyError(f"megatron-core weight {name!r} is not handled by shard()")
    return out


def all_ranks(tp: int = 1, pp: int = 1, vpp: int = 1, ep: int = 1, etp: int | None = None) -> list[ParallelRank]:
    """Every model-parallel position; expert tensor ranks follow tensor ranks when etp is None."""
    ranks = []
    for p in range(pp):
        for v in range(vpp):
            for t in range(tp):
                for e in range(ep):
                    ranks.append(ParallelRank(tp, t, pp, p, vpp, v, ep, e, etp, None if etp is None else t % etp))
    return ranks


def merge(shards: Iterable[tuple[ParallelRank, Mapping[str, torch.Tensor]]], layout: GPTLayout) -> Tensors:
    """The full megatron-core state dict from every rank's shard (inverse of ``shard``)."""
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    kinds: dict[str, Any] = {}
    for rank, part in shards:
        layer_ids = layers_of(rank, layout.num_layers)
        experts_per_rank = layout.num_experts // rank.ep if layout.num_experts else 0
        etp, etp_rank = rank.expert_tp
        for name, tensor in part.items():
            if name.endswith("_extra_state"):
                continue
            m = _MC_LAYER.match(name)
            split_rank = rank.tp_rank
            if m:
                rest = m.group(2)
                e = _EXPERT.match(rest)
                if e:
                    local_e = int(e.group(1) if e.group(1) is not None else e.group(4))
                    expert = rank.ep_rank * experts_per_rank + local_e
                    rest = (f"mlp.experts.local_experts.{expert}.{e.group(2)}" if e.group(1) is not None
                            else f"mlp.experts.{e.group(3)}{expert}")
                    split_rank = etp_rank
                    if etp != rank.tp and rank.tp_rank >= etp:
                        continue  # duplicate copies across the remaining tensor ranks
                full_name = f"decoder.layers.{layer_ids[int(m.group(1))]}.{rest}"
            elif name == "output_layer.weight" and layout.tied_embeddings:
                continue  # the last stage's copy of the embedding
            else:
                full_name = name
            kinds[full_name] = tp_split_kind(rest if m else name)
            pieces.setdefault(full_name, {})[split_rank] = tensor
    return {name: _join([by_rank[r] for r in sorted(by_rank)], kinds[name]) for name, by_rank in pieces.items()}

"""HF <-> megatron-core conversion and model-parallel sharding, on tiny random-init HF models."""

from __future__ import annotations

import pytest
import torch
import transformers

from roll.models.megatron_convert import (
    GPTLayout,
    ParallelRank,
    all_ranks,
    hf_to_megatron,
    layers_of,
    megatron_to_hf,
    merge,
    padded_vocab,
    shard,
    unfuse_experts,
)

BASE = dict(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=64)


def _model(kind: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**BASE, tie_word_embeddings=False)
        return transformers.LlamaForCausalLM(cfg)
    if kind == "qwen2":  # QKV bias, tied embeddings
        cfg = transformers.Qwen2Config(**BASE, tie_word_embeddings=True)
        return transformers.Qwen2ForCausalLM(cfg)
    if kind == "qwen3":  # QK norm, explicit head_dim
        cfg = transformers.Qwen3Config(**BASE, head_dim=16, tie_word_embeddings=False)
        return transformers.Qwen3ForCausalLM(cfg)
    if kind == "qwen2_moe":  # router, 4 experts, shared expert with its gate
        cfg = transformers.Qwen2MoeConfig(**BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                          shared_expert_intermediate_size=40, tie_word_embeddings=False)
        return transformers.Qwen2MoeForCausalLM(cfg)
    raise AssertionError(kind)


def _hf_tensors(model: transformers.PreTrainedModel) -> dict[str, torch.Tensor]:
    # state_dict() drops lm_head when tied; expert weights come out per expert in HF's own layout.
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def _hf_reference(model: transformers.PreTrainedModel) -> dict[str, torch.Tensor]:
    """HF tensors in checkpoint naming (transformers fuses each layer's experts in memory)."""
    return unfuse_experts(_hf_tensors(model))


KINDS = ["llama", "qwen2", "qwen3", "qwen2_moe"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fused_norms", [True, False])
def test_hf_megatron_round_trip_is_exact(kind: str, fused_norms: bool) -> None:
    model = _model(kind)
    layout = GPTLayout.from_hf_config(model.config, fused_norms=fused_norms, vocab_divisible_by=64)
    hf = _hf_reference(model)
    mc = hf_to_megatron(hf, layout)
    back = megatron_to_hf(mc, layout)
    assert sorted(back) == sorted(hf)
    for name, t in hf.items():
        assert back[name].shape == t.shape, name
        assert torch.equal(back[name], t), name


def test_megatron_names_and_shapes_for_a_gqa_llama() -> None:
    layout = GPTLayout.from_hf_config(_model("llama").config, fused_norms=True, vocab_divisible_by=64)
    mc = hf_to_megatron(_hf_reference(_model("llama")), layout)
    # 4 query heads in 2 groups of head_dim 8: (4 + 2*2) * 8 = 64 fused QKV rows
    assert mc["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (64, 32)
    assert mc["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"].shape == (32,)
    assert mc["decoder.layers.0.mlp.linear_fc1.weight"].shape == (96, 32)  # gate and up stacked
    assert mc["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"].shape == (32,)
    assert mc["decoder.layers.3.mlp.linear_fc2.weight"].shape == (32, 48)
    assert mc["embedding.word_embeddings.weight"].shape == (128, 32)  # 100 padded to a multiple of 64
    assert mc["output_layer.weight"].shape == (128, 32)
    assert torch.all(mc["embedding.word_embeddings.weight"][100:] == 0)
    assert "decoder.final_layernorm.weight" in mc


def test_qkv_rows_are_interleaved_per_key_value_group() -> None:
    # 4 query heads, 2 kv groups, head_dim 1: rows are q0 q1 k0 v0 q2 q3 k1 v1
    layout = GPTLayout(num_layers=1, hidden_size=1, num_heads=4, num_kv_heads=2, head_dim=1, ffn_hidden_size=1,
                       vocab_size=1, padded_vocab_size=1)
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    from roll.models.megatron_convert import interleave_qkv, split_qkv

    fused = interleave_qkv(q, k, v, layout)
    assert fused.flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    q2, k2, v2 = split_qkv(fused, layout)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


def test_layer_assignment_matches_megatron_virtual_pipeline_order() -> None:
    # 8 layers, 2 stages x 2 chunks: stage 0 holds [0,1] and [4,5]; stage 1 holds [2,3] and [6,7]
    got = {(p, v): list(layers_of(ParallelRank(pp=2, pp_rank=p, vpp=2, vpp_rank=v), 8)) for p in range(2) for v in range(2)}
    assert got == {(0, 0): [0, 1], (1, 0): [2, 3], (0, 1): [4, 5], (1, 1): [6, 7]}
    with pytest.raises(ValueError, match="do not split"):
        layers_of(ParallelRank(pp=3), 8)


@pytest.mark.parametrize("kind,grid", [
    ("llama", dict(tp=2)),
    ("llama", dict(tp=2, pp=2)),
    ("qwen2", dict(tp=2, pp=2)),  # tied embeddings: the last stage keeps its own copy
    ("qwen3", dict(pp=2, vpp=2)),
    ("qwen2_moe", dict(tp=2, ep=2)),
    ("qwen2_moe", dict(tp=2, pp=2, ep=4, etp=1)),
])
def test_shard_then_merge_is_the_identity(kind: str, grid: dict) -> None:
    model = _model(kind)
    tp = grid.get("tp", 1)
    layout = GPTLayout.from_hf_config(model.config, vocab_divisible_by=8, tensor_parallel=tp)
    full = hf_to_megatron(_hf_reference(model), layout)
    ranks = all_ranks(**grid)
    parts = [(r, shard(full, layout, r)) for r in ranks]
    merged = merge(parts, layout)
    assert sorted(merged) == sorted(full)
    for name in full:
        assert torch.equal(merged[name], full[name]), name
    assert megatron_to_hf(merged, layout).keys() == _hf_reference(model).keys()


def test_shard_shapes_and_local_numbering() -> None:
    model = _model("qwen2_moe")
    layout = GPTLayout.from_hf_config(model.config, vocab_divisible_by=8, tensor_parallel=2)
    full = hf_to_megatron(_hf_reference(model), layout)
    r = ParallelRank(tp=2, tp_rank=1, pp=2, pp_rank=1, ep=2, ep_rank=1)
    part = shard(full, layout, r)
    # stage 1 of 2 holds global layers 2, 3 as local 0, 1; expert rank 1 of 2 holds experts 2, 3 as 0, 1
    assert "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight" in part
    assert "decoder.layers.2.self_attention.linear_qkv.weight" not in part
    assert torch.equal(part["decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight"],
                       full["decoder.layers.2.mlp.experts.local_experts.2.linear_fc2.weight"][:, 12:])
    # column parallel: one of two kv groups per rank (16 of 32 rows); gate/up halves split separately
    assert part["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (32, 32)
    fc1 = full["decoder.layers.2.mlp.shared_experts.linear_fc1.weight"]
    gate, up = fc1.chunk(2)
    assert torch.equal(part["decoder.layers.0.mlp.shared_experts.linear_fc1.weight"], torch.cat([gate[20:], up[20:]]))
    assert part["decoder.layers.0.self_attention.linear_proj.weight"].shape == (32, 16)  # row parallel
    assert part["output_layer.weight"].shape == (layout.padded_vocab_size // 2, 32)
    assert "embedding.word_embeddings.weight" not in part  # first stage only
    assert torch.equal(part["decoder.layers.0.mlp.router.weight"], full["decoder.layers.2.mlp.router.weight"])


def test_grouped_gemm_expert_names() -> None:
    model = _model("qwen2_moe")
    layout = GPTLayout.from_hf_config(model.config, grouped_gemm=True)
    mc = hf_to_megatron(_hf_reference(model), layout)
    assert "decoder.layers.0.mlp.experts.linear_fc1.weight3" in mc
    part = shard(mc, layout, ParallelRank(ep=2, ep_rank=1))
    assert torch.equal(part["decoder.layers.0.mlp.experts.linear_fc1.weight0"], mc["decoder.layers.0.mlp.experts.linear_fc1.weight2"])


def test_padded_vocab_and_clear_errors() -> None:
    assert padded_vocab(100, 128, 1) == 128
    assert padded_vocab(49152, 128, 8) == 49152
    assert padded_vocab(151936, 128, 3) == 152064
    layout = GPTLayout.from_hf_config(_model("llama").config)
    hf = _hf_reference(_model("llama"))
    partial = {k: v for k, v in hf.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(KeyError, match="layer 1 is missing 'self_attn.k_proj.weight'"):
        hf_to_megatron(partial, layout)
    with pytest.raises(KeyError, match="no megatron-core counterpart"):
        hf_to_megatron({"vision_tower.weight": torch.zeros(1)}, layout)
    # a bucket of whole layers converts on its own (weight sync sends layers in buckets)
    bucket = {k: v for k, v in hf.items() if k.startswith("model.layers.2.")}
    assert all(k.startswith("decoder.layers.2.") for k in hf_to_megatron(bucket, layout))


def test_fused_expert_parameters_convert_like_checkpoint_names() -> None:
    model = _model("qwen2_moe")
    fused = _hf_tensors(model)
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused  # transformers' in-memory layout
    layout = GPTLayout.from_hf_config(model.config)
    from_fused, from_named = hf_to_megatron(fused, layout), hf_to_megatron(_hf_reference(model), layout)
    assert from_fused.keys() == from_named.keys()
    assert all(torch.equal(from_fused[k], from_named[k]) for k in from_fused)
    gate_up = fused["model.layers.1.mlp.experts.gate_up_proj"][3]
    assert torch.equal(megatron_to_hf(from_fused, layout)["model.layers.1.mlp.experts.3.up_proj.weight"], gate_up[24:])


def test_transformer_config_from_hf_configs() -> None:
    from roll.configs.strategy_configs import MegatronConfig
    from roll.strategies.megatron_model import transformer_config_kwargs

    mc = MegatronConfig(tensor_model_parallel_size=1, sequence_parallel=True, recompute_granularity="full")
    kw = transformer_config_kwargs(_model("qwen2").config, mc, "bf16")
    assert kw["add_qkv_bias"] and not kw["qk_layernorm"] and kw["num_query_groups"] == 2 and kw["kv_channels"] == 8
    assert kw["bf16"] and kw["params_dtype"] == torch.bfloat16
    assert kw["sequence_parallel"] is False  # meaningless at TP 1; megatron-core refuses it there
    assert (kw["recompute_method"], kw["recompute_num_layers"]) == ("uniform", 1)
    assert transformer_config_kwargs(_model("qwen3").config, MegatronConfig(), None)["qk_layernorm"]
    moe = transformer_config_kwargs(_model("qwen2_moe").config, MegatronConfig(), None)
    assert (moe["num_moe_experts"], moe["moe_router_topk"], moe["moe_ffn_hidden_size"]) == (4, 2, 24)
    assert moe["moe_router_pre_softmax"] and moe["moe_shared_expert_gate"]  # Qwen2-MoE routes without renormalising
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2)
    with pytest.raises(ValueError, match="supports model types .*got 'gpt2'"):
        transformer_config_kwargs(gpt2, MegatronConfig(), None)
    yarn = transformers.LlamaConfig(**BASE, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 32})
    with pytest.raises(ValueError, match="rope scaling 'yarn'"):
        transformer_config_kwargs(yarn, MegatronConfig(), None)

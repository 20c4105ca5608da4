"""A megatron-core GPTModel built from an HF model's config (imported only where megatron-core is).

``transformer_config_kwargs`` is pure (no megatron import): the mapping from an HF config and the
strategy's MegatronConfig to megatron-core ``TransformerConfig`` fields.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.configs.strategy_configs import MegatronConfig
from roll.models.dtypes import TORCH_DTYPES
from roll.models.megatron_convert import GPTLayout

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


def rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0)


def rope_scaling(hf_config: Any) -> tuple[str, dict[str, Any]]:
    """(rope type, its parameters) from transformers 5's rope_parameters or older rope_scaling."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    return params.get("rope_type") or params.get("type") or "default", params


def check_rope(hf_config: Any) -> None:
    kind, _ = rope_scaling(hf_config)
    if kind not in ("default", "llama3"):
        raise ValueError(f"rope scaling {kind!r} of {hf_config.model_type} is not supported by megatron_train")


def transformer_config_kwargs(hf_config: Any, mc: MegatronConfig, dtype: str | None) -> dict[str, Any]:
    """TransformerConfig fields for an HF Llama / Mistral / Qwen2 / Qwen3 (MoE) config."""
    model_type = getattr(hf_config, "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"megatron_train supports model types {', '.join(SUPPORTED_MODEL_TYPES)}; got {model_type!r}")
    check_rope(hf_config)
    layout = GPTLayout.from_hf_config(hf_config)
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported by megatron_train (SwiGLU models only)")
    kw: dict[str, Any] = dict(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_kv_heads,
        kv_channels=layout.head_dim,
        ffn_hidden_size=layout.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        qk_layernorm=layout.qk_norm,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        params_dtype=TORCH_DTYPES[dtype or "fp32"],
        pipeline_dtype=TORCH_DTYPES[dtype or "fp32"],  # activations sent between pipeline stages
        **mc.parallel_sizes(),
        # megatron-core refuses sequence parallel at TP 1, where it means nothing
        sequence_parallel=mc.sequence_parallel and mc.tensor_model_parallel_size > 1,
        recompute_granularity=mc.recompute_granularity,
        recompute_method=(mc.recompute_method or "uniform") if mc.recompute_granularity == "full" else None,
        recompute_num_layers=(mc.recompute_num_layers or 1) if mc.recompute_granularity == "full" else None,
    )
    if layout.num_experts:
        kw.update(
            num_moe_experts=layout.num_experts,
            moe_router_topk=int(hf_config.num_experts_per_tok),
            moe_ffn_hidden_size=layout.moe_ffn_hidden_size,
            # Qwen2-MoE: softmax over all experts, then top-k (no renormalisation); norm_topk_prob:
            # top-k then softmax over the chosen, which megatron's default computes.
            moe_router_pre_softmax=not bool(getattr(hf_config, "norm_topk_prob", False)),
            moe_shared_expert_intermediate_size=layout.shared_expert_ffn_hidden_size or None,
            moe_shared_expert_gate=layout.shared_expert_gate,
            moe_shared_expert_overlap=mc.moe_shared_expert_overlap,
            moe_grouped_gemm=mc.moe_grouped_gemm,
            moe_token_dispatcher_type=mc.moe_token_dispatcher_type,
            moe_router_load_balancing_type=mc.moe_router_load_balancing_type,
            moe_aux_loss_coeff=mc.moe_aux_loss_coeff,
            moe_layer_recompute=mc.moe_layer_recompute,
        )
    return kw


def use_transformer_engine(mc: MegatronConfig, lora: bool = False) -> bool:
    """Transformer Engine layers when asked for or (auto) installed; grouped GEMM needs them. LoRA runs on
    megatron-core's own (local) layers, which peft's tensor-parallel adapter wraps."""
    if lora:
        if mc.transformer_impl == "transformer_engine":
            raise ValueError("strategy_config.transformer_impl 'transformer_engine' with LoRA: peft's adapter wraps "
                             "megatron-core's local parallel linears; set transformer_impl to auto or local")
        return False
    try:
        import transformer_engine  # noqa: F401

        have = True
    except ImportError:
        have = False
    if mc.transformer_impl == "transformer_engine" and not have:
        raise ImportError("strategy_config.transformer_impl is 'transformer_engine' but transformer_engine is not installed")
    if mc.moe_grouped_gemm and not have:
        raise ImportError("strategy_config.moe_grouped_gemm needs transformer_engine, which is not installed")
    return have and mc.transformer_impl != "local"


def build_gpt_model(hf_config: Any, mc: MegatronConfig, dtype: str | None, *, use_te: bool, vp_stage: int | None = None,
                    cpu_init: bool = False) -> Any:
    """One GPTModel chunk for this rank (pre/post-process flags from its pipeline position)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt import gpt_layer_specs as specs
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = transformer_config_kwargs(hf_config, mc, dtype)
    kwargs.update(mc.transformer_config)
    kwargs.update(use_cpu_initialization=cpu_init, perform_initialization=False)
    config = TransformerConfig(**kwargs)
    layout = layout_for(hf_config, mc, use_te)
    if use_te:
        spec = specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=layout.num_experts or None, moe_grouped_gemm=mc.moe_grouped_gemm, qk_layernorm=layout.qk_norm)
    else:
        spec = specs.get_gpt_layer_local_spec(
            num_experts=layout.num_experts or None, moe_grouped_gemm=False, qk_layernorm=layout.qk_norm,
            normalization="RMSNorm")
    kind, params = rope_scaling(hf_config)
    llama3 = kind == "llama3"
    extra = {"vp_stage": vp_stage} if vp_stage is not None else {}
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=layout.padded_vocab_size,
        max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 4096)),
        pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        share_embeddings_and_output_weights=layout.tied_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(rope_theta(hf_config)),
        rope_scaling=llama3,
        rope_scaling_factor=float(params.get("factor", 8.0)) if llama3 else 8.0,
        **extra,
    )


def layout_for(hf_config: Any, mc: MegatronConfig, use_te: bool) -> GPTLayout:
    """The conversion layout of this model under these parallel settings (padded vocab included)."""
    return GPTLayout.from_hf_config(hf_config, fused_norms=use_te, vocab_divisible_by=mc.make_vocab_size_divisible_by,
                                    tensor_parallel=mc.tensor_model_parallel_size, grouped_gemm=mc.moe_grouped_gemm)

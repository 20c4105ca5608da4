"""Typed ``strategy_config`` of the GPU backends (vllm, sglang, megatron_train / megatron_infer).

Checked at config load on any machine, so a bad value fails before any GPU work starts. The keys
below are the ones ROLL's guide documents plus the common engine switches; any other key is passed
to the engine verbatim (vLLM ``AsyncEngineArgs``, SGLang ``ServerArgs``, megatron-core
``TransformerConfig``) and checked against that engine's own argument list when the worker starts.
A key that is not known but close to a known one ("gpu_memory_utilisation") is an error here.

DeepSpeed's ``strategy_config`` is a DeepSpeed JSON config and is checked by DeepSpeed itself.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from roll.configs.build import convert_value
from roll.configs.errors import ConfigError, join_path, nearest
from roll.configs.schema import opt


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = opt(0.9, "Share of the GPU's memory vLLM may take (weights + KV cache), in (0, 1].")
    block_size: int | None = opt(None, "Tokens per KV-cache block; unset lets vLLM choose for its attention backend.")
    max_model_len: int | None = opt(None, "Longest sequence (prompt + response); unset: the model's own limit.")
    load_format: str = opt("auto", "How weights load at start; 'dummy' skips reading them (the first weight sync fills them).")
    tensor_parallel_size: int = opt(1, "Tensor parallel GPUs of one engine; sets num_gpus_per_worker.")
    pipeline_parallel_size: int = opt(1, "Pipeline parallel GPUs of one engine; multiplies num_gpus_per_worker.")
    enforce_eager: bool = opt(False, "Disable CUDA graphs (less memory, slower decode).")
    enable_prefix_caching: bool = opt(True, "Reuse KV blocks of shared prompt prefixes (multi-turn rollouts share them).")
    prefill_shared_openings: bool = opt(
        True, "With prefix caching: prompts of one generate call that share 64 or more leading tokens (a rollout's "
        "first turn: system prompt, demonstrations, a group's first observation) get them prefilled once, by a "
        "one-token request sent ahead, instead of once per prompt (requests that arrive together do not share "
        "blocks none of them has computed yet).")
    max_num_seqs: int | None = opt(None, "Most sequences decoded at once; unset: vLLM's default.")
    max_num_batched_tokens: int | None = opt(None, "Most tokens in one engine step; unset: vLLM's default.")
    sleep_level: Literal[1, 2] = opt(
        1, "Colocated sleep: 1 moves weights to CPU and drops the KV cache; 2 drops both (the next sync refills).")
    enable_sleep_mode: bool | None = opt(None, "Free GPU memory between rollouts; unset: on when colocated with training.")
    lora_adapters: bool = opt(
        True, "LoRA runs: the engine applies the trainer's adapter (a LoRARequest, re-registered at each sync), so a "
        "sync sends the adapter's tensors only; false, load_format 'dummy' or sleep_level 2 (no base weights to adapt), "
        "or a rank above 512: every sync sends full weights with the adapter merged in (no LoRA kernels while generating).")
    engine_kwargs: dict[str, Any] = opt(factory=dict, help="More AsyncEngineArgs, passed verbatim.")


@dataclass
class SGLangConfig:
    mem_fraction_static: float | None = opt(
        None, "Share of GPU memory for weights + KV cache, in (0, 1); raise it if the KV cache cannot be built.")
    load_format: str = opt("auto", "How weights load at start; 'dummy' skips reading them (the first weight sync fills them).")
    tensor_parallel_size: int = opt(1, "Tensor parallel GPUs of one engine (SGLang's tp_size); sets num_gpus_per_worker.")
    context_length: int | None = opt(None, "Longest sequence; unset: the model's own limit.")
    max_running_requests: int | None = opt(None, "Most requests decoded at once; unset: SGLang's default.")
    disable_cuda_graph: bool = opt(False, "Disable CUDA graphs.")
    attention_backend: str | None = opt(None, "SGLang attention backend (flashinfer, fa3, triton, ...); unset: its default.")
    enable_memory_saver: bool | None = opt(
        None, "Release/resume GPU memory between rollouts; unset: on when colocated with training.")
    lora_adapters: bool = opt(
        True, "LoRA runs: the engine applies the trainer's adapter (load_lora_adapter, re-loaded at each sync), so a "
        "sync sends the adapter's tensors only; false, or load_format 'dummy' (no base weights to adapt): every sync "
        "sends full weights with the adapter merged in.")
    engine_kwargs: dict[str, Any] = opt(factory=dict, help="More SGLang ServerArgs, passed verbatim.")


@dataclass
class HFInferConfig:
    enable_prefix_caching: bool = opt(
        True, "Keep each finished request's KV and reuse it for prompts that start with the same tokens (a "
        "conversation's next turn, a shared opening); off: every prompt is encoded whole.")
    prefix_cache_tokens: int = opt(65536, "Most tokens whose KV the prefix cache holds (least recently used go first).")
    max_num_seqs: int = opt(
        32, "Most requests decoding at once (vLLM's key of the same name); the rest wait and join as rows finish. "
        "Bounds the decode batch's KV and logits memory (a 64-level validation beside the training rollout).")
    max_num_batched_tokens: int = opt(
        8192, "Most new tokens (padding included) one prefill forward encodes (vLLM's key of the same name): requests "
        "that join the decode batch together are encoded together up to it, grouped by length; 1 encodes each alone.")


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = opt(1, "Tensor parallel size: each layer's matrices split over this many GPUs.")
    pipeline_model_parallel_size: int = opt(1, "Pipeline parallel size: the layers split into this many stages.")
    virtual_pipeline_model_parallel_size: int | None = opt(
        None, "Model chunks per pipeline stage (interleaved schedule); needs pipeline_model_parallel_size > 1.")
    context_parallel_size: int = opt(1, "Context parallel size: each sequence split over this many GPUs.")
    expert_model_parallel_size: int = opt(1, "Expert parallel size: MoE experts spread over this many GPUs.")
    expert_tensor_parallel_size: int | None = opt(None, "Tensor parallel size inside each expert; unset: tensor_model_parallel_size.")
    sequence_parallel: bool = opt(False, "Split layer norms and dropout over the tensor parallel group (needs TP > 1).")
    recompute_granularity: Literal["full", "selective"] | None = opt(
        None, "Activation recomputation: 'full' recomputes whole layers, 'selective' only core attention.")
    recompute_method: Literal["uniform", "block"] | None = opt(None, "With full recomputation: how layers are grouped (default uniform).")
    recompute_num_layers: int | None = opt(None, "With full recomputation: layers per group (uniform) or recomputed per stage (block); default 1.")
    use_distributed_optimizer: bool = opt(True, "Shard optimizer states over data-parallel ranks (ZeRO-1 style).")
    overlap_grad_reduce: bool = opt(False, "Overlap the gradient reduce with the backward pass.")
    overlap_param_gather: bool = opt(False, "Overlap the parameter all-gather with the forward pass (distributed optimizer only).")
    moe_layer_recompute: bool = opt(False, "Recompute MoE layers in backward to save activation memory.")
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = opt("allgather", "MoE token dispatcher.")
    moe_grouped_gemm: bool = opt(False, "One grouped GEMM for all local experts (needs Transformer Engine).")
    moe_shared_expert_overlap: bool = opt(False, "Overlap shared-expert compute with dispatch (alltoall dispatcher only).")
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"] = opt(
        "aux_loss", "MoE load balancing.")
    moe_aux_loss_coeff: float = opt(0.0, "MoE auxiliary load-balancing loss coefficient.")
    transformer_impl: Literal["auto", "transformer_engine", "local"] = opt(
        "auto", "Layer implementation: Transformer Engine when installed (auto), or megatron-core's local layers.")
    make_vocab_size_divisible_by: int = opt(128, "The embedding is padded to a multiple of this x TP (padding rows never score).")
    transformer_config: dict[str, Any] = opt(factory=dict, help="More megatron-core TransformerConfig fields, passed verbatim.")

    def parallel_sizes(self) -> dict[str, int | None]:
        """The sizes under the names both megatron-core's initialize_model_parallel and
        TransformerConfig use (expert tensor parallel defaults to tensor parallel)."""
        return dict(
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            pipeline_model_parallel_size=self.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=self.virtual_pipeline_model_parallel_size,
            context_parallel_size=self.context_parallel_size,
            expert_model_parallel_size=self.expert_model_parallel_size,
            expert_tensor_parallel_size=self.expert_tensor_parallel_size or self.tensor_model_parallel_size,
        )

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size


STRATEGY_CONFIGS: dict[str, type] = {
    "vllm": VLLMConfig,
    "sglang": SGLangConfig,
    "hf_infer": HFInferConfig,
    "megatron_train": MegatronConfig,
    "megatron_infer": MegatronConfig,
}
# Where a passthrough key lands, for the message.
_PASSTHROUGH = {VLLMConfig: "engine_kwargs", SGLangConfig: "engine_kwargs", MegatronConfig: "transformer_config"}
_ALIASES = {SGLangConfig: {"tp_size": "tensor_parallel_size", "max_model_len": "context_length"}}


def parse_strategy_config(strategy: str, raw: Mapping[str, Any] | None, path: str = "strategy_config") -> Any:
    """The typed config of a GPU backend (None for other backends). Unknown keys go to the
    passthrough field, unless they look like a typo of a known key."""
    cls = STRATEGY_CONFIGS.get(strategy)
    if cls is None:
        return None
    raw = dict(raw or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    aliases = _ALIASES.get(cls, {})
    passthrough_key = _PASSTHROUGH.get(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        key = str(key)
        name = aliases.get(key, key)
        if name in names:
            if name in kwargs:
                raise ConfigError(join_path(path, key), f"given twice (as {name!r} and its alias {key!r})")
            kwargs[name] = convert_value(hints[name], value, join_path(path, key))
            continue
        hint = nearest(key, names)
        if hint is not None and hint != passthrough_key:
            raise ConfigError(join_path(path, key), f"unknown key; did you mean {join_path(path, hint)}?")
        if passthrough_key is None:
            raise ConfigError(join_path(path, key), f"unknown key ({strategy} takes: {', '.join(sorted(names))})")
        extra[key] = value
    if passthrough_key is not None:
        kwargs[passthrough_key] = {**extra, **kwargs.get(passthrough_key, {})}
    config = cls(**kwargs)
    if cls in _CHECKS:
        _CHECKS[cls](config, path)
    return config


def _check_vllm(c: VLLMConfig, path: str) -> None:
    if not 0.0 < c.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"{path}.gpu_memory_utilization", f"must be in (0, 1], got {c.gpu_memory_utilization}")
    _at_least_one(c, path, "block_size", "max_model_len", "tensor_parallel_size", "pipeline_parallel_size",
                  "max_num_seqs", "max_num_batched_tokens")


def _check_hf_infer(c: HFInferConfig, path: str) -> None:
    _at_least_one(c, path, "max_num_seqs", "max_num_batched_tokens")
    if c.prefix_cache_tokens < 0:
        raise ConfigError(f"{path}.prefix_cache_tokens", f"must be >= 0, got {c.prefix_cache_tokens}")


def _check_sglang(c: SGLangConfig, path: str) -> None:
    if c.mem_fraction_static is not None and not 0.0 < c.mem_fraction_static < 1.0:
        raise ConfigError(f"{path}.mem_fraction_static", f"must be in (0, 1), got {c.mem_fraction_static}")
    _at_least_one(c, path, "tensor_parallel_size", "context_length", "max_running_requests")


def _check_megatron(c: MegatronConfig, path: str) -> None:
    _at_least_one(c, path, "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size",
                  "recompute_num_layers", "make_vocab_size_divisible_by")
    if c.virtual_pipeline_model_parallel_size is not None and c.pipeline_model_parallel_size < 2:
        raise ConfigError(f"{path}.virtual_pipeline_model_parallel_size",
                          "needs pipeline_model_parallel_size > 1 (virtual stages interleave real ones)")
    if c.recompute_granularity != "full" and (c.recompute_method is not None or c.recompute_num_layers is not None):
        key = "recompute_method" if c.recompute_method is not None else "recompute_num_layers"
        raise ConfigError(f"{path}.{key}", "applies only with recompute_granularity: full")
    if c.overlap_param_gather and not c.use_distributed_optimizer:
        raise ConfigError(f"{path}.overlap_param_gather", "needs use_distributed_optimizer: true")
    if c.moe_shared_expert_overlap and c.moe_token_dispatcher_type != "alltoall":
        raise ConfigError(f"{path}.moe_shared_expert_overlap", "works only with moe_token_dispatcher_type: alltoall")


def _at_least_one(config: Any, path: str, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"{path}.{name}", f"must be >= 1, got {value}")


_CHECKS = {HFInferConfig: _check_hf_infer, VLLMConfig: _check_vllm, SGLangConfig: _check_sglang, MegatronConfig: _check_megatron}


def check_megatron_world(c: MegatronConfig, world_size: int, path: str) -> None:
    """Parallel sizes against the role's world size, as megatron-core's process-group set-up needs."""
    if world_size % c.model_parallel_size:
        raise ConfigError(path, f"world size {world_size} does not divide by tensor x pipeline x context parallel "
                                f"= {c.model_parallel_size}")
    expert_grid = (c.expert_tensor_parallel_size or c.tensor_model_parallel_size) * c.expert_model_parallel_size \
        * c.pipeline_model_parallel_size
    if world_size % expert_grid:
        raise ConfigError(path, f"world size {world_size} does not divide by expert tensor x expert x pipeline "
                                f"parallel = {expert_grid}")


def check_megatron_model(c: MegatronConfig, num_layers: int, num_heads: int, num_kv_heads: int, path: str,
                         num_experts: int = 0) -> None:
    """Parallel sizes against the model's shape (called once the model config is known)."""
    tp = c.tensor_model_parallel_size
    if num_heads % tp or num_kv_heads % tp:
        raise ConfigError(f"{path}.tensor_model_parallel_size",
                          f"{tp} must divide the model's {num_heads} attention heads and {num_kv_heads} key/value heads")
    stages = c.pipeline_model_parallel_size * (c.virtual_pipeline_model_parallel_size or 1)
    if num_layers % stages:
        raise ConfigError(f"{path}.pipeline_model_parallel_size",
                          f"the model's {num_layers} layers do not split into {stages} (virtual) pipeline stages")
    if num_experts and num_experts % c.expert_model_parallel_size:
        raise ConfigError(f"{path}.expert_model_parallel_size",
                          f"{c.expert_model_parallel_size} must divide the model's {num_experts} experts")
    if not num_experts and c.expert_model_parallel_size > 1:
        raise ConfigError(f"{path}.expert_model_parallel_size", "is > 1 but the model has no experts")


def megatron_global_batch(per_device: int, grad_accum: int, world_size: int, c: MegatronConfig) -> int:
    """Sequences per optimizer step, as ROLL's guide states it: per_device x grad_accum x world /
    (TP x PP x CP); expert parallelism does not divide it (experts share the data-parallel batch)."""
    return per_device * grad_accum * world_size // c.model_parallel_size

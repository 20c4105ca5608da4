"""Scaling ROLL's published example configs down to one CPU and a tiny model, everything else kept."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

from roll.configs import schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "roll_examples"
TRAINING = {"actor_train": "deepspeed_train", "critic": "deepspeed_train"}
INFERENCE = {"actor_infer": "hf_infer", "reference": "hf_infer"}
# vLLM's CPU build sized for the tiny model (its attention kernels need 64-dim heads: see tiny_vllm_model), with the
# block size its CPU attention takes (ROLL's examples ask for 16, a GPU choice)
VLLM_CPU = "{max_model_len: 1024, enforce_eager: true, kv_cache_memory_bytes: 268435456, block_size: null}"


def vllm_cpu_installed() -> bool:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def tiny_vllm_model(folder: Path) -> str:
    """The tiny model with 64-dim heads, which vLLM's CPU attention kernels support (not the 16 of the default)."""
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(folder, hidden_size=128, num_heads=2))


def roll_tree(tmp: Path) -> Path:
    """ROLL's examples/ layout (without our deepspeed pieces: the loader finds those itself)."""
    root = tmp / "examples"
    shutil.copytree(FIXTURES, root, ignore=shutil.ignore_patterns("README.md"))
    return root


def _sized(prefix: str, em: schema.EnvManagerConfig, group_size: int) -> tuple[list[str], int]:
    tags = len(em.tags)
    return [f"{prefix}.num_env_groups={tags}", f"{prefix}.num_groups_partition=[{','.join(['1'] * tags)}]",
            f"{prefix}.group_size={group_size}", f"{prefix}.max_env_num_per_worker=0"], tags * group_size


def tiny_roll_overrides(cfg: schema.PipelineConfig, model: str, out: Path, keep_vllm: bool = False) -> list[str]:
    """Overrides for ``cfg`` (a loaded ROLL example): the tiny model on device 0 with CPU backends (hf_infer
    for inference, deepspeed_train for training), a few short episodes, outputs under ``out``. The algorithm
    keys (estimator, loss, pg_variant, corrections, batching switches, templates) stay as ROLL wrote them.
    ``keep_vllm``: an actor_infer on vllm stays on it (vLLM's CPU build), sized for the tiny model."""
    ov = [f"pretrain={model}", f"reward_pretrain={model}", f"output_dir={out}", f"logging_dir={out}/logs",
          f"render_save_dir={out}/render", f"tracker_kwargs.log_dir={out}/tb",
          "max_steps=1", "save_steps=0", "eval_steps=1", "sequence_length=1024",
          "max_actions_per_traj=2", "max_tokens_per_step=8", "actor_infer.generating_args.max_new_tokens=8"]
    train_ov, rows = _sized("train_env_manager", cfg.train_env_manager, 2)
    val_ov, val_rows = _sized("val_env_manager", cfg.val_env_manager, 1)
    ov += train_ov + val_ov + [f"rollout_batch_size={rows}", f"val_batch_size={val_rows}"]
    if cfg.rollout_mock is not None:
        ov.append(f"rollout_mock.dump_dir={out}/mock")
    for role, strategy in {**TRAINING, **INFERENCE}.items():
        worker = getattr(cfg, role)
        if worker is None or worker.device_mapping is None:
            continue
        config = "null"
        if keep_vllm and role == "actor_infer" and worker.strategy_args.strategy_name == "vllm":
            strategy, config = "vllm", VLLM_CPU
        ov += [f"{role}.device_mapping=[0]", f"{role}.strategy_args.strategy_name={strategy}",
               f"++{role}.strategy_args.strategy_config={config}", f"{role}.model_args.dtype=fp32",
               f"{role}.infer_batch_size=4"]
        if role in TRAINING:
            ov += [f"{role}.training_args.per_device_train_batch_size=2", f"{role}.training_args.gradient_accumulation_steps=1"]
    return ov

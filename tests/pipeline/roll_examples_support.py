"""Scaling ROLL's published example configs down to one CPU and a tiny model, everything else kept."""

from __future__ import annotations

import shutil
from pathlib import Path

from roll.configs import schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "roll_examples"
TRAINING = {"actor_train": "deepspeed_train", "critic": "deepspeed_train"}
INFERENCE = {"actor_infer": "hf_infer", "reference": "hf_infer"}


def roll_tree(tmp: Path) -> Path:
    """ROLL's examples/ layout (without our deepspeed pieces: the loader finds those itself)."""
    root = tmp / "examples"
    shutil.copytree(FIXTURES, root, ignore=shutil.ignore_patterns("README.md"))
    return root


def _sized(prefix: str, em: schema.EnvManagerConfig, group_size: int) -> tuple[list[str], int]:
    tags = len(em.tags)
    return [f"{prefix}.num_env_groups={tags}", f"{prefix}.num_groups_partition=[{','.join(['1'] * tags)}]",
            f"{prefix}.group_size={group_size}", f"{prefix}.max_env_num_per_worker=0"], tags * group_size


def tiny_roll_overrides(cfg: schema.PipelineConfig, model: str, out: Path) -> list[str]:
    """Overrides for ``cfg`` (a loaded ROLL example): the tiny model on device 0 with CPU backends (hf_infer
    for inference, deepspeed_train for training), a few short episodes, outputs under ``out``. The algorithm
    keys (estimator, loss, pg_variant, corrections, batching switches, templates) stay as ROLL wrote them."""
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
        ov += [f"{role}.device_mapping=[0]", f"{role}.strategy_args.strategy_name={strategy}",
               f"++{role}.strategy_args.strategy_config=null", f"{role}.model_args.dtype=fp32", f"{role}.infer_batch_size=4"]
        if role in TRAINING:
            ov += [f"{role}.training_args.per_device_train_batch_size=2", f"{role}.training_args.gradient_accumulation_steps=1"]
    return ov

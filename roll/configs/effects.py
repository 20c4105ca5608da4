"""Keys that a finalized config sets but that do nothing in this run, each with the reason.

Three kinds, each named in the one warning the loader prints:
- keys of the schema with ``inert`` metadata (no effect here at all), set to a non-default value;
- keys of a role that the role does not read (``generating_args`` outside actor_infer,
  ``training_args`` outside the training roles, ...), set to a non-default value;
- keys that only matter in another set-up: a role section that is not started, ``prompt_length``
  when ``sequence_length`` is given.

Keys whose absence would change the loss, the data or the model are errors instead (``derive``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from roll.configs import schema
from roll.configs.derive import needs_critic, needs_reference

TRAINING_ROLES = ("actor_train", "critic")
# role-level keys and the roles that read them (others ignore them)
ROLE_READERS: dict[str, tuple[str, ...]] = {
    "generating_args": ("actor_infer",),
    "training_args": TRAINING_ROLES,
    "model_update_frequency": ("actor_train",),
    "topr_positive_weight": ("actor_train",),
    "topr_negative_weight": ("actor_train",),
    "model_args.disable_gradient_checkpointing": TRAINING_ROLES,
    "infer_batch_size": ("actor_train", "critic", "reference"),
}

# dynamic batching switches and the backends that honour them
DYNAMIC_BATCHING_READERS: dict[str, tuple[str, ...]] = {
    "use_dynamic_batching_in_train": ("deepspeed_train",),
    "use_dynamic_batching_in_infer": ("deepspeed_train", "hf_infer"),
}


def inert_settings(cfg: schema.PipelineConfig, rollout_only: bool = False) -> dict[str, str]:
    """key path -> why it has no effect, for every key ``cfg`` sets that this run does not use."""
    if rollout_only:
        return _rollout_only_inert(cfg)
    out: dict[str, str] = {}
    _inert_fields(cfg, "", out, skip=(*schema.ROLES, "train_env_manager", "val_env_manager"))
    for role in schema.ROLES:
        worker = getattr(cfg, role)
        if worker is None:
            continue
        started = _role_started(cfg, role)
        if started is not True:
            out[role] = started
            continue
        _inert_fields(worker, role, out)
        if worker.training_args.bf16 and worker.strategy_args.strategy_name != "deepspeed_train" and role in TRAINING_ROLES:
            out[f"{role}.training_args.bf16"] = (f"only deepspeed_train autocasts; {worker.strategy_args.strategy_name} "
                                                 "takes its precision from model_args.dtype")
        strategy = worker.strategy_args.strategy_name
        for key, backends in DYNAMIC_BATCHING_READERS.items():
            if getattr(worker, key) and strategy not in backends:
                out[f"{role}.{key}"] = (f"{strategy} cuts micro-batches by rows (dynamic batching: "
                                        f"{', '.join(backends)})")
        for key, readers in ROLE_READERS.items():
            if role not in readers:
                for path, why in _changed(worker, key, role):
                    out.setdefault(path, f"{role} does not read it (only {', '.join(readers)})" + why)
    from roll.configs.shipped import ROLL_PLAIN_ACTORS

    if cfg.actor_train.pg_variant is not None and cfg.actor_train.worker_cls in ROLL_PLAIN_ACTORS:
        out["actor_train.pg_variant"] = (f"{cfg.actor_train.worker_cls} (ROLL's plain actor) does not read it; its "
                                         "loss is the PPO of the top-level keys (ROLL's PG worker reads it)")
    out.update(_infer_lora_keys(cfg))
    if cfg.sequence_length is not None:
        for key in ("prompt_length", "response_length"):
            if _differs(cfg, key):
                out[key] = "sequence_length is set; this key only derives it when it is unset"
    for name in ("train_env_manager", "val_env_manager"):
        _inert_fields(getattr(cfg, name), name, out)
    for tag, entry in cfg.custom_envs.items():
        if entry.demonstrations_per_episode and entry.num_demonstrations == 0:
            out[f"custom_envs.{tag}.demonstrations_per_episode"] = "num_demonstrations is 0: there are no examples to draw"
    return out


def _role_started(cfg: schema.PipelineConfig, role: str) -> bool | str:
    """True, or why the role's section has no effect."""
    if role == "reward":
        return "agentic runs start no reward model: rewards come from the envs"
    if role == "critic" and not needs_critic(cfg):
        return f"not started: only adv_estimator gae uses a critic (this run: {cfg.adv_estimator})"
    if role == "reference" and not needs_reference(cfg):
        return "not started: no KL term uses it (use_kl_loss, add_token_level_kl with init_kl_coef > 0, or enable_reference)"
    return True


def _inert_fields(obj: Any, prefix: str, out: dict[str, str], skip: tuple[str, ...] = ()) -> None:
    """Fields of ``obj`` (recursively) marked ``inert`` in the schema and set to a non-default value."""
    if not dataclasses.is_dataclass(obj):
        return
    default = type(obj)() if _constructible(type(obj)) else None
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        path = f"{prefix}.{f.name}" if prefix else f.name
        if "inert" in f.metadata and default is not None and value != getattr(default, f.name):
            out[path] = f.metadata["inert"]
        elif dataclasses.is_dataclass(value):
            _inert_fields(value, path, out)


def _constructible(cls: type) -> bool:
    return all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
               for f in dataclasses.fields(cls))


def _changed(worker: schema.WorkerConfig, key: str, role: str) -> list[tuple[str, str]]:
    """(path, '') for ``key`` of ``worker`` (a field or a whole section) where it differs from the default."""
    default = schema.WorkerConfig()
    parts = key.split(".")
    value, base = worker, default
    for part in parts:
        value, base = getattr(value, part), getattr(base, part)
    if not dataclasses.is_dataclass(value):
        return [(f"{role}.{key}", "")] if value != base else []
    return [(f"{role}.{key}.{f.name}", "") for f in dataclasses.fields(value) if getattr(value, f.name) != getattr(base, f.name)]


def _differs(obj: Any, name: str) -> bool:
    f = {f.name: f for f in dataclasses.fields(obj)}[name]
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return getattr(obj, name) != default


def _infer_lora_keys(cfg: schema.PipelineConfig) -> dict[str, str]:
    """actor_infer's lora_* keys: the adapter comes from actor_train at each sync; only rank and alpha are read
    (checked to agree with the trainer's), and nothing is read when actor_train trains no adapter."""
    infer, default = cfg.actor_infer.model_args, schema.ModelArgs()
    trained = bool(cfg.actor_train.model_args.lora_target)
    keys = ("lora_target", "lora_dropout") + (() if trained else ("lora_rank", "lora_alpha"))
    why = ("actor_infer takes the trainer's adapter at each weight sync (its lora_rank and lora_alpha are checked "
           "to agree)" if trained else "actor_train trains no LoRA adapter")
    return {f"actor_infer.model_args.{k}": why for k in keys if getattr(infer, k) != getattr(default, k)}


def _rollout_only_inert(cfg: schema.PipelineConfig) -> dict[str, str]:
    """A rollout-only run starts actor_infer and the training envs: role sections, validation and the
    training keys it is given do nothing."""
    why = "a rollout-only run trains nothing (it starts actor_infer and the training envs)"
    out: dict[str, str] = {}
    for role in schema.ROLES:
        worker = getattr(cfg, role)
        if role != "actor_infer" and worker is not None and worker != schema.WorkerConfig():
            out[role] = why
    if cfg.val_env_manager != schema.EnvManagerConfig():
        out["val_env_manager"] = why
    infer = cfg.actor_infer
    _inert_fields(infer, "actor_infer", out)
    return out

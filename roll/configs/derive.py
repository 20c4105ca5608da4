"""Derived values and cross-key checks, computed in this one place.

``finalize`` fills what the user may leave unset (``sequence_length``, world sizes, per-role
model paths, env group partitions, episodes per env) and checks the rules that span several keys
(batch divisibility, strategy names per role, device mapping vs. workers). It raises ConfigError
naming the key path; it never touches the process environment or the file system.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from roll.configs import schema
from roll.configs.device_mapping import parse_device_mapping
from roll.configs.domains import check_domains
from roll.configs.errors import ConfigError, nearest
from roll.configs.strategy_configs import (
    MegatronConfig,
    check_megatron_world,
    megatron_global_batch,
    parse_strategy_config,
)

# Which backends each role may use (import paths of user backends are always allowed).
ROLE_STRATEGIES = {
    "actor_train": schema.TRAIN_STRATEGIES,
    "critic": schema.TRAIN_STRATEGIES,
    "actor_infer": ("hf_infer", "vllm", "sglang"),
    "reference": ("hf_infer", "megatron_infer", "deepspeed_train", "megatron_train"),
    "reward": ("hf_infer", "megatron_infer", "deepspeed_train", "megatron_train"),
}
INFERENCE_ENGINES = ("hf_infer", "vllm", "sglang")


def finalize(cfg: schema.PipelineConfig, rollout_only: bool = False) -> schema.PipelineConfig:
    """Return a copy of ``cfg`` with every derived value filled in and all cross-key rules checked.
    ``rollout_only``: the run plays the training envs with actor_infer and trains nothing (ROLL's
    rollout pipeline), so only actor_infer and the training env manager are checked and derived."""
    cfg = dataclasses.replace(cfg)  # shallow copy; nested parts are replaced below, never mutated
    check_domains(cfg)
    _positive(cfg)
    _check_training_meaning(cfg)
    _check_async(cfg)
    _check_lora(cfg)
    if not rollout_only:
        _check_pg_worker(cfg)
        if cfg.actor_train == schema.WorkerConfig():
            raise ConfigError("actor_train", "no actor_train section: this config trains nothing; to play its envs and "
                              "dump the rollouts only, run examples/start_agentic_rollout_pipeline.py")
    cfg.sequence_length = _sequence_length(cfg)
    if cfg.val_sequence_length is not None and cfg.val_sequence_length < 2:
        raise ConfigError("val_sequence_length", f"must be >= 2 (prompt and reply), got {cfg.val_sequence_length}")
    for role in ROLLOUT_ROLES if rollout_only else schema.ROLES:
        worker = getattr(cfg, role)
        if worker is not None:
            setattr(cfg, role, _finalize_worker(cfg, role, worker))
    _check_required_roles(cfg, ROLLOUT_ROLES if rollout_only else ("actor_train", "actor_infer"))
    cfg.num_nodes = max(cfg.num_nodes, _nodes_needed(cfg))
    cfg.train_env_manager = _finalize_env_manager(cfg, "train_env_manager", train_batch_size(cfg))
    if not rollout_only:
        cfg.val_env_manager = _finalize_env_manager(cfg, "val_env_manager", cfg.val_batch_size)
        _check_train_batch(cfg)
    return cfg


ROLLOUT_ROLES = ("actor_infer",)


def _check_lora(cfg: schema.PipelineConfig) -> None:
    """LoRA and freezing are built for deepspeed_train (ZeRO 0-2) and megatron_train (dense models, megatron's
    local layers) on actor_train; an actor_infer that sets its own lora_* keys must describe the trainer's adapter."""
    for role in ("critic", "reference", "reward"):
        worker = getattr(cfg, role)
        if worker is not None and (worker.model_args.lora_target or worker.model_args.freeze_module_prefix):
            key = "lora_target" if worker.model_args.lora_target else "freeze_module_prefix"
            raise ConfigError(f"{role}.model_args.{key}", "LoRA and freezing train actor_train only")
    train = cfg.actor_train
    ma = train.model_args
    if not (ma.lora_target or ma.freeze_module_prefix):
        return
    key = f"actor_train.model_args.{'lora_target' if ma.lora_target else 'freeze_module_prefix'}"
    strategy, sc = train.strategy_args.strategy_name, train.strategy_args.strategy_config or {}
    if strategy not in ("deepspeed_train", "megatron_train"):
        raise ConfigError(key, f"LoRA and freezing are built for deepspeed_train and megatron_train, not {strategy}")
    if strategy == "megatron_train" and ma.lora_target:
        from roll.configs.megatron_targets import megatron_targets

        try:
            megatron_targets(ma.lora_target)
        except ValueError as e:
            raise ConfigError(key, str(e)) from None
        if sc.get("sequence_parallel") and int(sc.get("tensor_model_parallel_size") or 1) > 1:
            # the adapter's whole halves would see sequence shards; megatron's local layers (what peft wraps)
            # need apex for sequence parallel, so this combination was never run here
            raise ConfigError("actor_train.strategy_args.strategy_config.sequence_parallel", "LoRA on megatron_train "
                              "runs without sequence parallel; set it to false")
        if sc.get("transformer_impl") == "transformer_engine":
            raise ConfigError("actor_train.strategy_args.strategy_config.transformer_impl", "LoRA on megatron_train "
                              "wraps megatron-core's local parallel linears (peft); set it to auto or local")
    stage = (sc.get("zero_optimization") or {}).get("stage", 0)
    if ma.lora_target and stage == 3:
        raise ConfigError(key, "LoRA runs with ZeRO stages 0-2 (the adapter is small: stage 2 shards its optimizer "
                          "state; stage 3 would gather the frozen base weights for every sync)")
    if ma.lora_target and ma.lora_rank < 1:
        raise ConfigError("actor_train.model_args.lora_rank", f"must be >= 1, got {ma.lora_rank}")
    infer = cfg.actor_infer.model_args
    if ma.lora_target and infer.lora_target:
        for name in ("lora_rank", "lora_alpha"):
            mine, theirs = getattr(infer, name), getattr(ma, name)
            if name == "lora_alpha":
                mine, theirs = mine or 2 * infer.lora_rank, theirs or 2 * ma.lora_rank
            if mine != theirs:
                raise ConfigError(f"actor_infer.model_args.{name}", f"is {mine} but actor_train's adapter has {theirs}; "
                                  "actor_infer receives the trainer's adapter")


def _check_async(cfg: schema.PipelineConfig) -> None:
    r = cfg.async_generation_ratio
    if r < 0 or (r > 0 and not float(r).is_integer()):
        raise ConfigError("async_generation_ratio", f"must be 0 (synchronous) or a whole number of steps the rollouts "
                          f"may run ahead of training (1, 2, ...), got {r!r}")


def _check_pg_worker(cfg: schema.PipelineConfig) -> None:
    from roll.configs.shipped import ROLL_PG_WORKER

    if cfg.actor_train.worker_cls == ROLL_PG_WORKER and cfg.actor_train.pg_variant is None:
        raise ConfigError("actor_train.pg_variant", "ROLL's PG worker (actor_train.worker_cls) needs a pg_variant: vanilla, "
                          "ppo, tis, topr, cispo or kimi15")


def train_batch_size(cfg: schema.PipelineConfig) -> int:
    """Trajectories in one training step: rollout_batch_size x num_return_sequences_in_group."""
    return cfg.rollout_batch_size * cfg.num_return_sequences_in_group


def needs_reference(cfg: schema.PipelineConfig) -> bool:
    """Reference log-probs are needed: a KL term uses them (or they are asked for)."""
    return cfg.enable_reference or cfg.use_kl_loss or (cfg.add_token_level_kl and cfg.init_kl_coef > 0)


def lora_run(cfg: schema.PipelineConfig) -> bool:
    return bool(cfg.actor_train.model_args.lora_target)


def reference_from_actor(cfg: schema.PipelineConfig) -> bool:
    """A LoRA run without a reference role of its own: the reference is actor_train with its adapter off."""
    return needs_reference(cfg) and lora_run(cfg) and (cfg.reference is None or cfg.reference.device_mapping is None)


def dual_clip_constant(cfg: schema.PipelineConfig) -> float:
    """The dual-clip bound c: dual_clip_c, or ROLL's 1 + 2 x pg_clip when unset."""
    return cfg.dual_clip_c if cfg.dual_clip_c is not None else 1.0 + 2.0 * cfg.pg_clip


def effective_pg_variant(cfg: schema.PipelineConfig) -> str | None:
    """actor_train's pg_variant as ROLL runs it: ROLL's plain agentic actor worker ignores the key."""
    from roll.configs.shipped import ROLL_PLAIN_ACTORS

    worker = cfg.actor_train
    return None if worker.worker_cls in ROLL_PLAIN_ACTORS else worker.pg_variant


def async_ratio(cfg: schema.PipelineConfig) -> int:
    """Steps the training rollouts may run ahead of the trainer (0: synchronous)."""
    return int(cfg.async_generation_ratio)


def needs_critic(cfg: schema.PipelineConfig) -> bool:
    return cfg.adv_estimator == "gae"


def data_parallel_size(worker: schema.WorkerConfig) -> int:
    """Data-parallel ranks of a (finalized) role: world size over model-parallel sizes for megatron."""
    world = worker.world_size or 1
    typed = parse_strategy_config(worker.strategy_args.strategy_name, worker.strategy_args.strategy_config)
    if isinstance(typed, MegatronConfig):
        return world // typed.model_parallel_size
    return world


def global_train_batch_size(worker: schema.WorkerConfig) -> int:
    """Sequences per optimizer step of a (finalized) training role. DeepSpeed: per_device x grad_accum x
    world size; Megatron: the same over TP x PP x CP (ROLL's guide)."""
    ta = worker.training_args
    typed = parse_strategy_config(worker.strategy_args.strategy_name, worker.strategy_args.strategy_config)
    if isinstance(typed, MegatronConfig):
        return megatron_global_batch(ta.per_device_train_batch_size, ta.gradient_accumulation_steps,
                                     worker.world_size or 1, typed)
    return ta.per_device_train_batch_size * ta.gradient_accumulation_steps * (worker.world_size or 1)


def _positive(cfg: schema.PipelineConfig) -> None:
    for name in ("rollout_batch_size", "num_return_sequences_in_group", "ppo_epochs", "logging_steps", "prompt_length"):
        if getattr(cfg, name) < 1:
            raise ConfigError(name, f"must be >= 1, got {getattr(cfg, name)}")
    if cfg.max_steps < 1:
        raise ConfigError("max_steps", f"must be >= 1 (the number of pipeline steps to run), got {cfg.max_steps}")
    for name in ("save_steps", "eval_steps", "val_batch_size"):
        if getattr(cfg, name) < 0:
            raise ConfigError(name, f"must be >= 0, got {getattr(cfg, name)}")


def agentic_norm_active(norm: schema.RewardNormalizationConfig) -> bool:
    return norm.method != "identity" or norm.norm_mean_type is not None or norm.norm_std_type is not None


def scope_norm_active(cfg: schema.PipelineConfig) -> bool:
    return cfg.reward_norm is not None or cfg.norm_mean_type is not None or cfg.norm_std_type is not None


def _check_training_meaning(cfg: schema.PipelineConfig) -> None:
    """Values that would change the loss, the data or the model if accepted and then not honoured."""
    for key in ("kl_penalty", "kl_loss_type"):
        if getattr(cfg, key) == "full":
            raise ConfigError(key, "'full' (the KL over the whole vocabulary) needs the policy's and the reference's "
                                   "logits at every token, which the workers do not exchange; use kl, mse or low_var_kl")
    if cfg.l2 != 0.0:
        raise ConfigError("l2", "no L2 term is added to the loss here (ROLL defines the key but does not apply it "
                                "either); use actor_train.training_args.weight_decay")
    if cfg.dual_clip_loss and dual_clip_constant(cfg) <= 1.0:
        raise ConfigError("dual_clip_c", f"the dual-clip constant must be > 1, got {dual_clip_constant(cfg)}")
    if agentic_norm_active(cfg.reward_normalization) and scope_norm_active(cfg):
        raise ConfigError("reward_norm", "two reward normalisations are configured (reward_normalization and the "
                                         "top-level reward_norm / norm_mean_type / norm_std_type); keep one")
    for role in schema.ROLES:
        worker = getattr(cfg, role)
        if worker is not None and worker.generating_args.num_beams != 1:
            raise ConfigError(f"{role}.generating_args.num_beams", "beam search is not used for RL rollouts; "
                                                                    f"only 1 is accepted, got {worker.generating_args.num_beams}")


def _sequence_length(cfg: schema.PipelineConfig) -> int:
    if cfg.sequence_length is not None:
        if cfg.sequence_length < 1:
            raise ConfigError("sequence_length", f"must be >= 1, got {cfg.sequence_length}")
        return cfg.sequence_length
    if cfg.response_length is None:
        raise ConfigError("sequence_length", "set sequence_length, or response_length (sequence_length = prompt_length + response_length)")
    return cfg.prompt_length + cfg.response_length


def _finalize_worker(cfg: schema.PipelineConfig, role: str, worker: schema.WorkerConfig) -> schema.WorkerConfig:
    worker = dataclasses.replace(worker)
    strategy = worker.strategy_args.strategy_name
    _check_strategy(role, strategy)

    default_model = cfg.pretrain if role in ("actor_train", "actor_infer", "reference") else cfg.reward_pretrain or cfg.pretrain
    if worker.model_args.model_name_or_path is None and default_model is not None:
        worker.model_args = dataclasses.replace(worker.model_args, model_name_or_path=default_model)

    if worker.data_args.prompt is not None and worker.data_args.messages is not None:
        raise ConfigError(f"{role}.data_args.messages", "conflicts with data_args.prompt; set only one of them")

    typed = parse_strategy_config(strategy, worker.strategy_args.strategy_config, f"{role}.strategy_args.strategy_config")
    if strategy in ("vllm", "sglang"):
        _engine_devices(role, worker, strategy, typed)
    elif strategy not in INFERENCE_ENGINES and "." not in strategy:
        worker.num_gpus_per_worker = 1  # training ranks hold one device each (parallelism is inside the strategy)
    if worker.num_gpus_per_worker < 1:
        raise ConfigError(f"{role}.num_gpus_per_worker", f"must be >= 1, got {worker.num_gpus_per_worker}")

    devices = parse_device_mapping(worker.device_mapping, f"{role}.device_mapping")
    worker.device_mapping = devices
    if devices is None:
        return worker
    if len(devices) % worker.num_gpus_per_worker:
        raise ConfigError(
            f"{role}.device_mapping",
            f"{len(devices)} devices do not divide by num_gpus_per_worker={worker.num_gpus_per_worker}",
        )
    world = len(devices) // worker.num_gpus_per_worker
    if worker.world_size is not None and worker.world_size != world:
        raise ConfigError(
            f"{role}.world_size",
            f"is {worker.world_size} but device_mapping ({len(devices)} devices / num_gpus_per_worker="
            f"{worker.num_gpus_per_worker}) gives {world}",
        )
    worker.world_size = world
    if isinstance(typed, MegatronConfig):
        check_megatron_world(typed, world, f"{role}.device_mapping")
    return worker


_ENGINE_PARALLEL_KEYS = {"vllm": ("tensor_parallel_size", "pipeline_parallel_size"), "sglang": ("tensor_parallel_size", "tp_size")}


def _engine_devices(role: str, worker: schema.WorkerConfig, strategy: str, typed: Any) -> None:
    """Devices of one inference engine. ROLL's way: num_gpus_per_worker, which becomes the engine's
    tensor parallel size. Set through strategy_config instead, the sizes there decide and a
    num_gpus_per_worker other than 1 must agree with them."""
    raw = dict(worker.strategy_args.strategy_config or {})
    if not any(k in raw for k in _ENGINE_PARALLEL_KEYS[strategy]):
        raw["tensor_parallel_size"] = worker.num_gpus_per_worker
        worker.strategy_args = dataclasses.replace(worker.strategy_args, strategy_config=raw)
        return
    per_engine = typed.tensor_parallel_size * getattr(typed, "pipeline_parallel_size", 1)
    if worker.num_gpus_per_worker not in (1, per_engine):
        raise ConfigError(f"{role}.num_gpus_per_worker",
                          f"is {worker.num_gpus_per_worker} but strategy_config gives {per_engine} devices per engine "
                          "(tensor x pipeline parallel); set one of them")
    worker.num_gpus_per_worker = per_engine


def _check_strategy(role: str, strategy: str) -> None:
    allowed = ROLE_STRATEGIES[role]
    if strategy in allowed or "." in strategy:  # a dotted name is a user backend's import path
        return
    path = f"{role}.strategy_args.strategy_name"
    if strategy in schema.STRATEGY_NAMES:
        raise ConfigError(path, f"{strategy!r} cannot serve {role}; use one of {', '.join(allowed)}")
    hint = nearest(strategy, schema.STRATEGY_NAMES)
    suffix = f"; did you mean {hint!r}?" if hint else ""
    raise ConfigError(path, f"unknown strategy {strategy!r} (known: {', '.join(schema.STRATEGY_NAMES)}){suffix}")


def _check_required_roles(cfg: schema.PipelineConfig, required: tuple[str, ...]) -> None:
    for role in required:
        if getattr(cfg, role).device_mapping is None:
            raise ConfigError(f"{role}.device_mapping", "required: the devices this role runs on, e.g. '[0]' or 'list(range(0,8))'")
    if "actor_train" not in required:
        return
    if needs_critic(cfg) and (cfg.critic is None or cfg.critic.device_mapping is None):
        raise ConfigError("critic.device_mapping", "required because adv_estimator is 'gae' (it needs a value model)")
    if needs_reference(cfg) and not reference_from_actor(cfg) and (cfg.reference is None or cfg.reference.device_mapping is None):
        why = "use_kl_loss is true" if cfg.use_kl_loss else (
            "enable_reference is true" if cfg.enable_reference else "add_token_level_kl is on with init_kl_coef > 0")
        raise ConfigError("reference.device_mapping", f"required because {why}")


def _nodes_needed(cfg: schema.PipelineConfig) -> int:
    # roles a rollout-only run does not finalize keep their unparsed mapping and are not placed
    mappings = [getattr(cfg, role).device_mapping for role in schema.ROLES if getattr(cfg, role) is not None]
    ids = [d for m in mappings if isinstance(m, list) for d in m]
    if cfg.num_gpus_per_node < 1:
        raise ConfigError("num_gpus_per_node", f"must be >= 1, got {cfg.num_gpus_per_node}")
    return max(1, math.ceil((max(ids) + 1) / cfg.num_gpus_per_node)) if ids else 1


def _finalize_env_manager(cfg: schema.PipelineConfig, name: str, batch: int) -> schema.EnvManagerConfig:
    em = dataclasses.replace(getattr(cfg, name))
    for key in ("num_env_groups", "group_size"):
        if getattr(em, key) < 1:
            raise ConfigError(f"{name}.{key}", f"must be >= 1, got {getattr(em, key)}")
    if em.group_size_redundancy < 0:
        raise ConfigError(f"{name}.group_size_redundancy", f"must be >= 0, got {em.group_size_redundancy}")
    if em.group_filter_max_resamples < 0:
        raise ConfigError(f"{name}.group_filter_max_resamples", f"must be >= 0, got {em.group_filter_max_resamples}")
    if not em.tags:
        raise ConfigError(f"{name}.tags", "must name at least one env tag from custom_envs")
    for i, tag in enumerate(em.tags):
        if tag not in cfg.custom_envs:
            hint = nearest(tag, cfg.custom_envs)
            suffix = f"; did you mean {hint!r}?" if hint else f" (custom_envs has: {', '.join(cfg.custom_envs) or 'nothing'})"
            raise ConfigError(f"{name}.tags[{i}]", f"env tag {tag!r} is not in custom_envs{suffix}")
    if em.num_groups_partition is None:
        share, extra = divmod(em.num_env_groups, len(em.tags))
        em.num_groups_partition = [share + (1 if i < extra else 0) for i in range(len(em.tags))]
    if len(em.num_groups_partition) != len(em.tags):
        raise ConfigError(
            f"{name}.num_groups_partition",
            f"has {len(em.num_groups_partition)} entries but tags has {len(em.tags)}",
        )
    if sum(em.num_groups_partition) != em.num_env_groups:
        raise ConfigError(
            f"{name}.num_groups_partition",
            f"sums to {sum(em.num_groups_partition)} but num_env_groups is {em.num_env_groups}",
        )
    num_envs = em.num_env_groups * em.group_size
    batch_key = "rollout_batch_size" if name == "train_env_manager" else "val_batch_size"
    if batch and batch % em.group_size:
        raise ConfigError(batch_key, f"{batch} trajectories do not divide into groups of {name}.group_size={em.group_size}")
    if name == "val_env_manager" and batch and batch % num_envs:
        raise ConfigError(
            "val_batch_size", f"{batch} does not divide by the {num_envs} validation envs (num_env_groups x group_size)"
        )
    per_env = math.ceil(batch / num_envs) if batch else 0
    if em.max_traj_per_env < 0:
        em.max_traj_per_env = per_env
    elif em.max_traj_per_env < per_env:
        raise ConfigError(
            f"{name}.max_traj_per_env",
            f"is {em.max_traj_per_env}, but {batch_key}={batch} over {num_envs} envs needs at least {per_env}",
        )
    return em


def _check_train_batch(cfg: schema.PipelineConfig) -> None:
    batch = train_batch_size(cfg)
    for role in ("actor_train", "critic"):
        worker = getattr(cfg, role)
        if worker is None or worker.device_mapping is None:
            continue
        dp = data_parallel_size(worker)
        if batch % dp:
            raise ConfigError(
                "rollout_batch_size",
                f"the training batch of {batch} trajectories does not divide over {role}'s {dp} data-parallel workers",
            )
        ta = worker.training_args
        for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            if getattr(ta, key) < 1:
                raise ConfigError(f"{role}.training_args.{key}", f"must be >= 1, got {getattr(ta, key)}")

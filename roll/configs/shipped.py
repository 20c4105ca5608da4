"""What a config asks for that this project does not ship, refused in one line before anything else.

ROLL's configs name env types, env managers, agent runners, worker classes and backends by ROLL's
own import paths. The ones we implement map to ours (``ROLL_CLASSES``); the rest stop the load with
one line naming the feature and what we offer instead. This runs on the composed mapping before the
typed build, so a config for a feature we lack is told that first, not about a key it also uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roll.configs.errors import ConfigError

_ROLL = "roll.pipeline."
TRAJ_MANAGER = "roll.agentic.env_managers.trajectory.TrajEnvManager"
STEP_MANAGER = "roll.agentic.env_managers.step.StepEnvManager"
STEP_CONCAT_MANAGER = "roll.agentic.env_managers.step.StepConcatEnvManager"
ACTOR_WORKER = "roll.workers.actor_train.ActorTrainWorker"

# ROLL class path -> ours, for the classes we implement with the same meaning.
ROLL_CLASSES: dict[str, str] = {
    "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager": TRAJ_MANAGER,
    "roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager": STEP_MANAGER,
    "roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager": STEP_CONCAT_MANAGER,
    # ROLL's agentic actor workers: the PPO loss of the top-level keys, or the pg_variant losses
    "roll.pipeline.agentic.agentic_actor_worker.ActorWorker": ACTOR_WORKER,
    "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker": ACTOR_WORKER,
    "roll.pipeline.base_worker.ActorWorker": ACTOR_WORKER,
    "roll.pipeline.base_worker.CriticWorker": "roll.workers.critic.CriticWorker",
    "roll.pipeline.agentic.environment_worker.EnvironmentWorker": "roll.agentic.rollout.EnvManagerHost",
    "roll.pipeline.agentic.agentic_pipeline.GroupFilter": "roll.agentic.group_filters.GroupFilter",
}
# Our own classes a config may name, with the kind each is (preflight.class_bases): the preflight accepts these
# without importing them, so that --dry_run of a shipped config needs neither torch nor Ray
# (tests/configs/test_shipped_classes.py imports each and checks its kind).
SHIPPED_CLASSES: dict[str, str] = {
    ACTOR_WORKER: "worker",
    "roll.workers.actor_infer.ActorInferWorker": "worker",
    "roll.workers.critic.CriticWorker": "worker",
    "roll.workers.reference.ReferenceWorker": "worker",
    "roll.agentic.rollout.EnvManagerHost": "env_manager_worker",
    TRAJ_MANAGER: "env_manager",
    STEP_MANAGER: "env_manager",
    STEP_CONCAT_MANAGER: "env_manager",
    "roll.agentic.env_managers.base.TrajEnvManager": "env_manager",
    "roll.agentic.group_filters.GroupFilter": "group_filter",
    "roll.agentic.group_filters.DropUniformRewards": "group_filter",
}
ROLL_PG_WORKER = "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker"
# ROLL's actor workers that do not read pg_variant (their loss is the PPO of the top-level keys)
ROLL_PLAIN_ACTORS = ("roll.pipeline.agentic.agentic_actor_worker.ActorWorker", "roll.pipeline.base_worker.ActorWorker")

# Backends ROLL has and we do not, with what to use instead.
_STRATEGIES = {
    "fsdp2_train": "use deepspeed_train (ZeRO-3 shards parameters, gradients and optimizer state as FSDP does) "
                   "or megatron_train",
    "fsdp2_infer": "use hf_infer, vllm or sglang",
    "fsdp_train": "use deepspeed_train or megatron_train",
    "diffusion_deepspeed_train": "diffusion models are not shipped",
}

_MANAGER_HINT = (f"shipped env managers: {TRAJ_MANAGER}, {STEP_MANAGER} and {STEP_CONCAT_MANAGER} (ROLL's paths of "
                 "these three also work)")


def roll_class(path: str) -> str:
    """Our import path for ``path`` (ROLL's path of a class we implement), else ``path`` unchanged."""
    return ROLL_CLASSES.get(path, path)


def check_shipped(data: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first feature ``data`` (the composed config) uses that is not shipped."""
    for role in ("actor_train", "actor_infer", "critic", "reference", "reward"):
        worker = data.get(role)
        if not isinstance(worker, Mapping):
            continue
        strategy = (worker.get("strategy_args") or {}).get("strategy_name")
        if isinstance(strategy, str) and strategy in _STRATEGIES:
            raise ConfigError(f"{role}.strategy_args.strategy_name", f"the {strategy} backend is not shipped; {_STRATEGIES[strategy]}")
        _check_roll_class(f"{role}.worker_cls", worker.get("worker_cls"), "worker class")
    envs = data.get("custom_envs") or {}
    for manager in ("train_env_manager", "val_env_manager"):
        em = data.get(manager)
        if not isinstance(em, Mapping):
            continue
        _check_roll_class(f"{manager}.worker_cls", em.get("worker_cls"), "env-manager worker")
        _check_manager(f"{manager}.env_manager_cls", em.get("env_manager_cls"))
        if manager == "val_env_manager" and not _validation_runs(data):
            continue
        for tag in em.get("tags") or []:
            entry = envs.get(tag) if isinstance(envs, Mapping) else None
            if isinstance(entry, Mapping):
                _check_env_entry(f"custom_envs.{tag}", entry)


def _validation_runs(data: Mapping[str, Any]) -> bool:
    eval_steps, val_batch = data.get("eval_steps", 10), data.get("val_batch_size", 128)
    return not (isinstance(eval_steps, int) and eval_steps <= 0) and not (isinstance(val_batch, int) and val_batch <= 0)


def _check_roll_class(path: str, value: Any, what: str) -> None:
    if isinstance(value, str) and value.startswith(_ROLL) and value not in ROLL_CLASSES:
        raise ConfigError(path, f"ROLL's {what} {value} is not shipped; leave the key unset for the built-in one")


def _check_manager(path: str, value: Any) -> None:
    if isinstance(value, str) and value.startswith(_ROLL) and value not in ROLL_CLASSES:
        kind = value.rsplit(".", 1)[-1]
        why = {"VLTrajEnvManager": "vision-language env managers are not shipped (text envs only)",
               "ProxyEnvManager": "ROLL's agent-runner env manager is not shipped",
               "AgentNativeStepEnvManager": "ROLL's agent-native env manager is not shipped"}.get(kind, f"ROLL's {kind} is not shipped")
        raise ConfigError(path, f"{why}; {_MANAGER_HINT}")


def _check_env_entry(path: str, entry: Mapping[str, Any]) -> None:
    runner = entry.get("agent_runner_cls")
    if runner is not None:
        raise ConfigError(f"{path}.agent_runner_cls", f"agent runners ({runner}) are not shipped; set it to null: the env "
                          "manager (env_manager_cls) runs each episode")
    _check_tool_ids(f"{path}.tool_wrapper", entry.get("tool_wrapper"))
    if "pre_step_template" in entry:
        raise ConfigError(f"{path}.pre_step_template", "vision-language env prompts are not shipped (text envs only)")
    _check_manager(f"{path}.env_manager_cls", entry.get("env_manager_cls"))
    env_type = entry.get("env_type")
    if isinstance(env_type, str) and entry.get("entry_point") is None and not _env_known(env_type):
        from envs.registration import SHIPPED

        family = env_type.split(":", 1)[0] if ":" in env_type and "." not in env_type else None
        kind = f"GEM's {family}: envs are" if family else f"env type {env_type!r} is"
        raise ConfigError(f"{path}.env_type", f"{kind} not shipped (shipped: {', '.join(sorted(SHIPPED))}); register "
                          "your own with gymnasium.register or give entry_point: 'pkg.module:Class'")


def _check_tool_ids(path: str, tool_wrapper: Any) -> None:
    """Tools we do not ship (ROLL's mcp, ...) are named at once; the shipped ones are built and checked with the
    env (roll.preflight)."""
    from envs.tools.tool_wrapper import REFUSED_TOOL_IDS, TOOL_IDS

    if not isinstance(tool_wrapper, Mapping):
        return
    for i, config in enumerate(tool_wrapper.get("tool_configs") or []):
        tool_id = config.get("tool_id") if isinstance(config, Mapping) else None
        if isinstance(tool_id, str) and tool_id not in TOOL_IDS:
            why = REFUSED_TOOL_IDS.get(tool_id, f"tool id {tool_id!r} is not shipped")
            raise ConfigError(f"{path}.tool_configs[{i}].tool_id", f"{why} (shipped tool ids: {', '.join(TOOL_IDS)})")


def _env_known(env_type: str) -> bool:
    """Registered (shipped or by the user's import), a GEM id (checked when the env is built), or an importable
    'pkg.module:Class' path."""
    import gymnasium as gym

    from envs.gem_adapter import is_gem_id
    from envs.registration import register_envs

    if is_gem_id(env_type):
        return True
    register_envs()
    if env_type in gym.registry:
        return True
    module, sep, _ = env_type.partition(":")
    return bool(sep) and "." in module

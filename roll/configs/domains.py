"""Value domains of config keys, checked when a config loads (pure: the values alone decide).

Each rule names the key path and what it accepts, so a bad value stops ``--dry_run`` with exit 2
instead of failing later inside a worker or running with nonsense.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any

from roll.configs import schema
from roll.configs.errors import ConfigError

TEMPLATE_FIELDS = {"observation", "turn_idx", "actions_left", "max_response_length", "suffix"}
# ROLL's step-wise prompt (one user message holding the recent history), read by the step-wise manager
STEP_TEMPLATE_FIELDS = {"env_instruction", "step_count", "history_length", "history", "current_step",
                        "current_observation", "max_response_length"}


def check_domains(cfg: schema.PipelineConfig) -> None:
    for name in ("exp_name", "output_dir"):
        if not str(getattr(cfg, name) or "").strip():
            raise ConfigError(name, "must not be empty")
    if cfg.pretrain is not None and not str(cfg.pretrain).strip():
        raise ConfigError("pretrain", "must not be empty (unset it, or name a model)")
    _positive_number("rpc_timeout", cfg.rpc_timeout)
    _positive_number("node_join_timeout", cfg.node_join_timeout)
    _positive_number("env_monitor.monitor_interval", cfg.env_monitor.monitor_interval)
    _positive_number("env_monitor.hung_timeout", cfg.env_monitor.hung_timeout)
    _finite("max_grad_norm", cfg.max_grad_norm, low=0.0)
    if isinstance(cfg.resume_from_checkpoint, str) and cfg.resume_from_checkpoint.strip().lower() in ("", "0", "1"):
        raise ConfigError("resume_from_checkpoint", "must be true, false or a checkpoint folder path, "
                                                    f"got {cfg.resume_from_checkpoint!r}")
    for role in schema.ROLES:
        worker = getattr(cfg, role, None)
        if worker is not None:
            _check_worker(role, worker)
    for name in ("train_env_manager", "val_env_manager"):
        em = getattr(cfg, name)
        if em.generating_args is not None:
            _check_generating(f"{name}.generating_args", em.generating_args)
        _finite(f"{name}.env_step_timeout", em.env_step_timeout, low=0.0)
        _finite(f"{name}.episode_timeout", em.episode_timeout, low=0.0)
        _finite(f"{name}.min_healthy_share", em.min_healthy_share, low=0.0, high=1.0)
        if em.max_env_retries < 0:
            raise ConfigError(f"{name}.max_env_retries", f"must be >= 0, got {em.max_env_retries}")
    for tag, entry in cfg.custom_envs.items():
        _check_env_entry(f"custom_envs.{tag}", entry)
    _check_step_templates(cfg)


def _check_step_templates(cfg: schema.PipelineConfig) -> None:
    """The step-wise history placeholders need the step-wise manager, which renders them."""
    from roll.configs.shipped import TRAJ_MANAGER, roll_class

    for name in ("train_env_manager", "val_env_manager"):
        em = getattr(cfg, name)
        for tag in em.tags:
            entry = cfg.custom_envs.get(tag)
            if entry is None or not entry.agent_template:
                continue
            manager = roll_class(entry.env_manager_cls or em.env_manager_cls or TRAJ_MANAGER)
            step_only = _template_names(entry.agent_template) & (STEP_TEMPLATE_FIELDS - TEMPLATE_FIELDS)
            if manager == TRAJ_MANAGER and step_only:
                raise ConfigError(f"custom_envs.{tag}.agent_template", f"{{{sorted(step_only)[0]}}} is rendered by the "
                                  "step-wise manager only (env_manager_cls: ...StepEnvManager); the trajectory manager "
                                  "fills {observation}, {turn_idx}, {actions_left}, {max_response_length}")


def _check_worker(role: str, worker: schema.WorkerConfig) -> None:
    if worker.model_args.model_name_or_path is not None and not str(worker.model_args.model_name_or_path).strip():
        raise ConfigError(f"{role}.model_args.model_name_or_path", "must not be empty")
    if worker.infer_batch_size < 1:
        raise ConfigError(f"{role}.infer_batch_size", f"must be >= 1, got {worker.infer_batch_size}")
    if worker.model_update_frequency < 1:
        raise ConfigError(f"{role}.model_update_frequency", f"must be >= 1, got {worker.model_update_frequency}")
    ta = worker.training_args
    _finite(f"{role}.training_args.learning_rate", ta.learning_rate, low=0.0)
    _finite(f"{role}.training_args.weight_decay", ta.weight_decay, low=0.0)
    _finite(f"{role}.training_args.adam_epsilon", ta.adam_epsilon, low=0.0, strict=True)
    for beta in ("adam_beta1", "adam_beta2"):
        _finite(f"{role}.training_args.{beta}", getattr(ta, beta), low=0.0, high=1.0)
    _finite(f"{role}.training_args.warmup_ratio", ta.warmup_ratio, low=0.0, high=1.0)
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if getattr(ta, name) < 1:
            raise ConfigError(f"{role}.training_args.{name}", f"must be >= 1, got {getattr(ta, name)}")
    if ta.warmup_steps < 0:
        raise ConfigError(f"{role}.training_args.warmup_steps", f"must be >= 0, got {ta.warmup_steps}")
    _check_generating(f"{role}.generating_args", worker.generating_args)


def _check_generating(path: str, g: schema.GeneratingArgs) -> None:
    if g.max_new_tokens is not None and g.max_new_tokens < 1:
        raise ConfigError(f"{path}.max_new_tokens", f"must be >= 1, got {g.max_new_tokens}")
    _finite(f"{path}.temperature", g.temperature, low=0.0)
    _finite(f"{path}.top_p", g.top_p, low=0.0, high=1.0, strict=True)
    _finite(f"{path}.repetition_penalty", g.repetition_penalty, low=0.0, strict=True)
    if g.top_k < -1:
        raise ConfigError(f"{path}.top_k", f"must be -1 (off), 0 (off) or a positive count, got {g.top_k}")
    if g.include_stop_str_in_output is False:
        raise ConfigError(f"{path}.include_stop_str_in_output", "false is not supported: the env reads every sampled "
                          "token, a stop string included, and the training row holds exactly what was sampled; "
                          "set true or remove the key")


def _check_env_entry(path: str, entry: schema.CustomEnvConfig) -> None:
    if not str(entry.env_type or "").strip():
        raise ConfigError(f"{path}.env_type", "must not be empty")
    if entry.max_steps < 1:
        raise ConfigError(f"{path}.max_steps", f"must be >= 1, got {entry.max_steps}")
    if entry.max_tokens_per_step < 1:
        raise ConfigError(f"{path}.max_tokens_per_step", f"must be >= 1, got {entry.max_tokens_per_step}")
    if entry.num_demonstrations < 0:
        raise ConfigError(f"{path}.num_demonstrations", f"must be >= 0, got {entry.num_demonstrations}")
    if entry.agent_template:  # the only text that is str.format-ed (the system prompt is used as written)
        _check_template(f"{path}.agent_template", entry.agent_template, TEMPLATE_FIELDS | STEP_TEMPLATE_FIELDS)
        names = _template_names(entry.agent_template)
        if names & (STEP_TEMPLATE_FIELDS - TEMPLATE_FIELDS) and names & (TEMPLATE_FIELDS - STEP_TEMPLATE_FIELDS):
            raise ConfigError(f"{path}.agent_template", "mixes the per-turn placeholders ({observation}, {turn_idx}, "
                              "{actions_left}) with the step-wise history ones ({history}, {current_observation}, ...)")
    pattern = (entry.env_config or {}).get("action_pattern")
    if pattern is not None:
        try:
            re.compile(str(pattern))
        except re.error as e:
            raise ConfigError(f"{path}.env_config.action_pattern", f"is not a valid regular expression ({e})") from None


def _template_names(template: str) -> set[str]:
    try:
        return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}
    except ValueError:
        return set()


def _check_template(path: str, template: str, fields: set[str]) -> None:
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as e:
        raise ConfigError(path, f"is not a valid format template ({e}); write {{{{ and }}}} for literal braces") from None
    unknown = sorted(n for n in names if n.split(".")[0].split("[")[0] not in fields)
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(path, f"unknown placeholder {{{unknown[0]}}} (known: {known}; write {{{{ and }}}} for literal braces)")


def _positive_number(path: str, value: Any) -> None:
    _finite(path, value, low=0.0, strict=True)


def _finite(path: str, value: Any, low: float | None = None, high: float | None = None, strict: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(path, f"must be a finite number, got {value!r}")
    if low is not None and (value < low or (strict and value == low)):
        raise ConfigError(path, f"must be {'>' if strict else '>='} {low:g}, got {value!r}")
    if high is not None and value > high:
        raise ConfigError(path, f"must be <= {high:g}, got {value!r}")

"""Value domains of config keys, checked when a config loads (pure: the values alone decide).

Each rule names the key path and what it accepts, so a bad value stops ``--dry_run`` with exit 2
instead of failing later inside a worker or running with nonsense.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from typing import Any

from roll.configs import schema
from roll.configs.errors import ConfigError, nearest

TEMPLATE_FIELDS = {"observation", "turn_idx", "actions_left", "max_response_length", "suffix"}
# ROLL's step-wise prompt (one user message holding the recent history), read by the step-wise manager
STEP_TEMPLATE_FIELDS = {"env_instruction", "step_count", "history_length", "history", "current_step",
                        "current_observation", "max_response_length"}


def check_numbers(obj: Any, prefix: str = "") -> None:
    """Every number of a config (dataclasses, their lists and dicts, recursively): finite, an integer within
    INT_LIMIT, and inside the domain its schema field names. Free-form mappings (env_config, strategy_config)
    are the env's or the backend's to check."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        domain = f.metadata.get("domain")
        if dataclasses.is_dataclass(value):
            check_numbers(value, f"{path}.")
        elif isinstance(value, dict):  # named sections (custom_envs); free-form mappings hold no dataclasses
            for tag, entry in value.items():
                if dataclasses.is_dataclass(entry):
                    check_numbers(entry, f"{path}.{tag}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    check_numbers(item, f"{path}[{i}].")
                elif _is_number(item):
                    _check_number(f"{path}[{i}]", item, domain)
        elif _is_number(value):
            _check_number(path, value, domain)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(path: str, value: float, domain: schema.Domain | None) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path, f"must be a finite number, got {value!r}")
    if isinstance(value, int) and abs(value) > schema.INT_LIMIT:
        raise ConfigError(path, f"must be within +-2**53, got an integer of {len(str(abs(value)))} digits")
    if domain is not None and not domain.holds(value):
        raise ConfigError(path, f"must be {domain.describe()}, got {value!r}")


# per-row keys a rollout batch carries (and the scopes advantage.grouping_ids knows): what grouping may name
ROW_GROUPINGS = ("batch", "state", "inductive", "traj_group_id", "traj_id", "tags", "env_id", "state_hash")
ATTENTION = ("eager", "sdpa", "fa", "fa2", "flash_attention_2", "flash_attention_3", "flex_attention")


def check_domains(cfg: schema.PipelineConfig) -> None:
    check_numbers(cfg)
    grouping = cfg.reward_normalization.grouping
    if grouping not in ROW_GROUPINGS:
        hint = nearest(grouping, ROW_GROUPINGS)
        raise ConfigError("reward_normalization.grouping", f"{grouping!r} is no per-row key of a rollout batch "
                          f"(one of {', '.join(ROW_GROUPINGS)})" + (f"; did you mean {hint!r}?" if hint else ""))
    for name in ("exp_name", "output_dir"):
        if not str(getattr(cfg, name) or "").strip():
            raise ConfigError(name, "must not be empty")
    if cfg.pretrain is not None and not str(cfg.pretrain).strip():
        raise ConfigError("pretrain", "must not be empty (unset it, or name a model)")
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
    attn = worker.model_args.attn_implementation
    if attn is not None and attn not in ATTENTION:
        hint = nearest(str(attn), ATTENTION)
        raise ConfigError(f"{role}.model_args.attn_implementation", f"unknown kernel {attn!r} (one of "
                          f"{', '.join(ATTENTION)})" + (f"; did you mean {hint!r}?" if hint else ""))
    stops = worker.generating_args.stop_strings or []
    if any(not str(x) for x in stops):  # an empty stop string ends every generation at once
        raise ConfigError(f"{role}.generating_args.stop_strings", "must not contain an empty string")
    _check_generating(f"{role}.generating_args", worker.generating_args)


def _check_generating(path: str, g: schema.GeneratingArgs) -> None:
    if g.include_stop_str_in_output is False:
        raise ConfigError(f"{path}.include_stop_str_in_output", "false is not supported: the env reads every sampled "
                          "token, a stop string included, and the training row holds exactly what was sampled; "
                          "set true or remove the key")


def _check_env_entry(path: str, entry: schema.CustomEnvConfig) -> None:
    if not str(entry.env_type or "").strip():
        raise ConfigError(f"{path}.env_type", "must not be empty")
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
        parsed = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ConfigError(path, f"is not a valid format template ({e}); write {{{{ and }}}} for literal braces") from None
    for name, spec, conv in parsed:
        # a spec such as {observation:>99999999999999999999} would build a huge string at every turn
        if spec:
            raise ConfigError(path, f"{{{name}:{spec}}}: format specs are not supported; write the placeholder bare")
        if conv not in (None, "s", "r"):
            raise ConfigError(path, f"{{{name}!{conv}}}: unknown conversion (only !s and !r exist)")
        if "." in name or "[" in name:  # {observation.__class__...} reads objects' internals
            raise ConfigError(path, f"{{{name}}}: attribute and index access are not supported; write the placeholder bare")
    names = {name for name, _, _ in parsed}
    unknown = sorted(n for n in names if n.split(".")[0].split("[")[0] not in fields)
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(path, f"unknown placeholder {{{unknown[0]}}} (known: {known}; write {{{{ and }}}} for literal braces)")

"""Turn a plain (already resolved) mapping into the typed schema, naming the key path of any error.

Unknown keys are errors with the nearest valid key, except ROLL keys listed in ``roll_compat``
(accepted, reported back as no-effect keys) and, at the top level, helper keys the caller allows
(values used only as ``${...}`` interpolation sources or brought in by shared ``defaults`` pieces).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from roll.configs import schema
from roll.configs.errors import ConfigError, join_path, nearest
from roll.configs.roll_compat import NO_EFFECT, REFUSED

# Which roll_compat section a dataclass's unknown keys are looked up in.
_SECTION = {
    schema.PipelineConfig: "pipeline",
    schema.WorkerConfig: "worker",
    schema.ModelArgs: "model_args",
    schema.TrainingArgs: "training_args",
    schema.DataArgs: "data_args",
    schema.GeneratingArgs: "generating_args",
    schema.StrategyArgs: "strategy_args",
    schema.EnvManagerConfig: "env_manager",
    schema.CustomEnvConfig: "custom_env",
    schema.RewardNormalizationConfig: "reward_normalization",
}

# Alternative spellings used by ROLL's guide: alias -> canonical field, per dataclass.
ALIASES: dict[type, dict[str, str]] = {
    schema.EnvManagerConfig: {"env_groups": "num_env_groups", "n_groups": "num_groups_partition"},
    schema.CustomEnvConfig: {"history_length": "history_window"},
}


@dataclasses.dataclass
class BuildReport:
    """What the builder accepted without effect (ROLL keys) and which helper keys it skipped."""

    no_effect: dict[str, str] = dataclasses.field(default_factory=dict)  # key path -> why
    helper_keys: list[str] = dataclasses.field(default_factory=list)


def build_config(
    data: Mapping[str, Any], *, allowed_helper_keys: typing.Container[str] = (), report: BuildReport | None = None
) -> schema.PipelineConfig:
    """Build a PipelineConfig from a resolved mapping (no derived values computed yet)."""
    report = report if report is not None else BuildReport()
    return _build_dataclass(schema.PipelineConfig, data, "", report, allowed_helper_keys)


def convert_value(tp: Any, value: Any, path: str) -> Any:
    """Check and convert one value to a schema type, naming ``path`` on error."""
    return _convert(tp, value, path, BuildReport())


def _build_dataclass(cls: type, data: Any, path: str, report: BuildReport, helpers: typing.Container[str] = ()) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(path or "<root>", f"expected a mapping of keys, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    aliases = ALIASES.get(cls, {})
    section = _SECTION.get(cls, "")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        key_path = join_path(path, key)
        name = aliases.get(key, key)
        if name in fields:
            if name in kwargs:
                raise ConfigError(key_path, f"given twice (as {name!r} and its alias {key!r})")
            kwargs[name] = _convert(hints[name], value, key_path, report)
        elif key in REFUSED.get(section, {}):
            refusal = REFUSED[section][key]
            if not refusal.is_off(value):
                raise ConfigError(key_path, refusal.reason)
        elif key in NO_EFFECT.get(section, {}):
            report.no_effect[key_path] = NO_EFFECT[section][key]
        elif not path and key in helpers:
            report.helper_keys.append(key)
        else:
            hint = nearest(key, list(fields) + list(aliases))
            suffix = f"; did you mean {join_path(path, hint)}?" if hint else ""
            raise ConfigError(key_path, f"unknown key{suffix}")
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(join_path(path, name), "required key is missing")
    return cls(**kwargs)


def _convert(tp: Any, value: Any, path: str, report: BuildReport) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for alt in (a for a in args if a is not type(None)):
            try:
                return _convert(alt, value, path, report)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(path, f"expected {_type_name(tp)}, got {_show(value)}")
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        hint = nearest(str(value), [str(a) for a in args]) if isinstance(value, str) else None
        suffix = f"; did you mean {hint!r}?" if hint else ""
        raise ConfigError(path, f"must be one of {', '.join(repr(a) for a in args)}, got {_show(value)}{suffix}")
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, path, report)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {_show(value)}")
        (item,) = args or (Any,)
        return [_convert(item, v, f"{path}[{i}]", report) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"expected a mapping, got {_show(value)}")
        _, item = args or (Any, Any)
        return {str(k): _convert(item, v, join_path(path, str(k)), report) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, f"expected true or false, got {_show(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(path, f"expected an integer, got {_show(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, f"expected a number, got {_show(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # names such as exp_name=123 given on the command line
        raise ConfigError(path, f"expected a string, got {_show(value)}")
    raise TypeError(f"schema type {tp!r} at {path} is not handled by the config builder")


def _show(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}..." if len(text) > 60 else text


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))

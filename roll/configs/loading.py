"""Load a config: Hydra compose -> resolved mapping -> typed schema -> derived values.

Loading is pure: it sets no environment variables, creates no directories and appends no
timestamps. Every problem surfaces as one ConfigError naming the key path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from roll.configs import schema
from roll.configs.build import ALIASES, BuildReport, build_config
from roll.configs.derive import finalize
from roll.configs.effects import inert_settings
from roll.configs.errors import ConfigError, nearest
from roll.configs.yaml_bounds import check_config_files

DEFAULT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "config"

_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


@dataclasses.dataclass
class LoadedConfig:
    config: schema.PipelineConfig
    config_dir: Path
    config_name: str
    inert: dict[str, str]  # key path -> why it has no effect in this run (one warning names them all)
    helper_keys: list[str]  # top-level interpolation sources / shared-piece keys that are not config keys

    def warning(self) -> str | None:
        """The one warning line naming every key set without effect, with the reason, or None."""
        if not self.inert:
            return None
        keys = "; ".join(f"{k} ({why})" for k, why in sorted(self.inert.items()))
        return f"keys without effect in this run (see docs/config.md): {keys}"


def resolve_config_dir(config_path: str | os.PathLike[str] | None, search_roots: Sequence[Path] = ()) -> Path:
    """``config_path`` relative to the working directory (or absolute); ROLL-style paths relative to
    one of ``search_roots`` (e.g. the ``examples/`` folder beside the entry script) also work."""
    if config_path is None:
        return DEFAULT_CONFIG_DIR
    path = Path(config_path).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, *(root / path for root in search_roots)]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    raise ConfigError("--config_path", f"folder {str(config_path)!r} does not exist (looked in: {', '.join(map(str, candidates))})")


def load_config(
    config_name: str,
    config_path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    search_roots: Sequence[Path] = (),
    rollout_only: bool = False,
) -> LoadedConfig:
    """Compose ``config_name`` from ``config_path`` with Hydra ``overrides`` and return the typed,
    finalized config (``rollout_only``: for a run that plays the envs and trains nothing). Raises
    ConfigError for any problem."""
    config_dir = resolve_config_dir(config_path, search_roots)
    config_name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    primary = config_dir / f"{config_name}.yaml"
    if not primary.is_file():
        names = [p.relative_to(config_dir).with_suffix("").as_posix() for p in config_dir.rglob("*.yaml")]
        hint = nearest(config_name, names)
        suffix = f"; did you mean {hint!r}?" if hint else ""
        raise ConfigError("--config_name", f"no {config_name}.yaml in {config_dir}{suffix}")

    if not primary.read_text(encoding="utf-8", errors="replace").strip():
        raise ConfigError(str(primary), "the config file is empty")
    check_config_files(primary, config_dir)  # size, depth and alias bounds before Hydra reads anything
    base = _compose(config_dir, config_name, ())
    overrides = _checked_overrides(base, overrides)
    composed = _compose(config_dir, config_name, overrides) if overrides else base

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from roll.configs.shipped import check_shipped

    try:
        data = OmegaConf.to_container(composed, resolve=True)
    except OmegaConfBaseException as e:
        check_shipped(_leniently_resolved(composed))  # a missing feature is the first thing to say
        raise ConfigError(_key_of(e), f"cannot resolve: {_first_line(e)}") from None
    _check_sections(data, schema.PipelineConfig, "")
    check_shipped(data)

    report = BuildReport()
    helpers = _helper_keys(composed, primary, overrides)
    aliases = _unused_aliases(composed, helpers)
    cfg = build_config(data, allowed_helper_keys=helpers | set(aliases), report=report)
    cfg = finalize(cfg, rollout_only)
    inert = {**report.no_effect, **inert_settings(cfg, rollout_only), **aliases}
    return LoadedConfig(cfg, config_dir, config_name, inert, report.helper_keys)


def _leniently_resolved(node: Any) -> Any:
    """The composed config as plain data, with every value that fails to resolve (an unset environment
    variable, a missing key) replaced by None."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig):
        keys = list(node.keys())
        return {str(k): _leniently_resolved(_get_or_none(node, k)) for k in keys}
    if isinstance(node, ListConfig):
        return [_leniently_resolved(_get_or_none(node, i)) for i in range(len(node))]
    return node


def _get_or_none(node: Any, key: Any) -> Any:
    from omegaconf.errors import OmegaConfBaseException

    try:
        return node[key]
    except (OmegaConfBaseException, KeyError, ValueError):
        return None


def _compose(config_dir: Path, config_name: str, overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with warnings.catch_warnings():
            # ROLL's configs omit `_self_` in their defaults; Hydra then composes the main file last,
            # which is what they rely on, so the upgrade notice is noise for them.
            warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`.*")
            # Our examples/config is searched after the config's own tree: ROLL removed its deepspeed_zero*.yaml
            # pieces, so a ROLL config naming ../config/deepspeed_zero2 finds ours (its own files come first).
            searchpath = f"hydra.searchpath=[file://{DEFAULT_CONFIG_DIR}]"
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                return compose(config_name=config_name, overrides=[*overrides, searchpath])
    except (HydraException, OmegaConfBaseException) as e:
        cause = _yaml_cause(e)
        if cause is not None:
            raise _yaml_error(cause, config_dir, config_name) from None
        raise ConfigError(_key_of(e) or config_name, _first_line(e)) from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise _yaml_error(e, config_dir, config_name) from None


def _yaml_cause(e: BaseException) -> BaseException | None:
    """The YAML or decoding error behind a Hydra/OmegaConf exception, if that is what it wraps."""
    seen = e
    for _ in range(8):
        if isinstance(seen, (yaml.YAMLError, UnicodeDecodeError)):
            return seen
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            return None
        seen = nxt
    return None


def _yaml_error(e: BaseException, config_dir: Path, config_name: str) -> ConfigError:
    """One line naming the file, line and column of a YAML problem."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is not None:
        problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
        return ConfigError(f"{mark.name}:{mark.line + 1}:{mark.column + 1}", f"YAML: {problem}")
    if isinstance(e, UnicodeDecodeError):
        files = [config_dir / f"{config_name}.yaml", *sorted(config_dir.rglob("*.yaml"))]
        bad = next((f for f in files if f.is_file() and not _is_utf8(f)), None)
        return ConfigError(str(bad or config_dir), "YAML: not UTF-8 text (a binary or mis-encoded file)")
    return ConfigError(config_name, f"YAML: {_first_line(e)}")


def _is_utf8(path: Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _checked_overrides(base: Any, overrides: Sequence[str]) -> list[str]:
    """Check each plain ``key=value`` override and return the overrides to compose.

    A key the composed config lacks but the schema defines (``actor_infer.num_gpus_per_worker``,
    a whole ``critic`` section, a key inside a free-form mapping such as ``strategy_config``) is
    turned into Hydra's force-add form, so users never need Hydra's ``+`` for valid keys. Any other
    missing key is an error naming the nearest valid key.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    result = []
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except HydraException as e:
            raise ConfigError(text, f"cannot parse override: {_first_line(e)}") from None
        plain = not (override.is_add() or override.is_force_add() or override.is_delete() or override.package is not None)
        key = override.key_or_group
        if plain:
            # custom_envs.<tag> is usually `${custom_env.<tag>}`: a key below it is set on the catalog entry
            # it points at, or Hydra would replace the whole entry with that one key.
            target = _through_interpolation(base, key)
            if target != key:
                key, text = target, f"{target}={text.split('=', 1)[1]}"
        if not plain or OmegaConf.select(base, key, default=_MISSING) is not _MISSING:
            result.append(text)
            continue
        parts = key.split(".")
        schema_parts = ["custom_envs", *parts[1:]] if parts[0] == "custom_env" else parts  # the catalog's entries
        # a catalog entry (custom_env.<tag>) takes every key a custom_envs entry takes, as in ROLL
        if _schema_node(schema_parts) is not None:
            result.append(f"++{text}")  # env_config and strategy_config take any key; the env checks its own
            continue
        parent = ".".join(parts[:-1])
        node = OmegaConf.select(base, parent, default=None) if parent else base
        siblings = [str(k) for k in node.keys()] if hasattr(node, "keys") else []
        hint = nearest(parts[-1], siblings + _schema_fields(parts[:-1]))
        where = f"{parent}." if parent else ""
        suffix = f"; did you mean {where}{hint}?" if hint else ""
        raise ConfigError(key, f"unknown key{suffix}")
    return result


def _through_interpolation(base: Any, key: str) -> str:
    """``key`` with its longest prefix that is a plain ``${other.path}`` interpolation replaced by the path."""
    from omegaconf import OmegaConf

    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent, name = ".".join(parts[: cut - 1]), parts[cut - 1]
        node = OmegaConf.select(base, parent, default=None) if parent else base
        if node is None or not OmegaConf.is_config(node) or OmegaConf.is_list(node) or name not in node:
            continue
        raw = node._get_node(name)._value() if hasattr(node, "_get_node") else None
        if isinstance(raw, str):
            match = re.fullmatch(r"\$\{([A-Za-z0-9_.]+)\}", raw)
            if match:
                return ".".join([match.group(1), *parts[cut:]])
    return key


_MISSING = object()
_FREE = object()  # inside a free-form mapping (strategy_config, env_config, ...): any key is valid
_LEAF = object()


def _schema_node(parts: Sequence[str]) -> Any:
    """The schema dataclass at a key path, _FREE inside a free-form mapping, _LEAF for a plain
    value, or None where the schema has no such key."""
    node: Any = schema.PipelineConfig
    free_name_next = False  # the previous part was a mapping of user-chosen names (custom_envs.<tag>)
    for part in parts:
        if node is _FREE:
            return _FREE
        if free_name_next:
            free_name_next = False
            continue
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node)
        part = ALIASES.get(node, {}).get(part, part)  # ROLL's other spellings (history_length, env_groups)
        if part not in hints:
            return None
        node, free_name_next = _unwrap(hints[part])
    return node


def _check_sections(data: Any, node: Any, prefix: str) -> None:
    """Where the schema has a section (a dataclass), the config holds a mapping or null: ``strategy_args: hf_infer``
    is one line naming the key, before anything reads the section as a mapping."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(node):
        return
    hints = typing.get_type_hints(node)
    for key, value in data.items():
        if key not in hints or value is None:
            continue
        inner, named = _unwrap(hints[key])
        path = f"{prefix}{key}"
        if not dataclasses.is_dataclass(inner):
            continue
        tp = hints[key]
        if any(typing.get_origin(a) is list for a in (tp, *typing.get_args(tp))):  # a list of sections
            if not isinstance(value, list):
                raise ConfigError(path, f"must be a list of mappings, got {type(value).__name__} {str(value)[:60]!r}")
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise ConfigError(f"{path}[{i}]", f"must be a mapping of keys, got {type(item).__name__}")
                _check_sections(item, inner, f"{path}[{i}].")
            continue
        if not isinstance(value, dict):
            raise ConfigError(path, f"must be a mapping of keys, got {type(value).__name__} {str(value)[:60]!r}")
        for name, item in value.items() if named else [(None, value)]:
            if named and item is not None and not isinstance(item, dict):
                raise ConfigError(f"{path}.{name}", f"must be a mapping of keys, got {type(item).__name__} {str(item)[:60]!r}")
            _check_sections(item, inner, f"{path}.{name}." if named else f"{path}.")


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(schema node, whether the next key part is a user-chosen name) for a field's type."""
    for arg in (tp, *typing.get_args(tp)):
        if dataclasses.is_dataclass(arg):
            return arg, False
        if typing.get_origin(arg) is dict:
            args = typing.get_args(arg)
            value_type = args[1] if args else Any
            if dataclasses.is_dataclass(value_type):
                return value_type, True
            return _FREE, False
    return _LEAF, False


def _schema_fields(parts: Sequence[str]) -> list[str]:
    node = _schema_node(parts)
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def _helper_keys(composed: Any, primary: Path, overrides: Sequence[str]) -> set[str]:
    """Top-level keys allowed although they are not config keys: those used as ``${...}`` sources,
    and those that only shared ``defaults`` pieces bring in (their libraries of reusable values,
    such as unused ``deepspeed_zero3``). A key written in the main file or an override is not."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(composed, resolve=False)
    referenced = set(_referenced_roots(_strings(raw)))
    main_file = OmegaConf.load(primary)
    own = {str(k) for k in main_file.keys()} - {"defaults", "hydra"}
    own |= {o.split("=", 1)[0].lstrip("+~").split(".", 1)[0] for o in overrides}
    return referenced | ({str(k) for k in composed.keys()} - own)


def _unused_aliases(composed: Any, helpers: set[str]) -> dict[str, str]:
    """Top-level keys that are not config keys and only copy another key (``x: ${y}``) while nothing refers to
    them (ROLL's files leave such helpers behind): accepted, and named in the load warning. A name close to a
    config key is not taken for one: it stays the typo error that names the key it was probably meant to be."""
    from omegaconf import OmegaConf

    from roll.configs.errors import nearest

    raw = OmegaConf.to_container(composed, resolve=False)
    known = {f.name for f in dataclasses.fields(_schema_node([]))}
    out = {}
    for key, value in raw.items():
        key = str(key)
        if key in known or key in helpers or not isinstance(value, str) or nearest(key, known):
            continue
        if _INTERPOLATION.fullmatch(value.strip()):
            out[key] = f"a helper key that copies {value.strip()} and that nothing refers to"
    return out


def _strings(node: Any) -> Iterable[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def _referenced_roots(texts: Iterable[str]) -> Iterable[str]:
    for text in texts:
        for expr in _INTERPOLATION.findall(text):
            if ":" in expr or expr.startswith("."):  # resolvers and relative references name no root key
                continue
            yield expr.split(".", 1)[0].split("[", 1)[0].strip()


def _first_line(e: BaseException) -> str:
    """The error's message on one line (Hydra puts the reason on later lines)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return " ".join(lines[:3]) if lines else type(e).__name__


def _key_of(e: BaseException) -> str:
    key = getattr(e, "full_key", None)
    return str(key) if key else ""

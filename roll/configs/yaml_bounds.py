"""Bounds on the YAML files a config is composed from, checked before Hydra reads them.

YAML can describe far more than it spells out: nested aliases expand exponentially (a ten-line "billion
laughs" file), and deep nesting exhausts the parser's recursion. A config file is held to 1 MiB, a nesting
depth of 64 and 20,000 values once aliases are expanded, and its top level must be a mapping. Each violation is
one ConfigError naming FILE:LINE:COL. Other YAML errors are left to Hydra, which reports them the same way.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from roll.configs.errors import ConfigError

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 20_000  # ROLL's largest example has under 1,000; Hydra takes ~1 s per 5,000
MAX_FILES = 200


def check_config_files(primary: Path, config_dir: Path) -> None:
    """The primary config file and every file its defaults lists name (recursively), where they exist here."""
    pending, seen = [primary], set()
    while pending and len(seen) < MAX_FILES:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        root = check_yaml_file(path)
        pending += _defaults_files(root, path, config_dir)


def check_yaml_file(path: Path) -> yaml.Node | None:
    """Check one file against the bounds; returns its composed node tree (None: empty, or an error Hydra reports)."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ConfigError(f"{path}:1:1", f"YAML: the file has {size:,} bytes; a config file may have at most 1 MiB")
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError):
        return None  # Hydra reads the file next and names the problem with its line and column
    except RecursionError:
        raise ConfigError(f"{path}:1:1", f"YAML: nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    if root is None:
        return None
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else f"the single value {str(root.value)[:40]!r}"
        raise ConfigError(_where(path, root), f"YAML: the top level must be a mapping of keys, got {kind}")
    _check_shape(path, root)
    return root


def _check_shape(path: Path, root: yaml.Node) -> None:
    """Depth and alias-expanded size: nodes met again through an alias count again, computed once each."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise ConfigError(_where(path, node), f"YAML: nested deeper than {MAX_DEPTH} levels")
        if id(node) in sizes:
            return sizes[id(node)]
        total = 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                total += size(key, depth + 1) + size(value, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item, depth + 1)
        if total > MAX_NODES:
            raise ConfigError(_where(path, node), f"YAML: holds more than {MAX_NODES:,} values, counting what "
                              "aliases (*name) repeat; a config needs far fewer")
        sizes[id(node)] = total
        return total

    size(root, 0)


def _where(path: Path, node: yaml.Node) -> str:
    mark = node.start_mark
    return f"{path}:{mark.line + 1}:{mark.column + 1}"


def _defaults_files(root: yaml.Node | None, path: Path, config_dir: Path) -> list[Path]:
    """The files a Hydra defaults list names: ``name`` / ``name@package`` / ``{group: option}`` entries."""
    if not isinstance(root, yaml.MappingNode):
        return []
    entries = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "defaults"), None)
    if not isinstance(entries, yaml.SequenceNode):
        return []
    names = []
    for entry in entries.value:
        if isinstance(entry, yaml.ScalarNode):
            names.append(str(entry.value))
        elif isinstance(entry, yaml.MappingNode):
            for key, value in entry.value:
                if isinstance(key, yaml.ScalarNode) and isinstance(value, yaml.ScalarNode):
                    group = str(key.value).removeprefix("override ").split("@")[0]
                    names.append(f"{group}/{value.value}")
    out = []
    for name in names:
        name = name.split("@")[0].strip()
        if not name or name == "_self_":
            continue
        for base in (config_dir, path.parent) if name.startswith("/") else (path.parent, config_dir):
            candidate = (base / (name.lstrip("/") + ".yaml")).resolve()
            if candidate.is_file():
                out.append(candidate)
                break
    return out

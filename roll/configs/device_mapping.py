"""Parse ``device_mapping`` strings without ``eval``.

Accepted forms: ``list(range(0,8))``, ``list(range(0,16,2))``, ``range(4)``, ``[0,1,2,3]``,
``0,1,2``, a single ``3``, a YAML list of ints, or ``None`` (the role uses no device).
"""

from __future__ import annotations

import re

from roll.configs.errors import ConfigError

_INT = r"\s*(-?\d+)\s*"
_RANGE = re.compile(rf"^\s*(?:list\s*\(\s*)?range\s*\({_INT}(?:,{_INT})?(?:,{_INT})?\)\s*(?:\)\s*)?$")
_BRACKETS = re.compile(r"^\s*\[(.*)\]\s*$")
_INT_LIST = re.compile(r"^\s*\d+\s*(?:,\s*\d+\s*)*,?\s*$")
# More devices than any cluster a config could describe; bounds the work done on a typo like range(10**8).
MAX_DEVICES = 65536


def parse_device_mapping(value: object, path: str = "device_mapping") -> list[int] | None:
    """Return the list of global device ids named by ``value``.

    Raises ConfigError naming ``path`` for anything that is not one of the accepted forms,
    for negative ids, and for duplicates.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a device list such as 'list(range(0,8))', got {value!r}")
    if isinstance(value, int):
        ids = [value]
    elif isinstance(value, (list, tuple, str)) and len(value) > 8 * MAX_DEVICES:
        raise ConfigError(path, f"a device list of {len(value):,} entries or characters is too long")
    elif isinstance(value, (list, tuple)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(path, f"expected a list of integer device ids, got {list(value)!r}")
        ids = list(value)
    elif isinstance(value, str):
        ids = _parse_string(value, path)
    else:
        raise ConfigError(path, f"expected a device list such as 'list(range(0,8))', got {value!r}")
    _check(ids, value, path)
    return ids


def _parse_string(text: str, path: str) -> list[int]:
    m = _RANGE.match(text)
    if m:
        # A dangling ")" or a missing one makes the text something other than list(range(...)).
        if text.count("(") != text.count(")"):
            raise _bad(text, path)
        a, b, c = (int(x) if x is not None else None for x in m.groups())
        start, stop, step = (0, a, 1) if b is None else (a, b, 1 if c is None else c)
        if step == 0:
            raise ConfigError(path, f"range step must not be 0 in {text!r}")
        if len(range(start, stop, step)) > MAX_DEVICES:  # counted without building the list
            raise ConfigError(path, f"{text!r} names {len(range(start, stop, step)):,} devices (at most {MAX_DEVICES:,})")
        return list(range(start, stop, step))
    m = _BRACKETS.match(text)
    inner = m.group(1) if m else text
    if inner.strip() == "" and m:
        return []
    if _INT_LIST.match(inner):
        return [int(x) for x in inner.split(",") if x.strip()]
    raise _bad(text, path)


def _bad(text: str, path: str) -> ConfigError:
    return ConfigError(
        path,
        f"cannot parse {text!r}; use 'list(range(start,stop[,step]))', '[0,1,2,3]' or '0,1,2'",
    )


def _check(ids: list[int], original: object, path: str) -> None:
    if not ids:
        raise ConfigError(path, f"{original!r} names no device; leave device_mapping unset instead")
    if any(i < 0 for i in ids):
        raise ConfigError(path, f"device ids must be >= 0, got {ids}")
    if any(i >= MAX_DEVICES for i in ids):
        raise ConfigError(path, f"device ids must be < {MAX_DEVICES}, got {max(ids)}")
    if len(set(ids)) != len(ids):
        raise ConfigError(path, f"device ids must be unique, got {ids}")

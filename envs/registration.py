"""Gymnasium registration of the shipped envs, and creation of any env by id or import path.

A user's env needs only a normal ``gymnasium.register``; or, so it also works inside Ray workers
that never imported the user's module, an ``entry_point`` import path in config, which
``make_env`` registers on first use.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import gymnasium as gym

SHIPPED = {
    "sokoban": "envs.sokoban.env:SokobanEnv",
    "frozen_lake": "envs.frozen_lake:FrozenLakeEnv",
    "sokoban_tool": "envs.tools.sokoban_tool:SokobanToolEnv",
    "countdown": "envs.tools.countdown:CountdownEnv",
    "digits": "envs.toy:DigitsEnv",
    "faulty": "envs.faults:FaultyEnv",  # raises / hangs on purpose (robustness checks)
}


def register_envs() -> None:
    """Register the shipped envs under their ids (idempotent)."""
    for env_id, entry_point in SHIPPED.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)


def load_entry_point(path: str, base: type | tuple[type, ...] | None = None) -> Any:
    """Import ``pkg.module:Name`` (or ``pkg.module.Name``). With ``base``, the object must be a class derived
    from it: a config naming ``os.system`` or ``subprocess:Popen`` is refused before anything is called."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"entry point {path!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"entry point {path!r}: cannot import {module_name!r} ({e})") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"entry point {path!r}: {module_name!r} has no {attr!r}") from None
    if base is not None:
        check_kind(path, target, base)
    return target


def check_kind(path: str, target: Any, base: type | tuple[type, ...]) -> None:
    """``target`` is a class derived from ``base`` (one of them, for a tuple); else ValueError naming both."""
    bases = base if isinstance(base, tuple) else (base,)
    if inspect.isclass(target) and issubclass(target, bases):
        return
    what = (f"the class {target.__module__}.{target.__qualname__}" if inspect.isclass(target)
            else f"{'a function' if callable(target) else 'an object'} of type {type(target).__name__}")
    wanted = " or ".join(f"{b.__module__}.{b.__qualname__}" for b in bases)
    raise ValueError(f"entry point {path!r} is {what}, not a subclass of {wanted}")


def make_env(env_type: str, entry_point: str | None = None, **kwargs: Any) -> gym.Env:
    """Create the env registered as ``env_type`` with constructor ``kwargs``.

    ``env_type`` may also be an import path (``pkg.mod:Class``). An unregistered ``env_type`` with an
    ``entry_point`` is registered first. Unknown ids and constructor arguments the env does not take
    raise ValueError naming the env.
    """
    register_envs()
    if entry_point is None and env_type not in gym.registry:
        from envs.gem_adapter import is_gem_id

        if is_gem_id(env_type):  # GEM's ids (game:..., rg:..., roll_math, ...) go to GEM's own registry
            return _make_gem(env_type, kwargs)
    if env_type not in gym.registry and entry_point is None and (":" in env_type or "." in env_type):
        # An import path as env_type: Gymnasium reads "module:id" in ids, so build the class directly.
        target = load_entry_point(env_type, gym.Env)
        _check_kwargs(env_type, target, kwargs)
        return target(**kwargs)
    if env_type not in gym.registry:
        if entry_point is None:
            raise ValueError(f"env type {env_type!r} is not registered (shipped text envs: {', '.join(sorted(SHIPPED))}); "
                             "register it with gymnasium.register or give an entry_point")
        load_entry_point(entry_point, gym.Env)  # fail now, with the path in the message, not deep inside gym.make
        gym.register(id=env_type, entry_point=entry_point, disable_env_checker=True)
    spec = gym.spec(env_type)
    target = spec.entry_point if callable(spec.entry_point) else load_entry_point(spec.entry_point, gym.Env)
    _check_kwargs(env_type, target, kwargs)
    return gym.make(env_type, **kwargs).unwrapped


def _make_gem(env_type: str, kwargs: dict[str, Any]) -> gym.Env:
    from envs.gem_adapter import GemEnv

    return GemEnv(env_type, **kwargs)


def _check_kwargs(env_type: str, target: Any, kwargs: dict[str, Any]) -> None:
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        accepted = ", ".join(n for n in params if n != "self")
        raise ValueError(f"env {env_type!r} does not take {', '.join(map(repr, unknown))} (it takes: {accepted})")

"""Strategy name -> class, imported lazily (GPU backends import only where they can run)."""

from __future__ import annotations

import importlib
from typing import Any

from roll.configs.errors import ConfigError, nearest
from roll.strategies.backends import check_backend

BUILTIN: dict[str, str] = {
    "hf_infer": "roll.strategies.hf_infer:HFInferStrategy",
    "deepspeed_train": "roll.strategies.deepspeed_train:DeepSpeedTrainStrategy",
    "vllm": "roll.strategies.vllm:VLLMStrategy",
    "sglang": "roll.strategies.sglang:SGLangStrategy",
    "megatron_train": "roll.strategies.megatron_train:MegatronTrainStrategy",
    "megatron_infer": "roll.strategies.megatron_train:MegatronInferStrategy",
}


class StrategyRegistry:
    """Names a config may use for ``strategy_args.strategy_name``; users add their own."""

    def __init__(self) -> None:
        self._paths: dict[str, str | type] = dict(BUILTIN)

    def register(self, name: str, target: str | type) -> None:
        self._paths[name] = target

    def names(self) -> list[str]:
        return sorted(self._paths)

    def resolve(self, name: str, role: str = "") -> type:
        """The strategy class for ``name`` (a registered name or an import path 'pkg.mod.Class')."""
        where = f"{role}.strategy_args.strategy_name" if role else "strategy_name"
        target = self._paths.get(name)
        if target is None and "." not in name:
            hint = nearest(name, self._paths)
            raise ConfigError(where, f"unknown strategy {name!r}" + (f"; did you mean {hint!r}?" if hint else ""))
        check_backend(name, where)  # CUDA, package and version of the GPU backends
        if isinstance(target, type):
            return target
        return _import(target or name, where)


def _import(path: str, where: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(where, f"cannot import {module_name!r} for strategy {path!r}: {e}") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ConfigError(where, f"{module_name!r} has no {attr!r}") from None
    from envs.registration import check_kind
    from roll.strategies.base import InferenceStrategy, TrainStrategy

    try:
        check_kind(path, target, (InferenceStrategy, TrainStrategy))  # the rule every class path a config names follows
    except ValueError as e:
        raise ConfigError(where, str(e)) from None
    return target


def default_registry() -> StrategyRegistry:
    return StrategyRegistry()

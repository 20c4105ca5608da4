"""An env that misbehaves on purpose, to check that a run survives envs that raise or hang.

``FaultyEnv`` wraps any registered text env (``inner``, built with ``inner_config``) and, on each
``step``, raises with probability ``raise_rate`` or blocks for ``hang_s`` seconds with probability
``hang_rate`` (both 0 by default: a plain wrapper until told to misbehave); otherwise it is the
inner env. Faults are drawn from the system's entropy, so an episode retried on a fresh env is not
doomed to fail the same way.
"""

from __future__ import annotations

import random
import time
from typing import Any

import gymnasium as gym


class InjectedFault(RuntimeError):
    """The failure FaultyEnv raises on purpose."""


class FaultyEnv(gym.Env):
    def __init__(self, inner: str = "sokoban", inner_config: dict[str, Any] | None = None, raise_rate: float = 0.0,
                 hang_rate: float = 0.0, hang_s: float = 3600.0, **inner_kwargs: Any) -> None:
        from envs.registration import make_env

        self.inner = make_env(inner, None, **{**dict(inner_config or {}), **inner_kwargs})
        self.raise_rate, self.hang_rate, self.hang_s = float(raise_rate), float(hang_rate), float(hang_s)
        self.rng = random.Random()
        self.metric_aggregation = getattr(self.inner, "metric_aggregation", {})
        self.observation_space = self.inner.observation_space
        self.action_space = self.inner.action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict[str, Any]]:
        return self.inner.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        draw = self.rng.random()
        if draw < self.hang_rate:
            time.sleep(self.hang_s)
        elif draw < self.hang_rate + self.raise_rate:
            raise InjectedFault("injected env failure")
        return self.inner.step(action)

    def render_rgb(self) -> Any:
        return self.inner.render_rgb()

    def __getattr__(self, name: str) -> Any:  # instruction(), demonstrations(), ... come from the inner env
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

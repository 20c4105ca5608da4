"""Reference policies played on exactly the validation episodes (same env entries, same seeds): uniform random
moves and the env's own solver. They frame the validation curve: a policy is learning the task when its success
leaves the random line's interval, not when one eval happens to beat the last."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from envs.parsing import THINK_ACTION_PATTERN
from roll.agentic.env_managers.base import EpisodeRequest
from roll.algorithms.intervals import wilson_interval

log = logging.getLogger(__name__)
POLICIES = ("random", "solver")


def answer(env: Any, action: str) -> str:
    """A reply the env reads as ``action`` under its action pattern."""
    if getattr(env, "action_pattern", None) == THINK_ACTION_PATTERN:
        return f"<think></think><answer>{action}</answer>"
    return f"<answer>{action}</answer>"


def play(request: EpisodeRequest, policy: str, seed: int) -> float | None:
    """Success (0 or 1) of one episode under ``policy``; None where the env has no action list or no solver."""
    from envs.registration import make_env

    entry = request.slot.entry
    if entry.get("tool_wrapper"):
        return None
    env = make_env(entry["env_type"], entry.get("entry_point"), **dict(entry.get("env_config") or {}))
    try:
        names = list(env.action_vocabulary())
    except (NotImplementedError, AttributeError):
        return None
    rng = random.Random(seed)
    env.reset(seed=request.seed)
    info: dict[str, Any] = {}
    for _ in range(int(entry.get("max_steps", 10))):
        try:
            action = rng.choice(names) if policy == "random" else env.expert_action()
        except (NotImplementedError, AttributeError):
            return None
        except ValueError:  # the solver sees no way forward from here (a dead end)
            break
        _, _, terminated, truncated, info = env.step(answer(env, action))
        if terminated or truncated:
            break
    return float((info.get("metrics") or {}).get("success", env.is_success()))


def baseline_metrics(requests: list[EpisodeRequest], prefix: str = "val", seed: int = 0) -> dict[str, float]:
    """``{prefix}/baseline_<policy>_success`` with its 95% Wilson interval, per policy the envs support."""
    out: dict[str, float] = {}
    for policy in POLICIES:
        start = time.perf_counter()
        results = [play(r, policy, seed + i) for i, r in enumerate(requests)]
        if any(x is None for x in results) or not results:
            log.info("%s baseline: left out (an env without an action list or a solver)", policy)
            continue
        wins = sum(results)
        low, high = wilson_interval(wins, len(results))
        out[f"{prefix}/baseline_{policy}_success"] = wins / len(results)
        out[f"{prefix}/baseline_{policy}_success_ci_low"] = low
        out[f"{prefix}/baseline_{policy}_success_ci_high"] = high
        log.info("%s baseline on the %d validation episodes: success %.3f [%.3f, %.3f] (%.1f s)", policy,
                 len(results), wins / len(results), low, high, time.perf_counter() - start)
    return out

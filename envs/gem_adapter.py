"""GEM's environments (the ``gem-llm`` package, 0.0.4 as ROLL pins it) under Gymnasium's text API.

The envs stay GEM's: they are made by GEM's own registry (``game:GuessTheNumber-v0``, ``rg:letter_counting``,
``math:GSM8K``, ``qa:HotpotQA``, ``code:CodeContest``, ...) or, for ROLL's own GEM ids (``roll_math``,
``roll_qa``, ``roll_code``), by the classes in ``envs.gem_tasks``. This adapter maps GEM's conventions to
ours, as ROLL's env managers read them:

- ``reset(seed)`` -> ``(observation, info)``; ``info["suffix"]`` (rendered into a template's ``{suffix}``)
  and ``info["env_instruction"]`` pass through. A reset that returns ``(None, None)`` (a data set with
  no more problems) raises ``DataExhausted``: the episode is counted as an env error, not trained on.
- ``step`` passes the model's text unchanged; ``info["metrics"]`` / ``info["metrics_agg_mode"]`` pass
  through and are logged under the env's tag. Where the env reports no ``action_is_valid``, a reply is
  valid when it holds a ``\\boxed{...}`` answer (the answer format every GEM game and task reads);
  ``format_penalty`` (default 0: GEM's own rewards) is added to an invalid reply's reward.
- A single-turn env ends with ``terminated`` and ``truncated`` both true; the episode is over because the
  task ended, so it is reported as terminated only (Gymnasium's meaning: truncated = cut off early).
- GEM's code envs (``code:*``) run the model's programs on their tests in our sandbox
  (``envs.gem_tasks.RollCodeEnv``), with its limits, instead of GEM's plain subprocess.
- ``dataset_name`` is read here, offline (``envs.task_data``), and handed to the env as ``dataset``, so
  GEM never tries the hub.

GEM's envs seed and draw from Python's global ``random`` (``Env.reset`` calls ``random.seed``), so two
envs stepping at once in threads would share one random stream; every GEM call in this process runs under
one lock, which makes a seeded reset draw the same problem however the threads interleave.
"""

from __future__ import annotations

import difflib
import inspect
import threading
from typing import Any, ClassVar

import gymnasium as gym

from envs.base import text_space
from envs.task_data import DataUnavailable, load_problems

GEM_FAMILIES = ("game", "rg", "math", "qa", "code", "logic", "eval")
# ROLL registers these in GEM's registry under its own names; ours are the same tasks on our data loader.
ROLL_GEM_IDS = {
    "roll_math": "envs.gem_tasks:RollMathEnv",
    "roll_qa": "envs.gem_tasks:RollQaEnv",
    "roll_code": "envs.gem_tasks:RollCodeEnv",
}
INSTALL_HINT = "pip install -e '.[gem]' && pip install --no-deps gem-llm==0.0.4 (scripts/setup.sh does both)"
# One lock for every GEM call in the process: GEM's envs use Python's global `random` (see the module doc).
GEM_LOCK = threading.RLock()


class DataExhausted(RuntimeError):
    """A dataset env has no problem left to serve (its reset returned None)."""


def is_gem_id(env_type: str) -> bool:
    """Whether ``env_type`` names a GEM env (a GEM family prefix, or one of ROLL's own GEM ids)."""
    if env_type in ROLL_GEM_IDS:
        return True
    family, sep, _ = str(env_type).partition(":")
    return bool(sep) and family in GEM_FAMILIES


def _gem_registry() -> dict[str, Any]:
    try:
        from gem.envs.registration import ENV_REGISTRY
    except ImportError as e:
        raise ValueError(f"GEM envs need the gem-llm package ({e}); install it with {INSTALL_HINT}") from None
    return ENV_REGISTRY


def gem_entry(env_type: str) -> tuple[Any, dict[str, Any]]:
    """The class and registered default kwargs of GEM id ``env_type`` (ValueError naming close ids if unknown)."""
    from envs.registration import load_entry_point

    if env_type in ROLL_GEM_IDS:
        _gem_registry()  # the classes build on GEM's
        return load_entry_point(ROLL_GEM_IDS[env_type]), {}
    registry = _gem_registry()
    if env_type not in registry:
        close = difflib.get_close_matches(env_type, list(registry) + list(ROLL_GEM_IDS), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"{env_type!r} is not a GEM env id in gem-llm's registry{hint}")
    spec = registry[env_type]
    target = spec.entry_point if callable(spec.entry_point) else load_entry_point(spec.entry_point)
    from gem.envs.code_env import CodeEnv

    if target is CodeEnv:  # model-written programs run in our sandbox, not in GEM's plain subprocess
        target = load_entry_point(ROLL_GEM_IDS["roll_code"])
    return target, dict(spec.kwargs)


def _defaults(cls: Any) -> dict[str, Any]:
    try:
        return {n: p.default for n, p in inspect.signature(cls).parameters.items() if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        return {}


def make_gem_env(env_type: str, **env_config: Any) -> Any:
    """GEM's env ``env_type`` built with ``env_config`` over its registered defaults, its data read offline."""
    target, kwargs = gem_entry(env_type)
    kwargs.update(env_config)
    if kwargs.get("dataset_name") and kwargs.get("dataset") is None:
        defaults = _defaults(target)
        keys = [kwargs.get(k, defaults.get(k)) for k in ("question_key", "answer_key", "test_key")]
        kwargs["dataset"] = load_problems(str(kwargs["dataset_name"]), kwargs.get("split"),
                                          required=tuple(k for k in keys if isinstance(k, str)))
    try:
        with GEM_LOCK:
            env = target(**kwargs)
    except LookupError as e:  # nltk's corpora (Wordle, Hangman) are downloaded on first use, which needs the internet
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"GEM env {env_type!r} needs data that is not on this machine ({first}); nltk corpora install "
                         "with `python -m nltk.downloader words` where the internet is reachable") from None
    env.env_id = env_type
    return env


def has_boxed_answer(text: str) -> bool:
    """Whether GEM's own extractor finds a ``\\boxed{...}`` answer in ``text`` (the last box, closed)."""
    from gem.utils.parsing import extract_last_boxed_answer

    return extract_last_boxed_answer(text) is not None


class GemEnv(gym.Env[str, str]):
    """A GEM env with Gymnasium's ``reset(seed=, options=)`` / ``step`` and our info conventions."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["text"]}

    def __init__(self, env_type: str, *, format_penalty: float = 0.0, render_mode: str | None = None, **env_config: Any) -> None:
        if render_mode not in (None, "text"):
            raise ValueError(f"GEM envs render text only, not {render_mode!r}")
        self.env_type = env_type
        self.format_penalty = float(format_penalty)
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space()
        # the metrics this adapter adds; a GEM env's own modes come with each step's info["metrics_agg_mode"]
        self.metric_aggregation: dict[str, str] = {"action_is_valid": "mean", "format_penalty": "sum", "success": "last"}
        self.gem = make_gem_env(env_type, **env_config)
        self._last_observation = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        with GEM_LOCK:
            observation, info = self.gem.reset(seed=seed)
        if observation is None:
            raise DataExhausted(f"{self.env_type}: the env has no problem left to serve (its reset returned None)")
        info = dict(info or {})
        info["metrics"] = dict(info.get("metrics") or {})
        self._last_observation = str(observation)
        return self._last_observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action if isinstance(action, str) else str(action)
        with GEM_LOCK:
            observation, reward, terminated, truncated, info = self.gem.step(text)
        info = dict(info or {})
        metrics = {k: v for k, v in dict(info.get("metrics") or {}).items() if _numeric(v)}
        raw = reward = float(reward)
        if "action_is_valid" not in metrics:
            metrics["action_is_valid"] = float(has_boxed_answer(text) or bool(info.get("use_tool")))
        valid = bool(metrics["action_is_valid"])
        metrics.setdefault("format_penalty", 0.0 if valid else self.format_penalty)
        if not valid:
            reward += self.format_penalty
        # GEM pays 1.0 for a solved game or a right answer (partial credit, e.g. a near guess, stays below)
        metrics.setdefault("success", float(bool(terminated) and raw >= 1.0))
        info["metrics"] = metrics
        terminated = bool(terminated)
        truncated = bool(truncated) and not terminated
        self._last_observation = str(observation)
        return self._last_observation, reward, terminated, truncated, info

    def demonstrations(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """``count`` example exchanges for a conversation to open with: the first observation of episodes
        ``seed``, ``seed + 1``, ... each answered with GEM's own random action (a reply in the env's format,
        not a good move: it shows a small model the answer format). The env is left reset; the next ``reset``
        starts the real episode."""
        examples = []
        for i in range(count):
            observation, _ = self.reset(seed=seed + i)
            examples.append((observation, self.random_action(seed + i)))
        return examples

    def random_action(self, seed: int) -> str:
        """GEM's own random reply for the current state (``sample_random_action``), drawn with ``seed``: the
        random-policy baseline of a learning curve."""
        import random

        with GEM_LOCK:  # GEM draws from the global random: seed it and draw in one piece
            random.seed(seed)
            return str(self.gem.sample_random_action())

    def render(self) -> str:
        return self._last_observation

    def close(self) -> None:
        close = getattr(self.gem, "close", None)
        if callable(close):
            close()


def _numeric(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not isinstance(value, complex)


__all__ = ["DataExhausted", "DataUnavailable", "GemEnv", "gem_entry", "has_boxed_answer", "is_gem_id", "make_gem_env"]

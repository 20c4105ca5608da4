"""The text-env base: Gymnasium's contract with string observations and actions, and the one place
where a response is parsed and an unparseable one is penalised.

Subclasses implement ``_new_episode``, ``_apply``, ``render_text``, ``instruction`` and
``is_success``; they never see a malformed action.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from envs.parsing import DEFAULT_ACTION_PATTERN, Parsed, parse_choice, parse_tool_call

MAX_TEXT = 1 << 16
_PRINTABLE = frozenset(string.printable)


def text_space(extra_chars: str = "") -> spaces.Text:
    return spaces.Text(max_length=MAX_TEXT, min_length=0, charset=_PRINTABLE | frozenset(extra_chars))


@dataclass
class Outcome:
    """What applying one valid action did."""

    reward: float
    terminated: bool = False
    effective: bool = True  # the action changed the state
    observation: str | None = None  # None: the env's current render
    metrics: dict[str, float] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """A Gymnasium env whose observations and actions are text.

    ``step(response)`` parses ``response`` with the configured ``action_pattern`` (or as a tool call
    for tool envs); an unparseable or unknown action returns reward ``format_penalty`` (plus the
    env's ``invalid_step_reward``, the per-step cost an env charges every turn), leaves the state
    unchanged, reports ``action_is_valid=0`` and never raises.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["text", "rgb_array"], "render_fps": 4}
    # How each per-step metric in info["metrics"] aggregates over an episode.
    metric_aggregation: ClassVar[dict[str, str]] = {
        "success": "last",
        "action_is_valid": "mean",
        "action_is_effective": "mean",
        "format_penalty": "sum",
    }
    invalid_step_reward: ClassVar[float] = 0.0
    extra_chars: ClassVar[str] = ""
    # Tool envs set this; their tool results are meant for a `tool` role message.
    tools: ClassVar[list[dict[str, Any]] | None] = None

    def __init__(
        self,
        *,
        action_pattern: str = DEFAULT_ACTION_PATTERN,
        format_penalty: float = 0.0,
        max_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not one of {self.metadata['render_modes']}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.action_pattern = action_pattern
        self.format_penalty = float(format_penalty)
        if not math.isfinite(self.format_penalty):
            raise ValueError(f"format_penalty must be a finite number, got {format_penalty!r}")
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.observation_space = text_space(self.extra_chars)
        self.action_space = text_space()
        self._turn = 0
        self._done = False

    # --- hooks for subclasses
    def _new_episode(self, seed: int, options: dict[str, Any]) -> None:
        raise NotImplementedError

    def _apply(self, action: Any) -> Outcome:
        raise NotImplementedError

    def render_text(self) -> str:
        raise NotImplementedError

    def instruction(self) -> str:
        raise NotImplementedError

    def is_success(self) -> bool:
        raise NotImplementedError

    def action_vocabulary(self) -> dict[str, Any]:
        """Action name -> action, matched case-insensitively (non-tool envs)."""
        raise NotImplementedError

    def expert_action(self) -> str:
        """The name of a best action in the current state (envs with a solver implement it)."""
        raise NotImplementedError(f"{type(self).__name__} has no expert policy, so it cannot give demonstrations")

    def answer_text(self, action_name: str) -> str:
        """A reply that ``step`` accepts as ``action_name`` under this env's action pattern."""
        if self.tools is not None or self.action_pattern != DEFAULT_ACTION_PATTERN:
            raise ValueError(
                f"{type(self).__name__}: demonstrations are written for the answer pattern {DEFAULT_ACTION_PATTERN!r}, "
                f"not {self.action_pattern!r}"
            )
        return f"<answer>{action_name}</answer>"

    def demonstrations(self, count: int, seed: int = 0) -> list[tuple[str, str]]:
        """``count`` example exchanges (observation, reply) on boards of this env's own kind, answered with
        the expert's first move, for a conversation to open with. Boards come from seeds ``seed``,
        ``seed + 1``, ...; a board whose answer an earlier example already showed is skipped while another
        answer is still unshown, so the examples do not all teach one move. The env is left reset; the
        next ``reset`` starts the real episode."""
        examples: list[tuple[str, str]] = []
        shown: set[str] = set()
        names: set[str] = set()
        for i in range(64 * max(count, 1)):
            if len(examples) == count:
                break
            observation, _ = self.reset(seed=seed + i)
            action = self.expert_action()
            names = names or set(self.action_vocabulary())
            if action in shown and shown != names and i < 32 * count:
                continue
            reply = self.answer_text(action)
            if not self.parse(reply).valid:  # a demonstration must show a reply the env accepts
                raise ValueError(f"{type(self).__name__}: demonstration reply {reply!r} does not parse")
            examples.append((observation, reply))
            shown.add(action)
        return examples

    def parse(self, response: str) -> Parsed:
        if self.tools is not None:
            return parse_tool_call(response, self.tools)
        return parse_choice(response, self.action_vocabulary(), self.action_pattern)

    # --- Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        # An explicit seed names the episode; without one, the env's RNG stream picks the next.
        episode_seed = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        self._turn = 0
        self._done = False
        self._new_episode(episode_seed, dict(options or {}))
        info: dict[str, Any] = {"env_instruction": self.instruction(), "metrics": {}}
        if self.tools is not None:
            info["tools"] = self.tools
        return self.render_text(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            return self.render_text(), 0.0, True, False, {"metrics": {}, "episode_over": True}
        self._turn += 1
        try:
            parsed = self.parse(action if isinstance(action, str) else str(action))
        except (ValueError, RecursionError, OverflowError, TypeError) as e:  # model output never raises
            parsed = Parsed(error=f"the response could not be parsed ({type(e).__name__})")
        if parsed.valid:
            out = self._apply(parsed.value)
            metrics = {"action_is_valid": 1.0, "action_is_effective": float(out.effective), "format_penalty": 0.0}
            metrics.update(out.metrics)
            reward, terminated = float(out.reward), bool(out.terminated)
            obs = out.observation if out.observation is not None else self.render_text()
        else:
            metrics = {"action_is_valid": 0.0, "action_is_effective": 0.0, "format_penalty": self.format_penalty}
            reward, terminated = self.format_penalty + self.invalid_step_reward, False
            obs = self.invalid_observation(parsed.error or "invalid action")
        metrics["success"] = float(self.is_success())
        truncated = not terminated and self.max_steps is not None and self._turn >= self.max_steps
        self._done = terminated or truncated
        info: dict[str, Any] = {"metrics": metrics, "action_error": parsed.error}
        if self.tools is not None:
            # A parsed call gets its result as a tool message; a malformed one is answered as the user.
            info["observation_role"] = "tool" if parsed.valid else "user"
        return obs, reward, terminated, truncated, info

    def invalid_observation(self, error: str) -> str:
        """What the agent sees after an invalid response: why, and the unchanged state."""
        return f"Invalid response: {error}.\n{self.render_text()}"

    def render(self) -> Any:
        if self.render_mode == "rgb_array":
            return self.render_rgb()
        return self.render_text()

    def render_rgb(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no RGB render")

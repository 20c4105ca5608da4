"""A user's own env, living outside the `envs` package: guess a hidden number.

It subclasses `envs.TextEnv`, so the shared action parsing and format penalty apply to it too.
Use it from a config with nothing more than an entry point:

    custom_envs:
      GuessNumber:
        env_type: guess_number
        entry_point: custom_env.guess_number:GuessNumberEnv
        env_config: {high: 20, format_penalty: -0.1}

or register it yourself: gymnasium.register(id="guess_number", entry_point=GuessNumberEnv).
"""

from __future__ import annotations

import random
from typing import Any

from envs import Outcome, TextEnv
from envs.parsing import Parsed, parse_answer


class GuessNumberEnv(TextEnv):
    def __init__(self, high: int = 20, max_steps: int | None = 6, format_penalty: float = 0.0, **kwargs: Any) -> None:
        super().__init__(max_steps=max_steps, format_penalty=format_penalty, **kwargs)
        self.high = int(high)
        self.secret = 0
        self.last = "Make your first guess."
        self._found = False

    def _new_episode(self, seed: int, options: dict[str, Any]) -> None:
        self.secret = random.Random(seed).randint(1, self.high)
        self.last, self._found = "Make your first guess.", False

    def parse(self, response: str) -> Parsed:
        parsed = parse_answer(response, self.action_pattern)
        if not parsed.valid:
            return parsed
        try:
            return Parsed(value=int(parsed.value))
        except ValueError:
            return Parsed(error=f"{parsed.value!r} is not a whole number")

    def _apply(self, guess: int) -> Outcome:
        self._found = guess == self.secret
        self.last = "Correct!" if self._found else ("Too low." if guess < self.secret else "Too high.")
        return Outcome(1.0 if self._found else 0.0, terminated=self._found)

    def render_text(self) -> str:
        return self.last

    def instruction(self) -> str:
        return f"Guess the hidden whole number between 1 and {self.high}. Answer like <answer>7</answer>."

    def is_success(self) -> bool:
        return self._found

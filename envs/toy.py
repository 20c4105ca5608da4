"""A one-turn sanity env whose reward a freshly initialised model can learn quickly: the score is
the fraction of digit characters in the response. A random policy scores near 0; any learner
that shifts probability towards digit tokens scores higher. Use it to check that a pipeline
learns at all before spending compute on a real task."""

from __future__ import annotations

from typing import Any

from envs.base import Outcome, TextEnv
from envs.parsing import Parsed, strip_special_tokens


class DigitsEnv(TextEnv):
    def __init__(self, max_steps: int | None = 1, format_penalty: float = 0.0, **kwargs: Any) -> None:
        super().__init__(max_steps=max_steps, format_penalty=format_penalty, **kwargs)

    def _new_episode(self, seed: int, options: dict[str, Any]) -> None:
        self._score = 0.0

    def parse(self, response: str) -> Parsed:
        text = strip_special_tokens(response)
        return Parsed(value=text) if text.strip() else Parsed(error="empty response")

    def _apply(self, text: str) -> Outcome:
        chars = [c for c in text if not c.isspace()]
        self._score = sum(c.isdigit() for c in chars) / max(1, len(chars))
        return Outcome(self._score, terminated=True, metrics={"digit_fraction": self._score})

    def render_text(self) -> str:
        return "Write digits."

    def instruction(self) -> str:
        return "Reply with as many digits as you can."

    def is_success(self) -> bool:
        return self._score >= 0.5

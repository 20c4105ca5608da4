"""Test-only envs, templates and helpers for the rollout tests."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, ClassVar

from envs.sokoban.env import SokobanEnv

# A ChatML template in the style of Qwen2.5: it renders tools= into the system turn itself and
# wraps tool results as <tool_response> inside a user turn.
QWEN_STYLE_TOOLS = r"""
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}
{{- '\n\n# Tools\n\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'tool' -%}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- elif message.role != 'system' -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


class RaisesCounter:
    """Counts raises across the flaky envs of one test (the test reads it back)."""

    lock = threading.Lock()
    count = 0

    @classmethod
    def bump(cls) -> None:
        with cls.lock:
            cls.count += 1


class FlakySokoban(SokobanEnv):
    """Sokoban that raises on ~30% of steps (seeded per episode)."""

    def __init__(self, fail_rate: float = 0.3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_rate = fail_rate
        self._fail_rng = random.Random(0)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._fail_rng = random.Random(seed)
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        if self._fail_rng.random() < self.fail_rate:
            RaisesCounter.bump()
            raise RuntimeError("flaky env failed")
        return super().step(action)


class RecordingBackend:
    """Wraps a backend and records every generation it returns, by prompt."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.records: list[tuple[list[int], Any]] = []
        self.lock = threading.Lock()

    def __call__(self, rank, prompts, params):
        out = self.backend(rank, prompts, params)
        with self.lock:
            self.records += list(zip(prompts, out))
        return out


class HangingSokoban(SokobanEnv):
    """Sokoban whose step blocks for ``hang_s`` on the second turn of every episode it plays first
    (the re-created env of the retry behaves), as a hung simulator would."""

    hung: ClassVar[set[int]] = set()

    def __init__(self, hang_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hang_s = hang_s
        self._seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._seed = seed
        self._turns = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        self._turns += 1
        if self._turns == 2 and self._seed not in HangingSokoban.hung:
            HangingSokoban.hung.add(self._seed)
            time.sleep(self.hang_s)
        return super().step(action)


class CountingSokoban(SokobanEnv):
    """Sokoban whose steps take a while and record how many run at once (across all its instances)."""

    lock = threading.Lock()
    running = 0
    peak = 0

    def __init__(self, step_s: float = 0.05, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_s = step_s

    def step(self, action: str):
        cls = CountingSokoban
        with cls.lock:
            cls.running += 1
            cls.peak = max(cls.peak, cls.running)
        try:
            time.sleep(self.step_s)
            return super().step(action)
        finally:
            with cls.lock:
                cls.running -= 1

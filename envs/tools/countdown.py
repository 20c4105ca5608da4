"""Countdown with a calculator: combine the given numbers with + - * / to reach the target.

Tools: ``calculate(expression)`` returns a value (scratch work); ``submit_answer(expression)``
ends the episode with reward 1 if it uses each given number at most once (exactly once with
``use_all_numbers``) and equals the target, else 0.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from typing import Any, ClassVar

from envs.base import Outcome, TextEnv
from envs.parsing import ToolCall
from envs.tools.arithmetic import ArithmeticError_, evaluate, format_number

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression (numbers, + - * /, parentheses) and return its value.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (25 - 5) * 3"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit_answer",
            "description": "Submit the final expression that reaches the target. Ends the game.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "an expression using the given numbers"}},
                "required": ["expression"],
            },
        },
    },
]


def make_puzzle(rng: random.Random, count: int, max_number: int) -> tuple[list[int], int]:
    """Numbers and a positive integer target that some expression over all of them reaches."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        values = [Fraction(n) for n in numbers]
        rng.shuffle(values)
        total = values[0]
        for v in values[1:]:
            op = rng.randrange(4)
            if op == 0:
                total += v
            elif op == 1:
                total -= v
            elif op == 2:
                total *= v
            elif total % v == 0:
                total /= v
            else:
                total += v
        if total.denominator == 1 and 0 < total <= 1000:
            return numbers, int(total)


class CountdownEnv(TextEnv):
    tools: ClassVar[list[dict[str, Any]]] = TOOLS

    def __init__(
        self,
        num_numbers: int = 4,
        max_number: int = 20,
        use_all_numbers: bool = False,
        max_steps: int | None = 5,
        format_penalty: float = 0.0,
        action_pattern: str | None = None,  # accepted for catalog symmetry; tool envs parse tool calls
        render_mode: str | None = None,
    ) -> None:
        super().__init__(format_penalty=format_penalty, max_steps=max_steps, render_mode=render_mode)
        if num_numbers < 2:
            raise ValueError(f"num_numbers must be >= 2, got {num_numbers}")
        self.num_numbers, self.max_number, self.use_all_numbers = int(num_numbers), int(max_number), bool(use_all_numbers)
        self.numbers: list[int] = []
        self.target = 0
        self._solved = False

    def _new_episode(self, seed: int, options: dict[str, Any]) -> None:
        if "numbers" in options and "target" in options:
            self.numbers, self.target = list(options["numbers"]), int(options["target"])
        else:
            self.numbers, self.target = make_puzzle(random.Random(seed), self.num_numbers, self.max_number)
        self._solved = False

    def render_text(self) -> str:
        return f"Numbers: {self.numbers}\nTarget: {self.target}"

    def instruction(self) -> str:
        rule = "exactly once" if self.use_all_numbers else "at most once"
        return (
            "Reach the target number by combining the given numbers with +, -, * and /, using each number "
            f"{rule}. Use the calculate tool for intermediate results and submit_answer with your final expression."
        )

    def is_success(self) -> bool:
        return self._solved

    def _apply(self, call: ToolCall) -> Outcome:
        try:
            value, used = evaluate(call.arguments["expression"])
        except ArithmeticError_ as e:
            # A well-formed call with an expression the calculator rejects: the tool reports the error.
            return Outcome(0.0, effective=False, observation=f"Error: {e}")
        if call.name == "calculate":
            return Outcome(0.0, observation=f"Result: {format_number(value)}")
        problem = self._check_numbers(used)
        if problem is None and value == self.target:
            self._solved = True
            return Outcome(1.0, terminated=True, observation=f"Correct: {call.arguments['expression']} = {self.target}")
        why = problem or f"{call.arguments['expression']} = {format_number(value)}, not {self.target}"
        return Outcome(0.0, terminated=True, observation=f"Wrong: {why}")

    def _check_numbers(self, used: list[Fraction]) -> str | None:
        given = Counter(Fraction(n) for n in self.numbers)
        took = Counter(used)
        extra = took - given
        if extra:
            return f"uses numbers not available: {[format_number(v) for v in extra.elements()]}"
        if self.use_all_numbers and took != given:
            return "must use every given number exactly once"
        return None

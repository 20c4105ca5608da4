"""Sokoban played through a ``move(direction)`` tool; the new board comes back as the tool result."""

from __future__ import annotations

from typing import Any, ClassVar

from envs.base import Outcome
from envs.parsing import ToolCall
from envs.sokoban.env import SokobanEnv
from envs.sokoban.level import ACTIONS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move the player one cell, pushing a box if one is in the way.",
            "parameters": {
                "type": "object",
                "properties": {"direction": {"type": "string", "enum": list(ACTIONS)}},
                "required": ["direction"],
            },
        },
    }
]


class SokobanToolEnv(SokobanEnv):
    tools: ClassVar[list[dict[str, Any]]] = TOOLS

    def _apply(self, call: ToolCall) -> Outcome:
        by_name = {name.lower(): action for name, action in ACTIONS.items()}
        return super()._apply(by_name[call.arguments["direction"].lower()])

    def instruction(self) -> str:
        base = super().instruction().rsplit("\n", 1)[0]
        return f"{base}\nMove with the move tool, one call per turn, e.g. move(direction=\"Up\")."

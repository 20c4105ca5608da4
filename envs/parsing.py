"""Parsing a model's response into an env action: one place for every env.

Special tokens are stripped first; the action is then taken from the config's pattern
(``<answer>(.*?)</answer>`` by default, a think+answer pattern, or a tool call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_ACTION_PATTERN = r"<answer>(.*?)</answer>"
THINK_ACTION_PATTERN = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"

# Chat-template special tokens a sampler may leave in the text: <|im_end|>, <|eot_id|>, </s>, ...
_SPECIAL_TOKENS = re.compile(r"<\|[^<>|]{1,40}\|>|</s>|<s>|<eos>|<bos>|<pad>|<\uff5c[^<>]{1,40}\uff5c>")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def strip_special_tokens(text: str) -> str:
    return _SPECIAL_TOKENS.sub("", text)


@dataclass(frozen=True)
class Parsed:
    """The outcome of parsing one response: a value, or why there is none."""

    value: Any = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def parse_answer(text: str, pattern: str = DEFAULT_ACTION_PATTERN) -> Parsed:
    """The text the pattern captures (its last group: the answer of a think+answer pattern)."""
    text = strip_special_tokens(text)
    match = re.search(pattern, text, flags=re.DOTALL)
    if match is None:
        return Parsed(error=f"no action found: the response must match {pattern}")
    groups = [g for g in match.groups() if g is not None] or [match.group(0)]
    return Parsed(value=groups[-1].strip())


def parse_choice(text: str, vocabulary: dict[str, int], pattern: str = DEFAULT_ACTION_PATTERN) -> Parsed:
    """Parse an answer and map it case-insensitively through an action vocabulary (name -> id)."""
    parsed = parse_answer(text, pattern)
    if not parsed.valid:
        return parsed
    key = " ".join(str(parsed.value).split()).lower()
    lookup = {name.lower(): action for name, action in vocabulary.items()}
    if key not in lookup:
        names = ", ".join(vocabulary)
        return Parsed(error=f"unknown action {parsed.value!r}: choose one of {names}")
    return Parsed(value=lookup[key])


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_tool_call(text: str, tools: list[dict[str, Any]]) -> Parsed:
    """Parse a Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and check it
    against OpenAI-style tool schemas (name known, required arguments present, types right)."""
    text = strip_special_tokens(text)
    match = _TOOL_CALL.search(text)
    if match is None:
        return Parsed(error='no tool call found: reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
    try:
        payload = json.loads(match.group(1).strip())
    except json.JSONDecodeError as e:
        return Parsed(error=f"the tool call is not valid JSON ({e.msg} at position {e.pos})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return Parsed(error='the tool call must be a JSON object with a "name" string')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return Parsed(error='"arguments" must be a JSON object')
    if not isinstance(arguments, dict):
        return Parsed(error='"arguments" must be a JSON object')
    schemas = {t["function"]["name"]: t["function"] for t in tools}
    name = payload["name"]
    if name not in schemas:
        return Parsed(error=f"unknown tool {name!r}: available tools are {', '.join(schemas)}")
    problem = _check_arguments(arguments, schemas[name].get("parameters", {}))
    if problem:
        return Parsed(error=f"bad arguments for {name}: {problem}")
    return Parsed(value=ToolCall(name, arguments))


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def _check_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    props = parameters.get("properties", {})
    for name in parameters.get("required", []):
        if name not in arguments:
            return f"missing required argument {name!r}"
    for name, value in arguments.items():
        if name not in props:
            return f"unexpected argument {name!r} (expected: {', '.join(props) or 'none'})"
        spec = props[name]
        expected = _JSON_TYPES.get(spec.get("type", ""), object)
        if not isinstance(value, expected) or (spec.get("type") in ("integer", "number") and isinstance(value, bool)):
            return f"argument {name!r} must be of type {spec.get('type')}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"] and not (
            isinstance(value, str) and value.lower() in [str(e).lower() for e in spec["enum"]]
        ):
            return f"argument {name!r} must be one of {spec['enum']}, got {value!r}"
    return None

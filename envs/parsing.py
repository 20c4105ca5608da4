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
# Model output is untrusted: a response is judged on its first MAX_RESPONSE_CHARS characters (far more
# than any turn's token cap produces), which bounds every regex and JSON parse below.
MAX_RESPONSE_CHARS = 8192
MAX_TOOL_CALL_CHARS = 4096
MAX_JSON_DEPTH = 16
QUOTE_CHARS = 40  # how much of a bad value an error message (which the model reads next) repeats
THINK_ACTION_PATTERN = r"<think>(.*?)</think>\s*<answer>(.*?)</answer>"

# Chat-template special tokens a sampler may leave in the text: <|im_end|>, <|eot_id|>, </s>, ...
_SPECIAL_TOKENS = re.compile(r"<\|[^<>|]{1,40}\|>|</s>|<s>|<eos>|<bos>|<pad>|<\uff5c[^<>]{1,40}\uff5c>")


def strip_special_tokens(text: str) -> str:
    return _SPECIAL_TOKENS.sub("", text)


def bounded(text: str) -> str:
    """The part of a response that is parsed, special tokens removed."""
    return strip_special_tokens(str(text)[:MAX_RESPONSE_CHARS])


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of a value, cut to ``limit`` characters (error messages never echo a whole response)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_depth(text: str) -> int:
    """Deepest nesting of [ and { in JSON text, outside strings (one linear pass)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def load_json(text: str) -> tuple[Any, str | None]:
    """Parse untrusted JSON: (value, None), or (None, why) for text that is malformed, too deep, or holds
    numbers Python refuses (a 5000-digit integer)."""
    if json_depth(text) > MAX_JSON_DEPTH:
        return None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at position {e.pos})"
    except (ValueError, RecursionError, OverflowError) as e:
        return None, f"not usable JSON ({type(e).__name__})"


@dataclass(frozen=True)
class Parsed:
    """The outcome of parsing one response: a value, or why there is none."""

    value: Any = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


def _between(text: str, start: str, end: str) -> str | None:
    """What a lazy ``start(.*?)end`` regex captures at its leftmost match, found in linear time (the regex
    retries from every ``start`` and is quadratic on a response full of them)."""
    i = text.find(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    return None if j < 0 else text[i + len(start): j]


def _think_answer(text: str) -> str | None:
    """What THINK_ACTION_PATTERN's answer group captures at the regex's leftmost match, in linear time.

    A ``</think>`` can close the thought when whitespace and ``<answer>`` follow it and some ``</answer>`` comes
    after that (a "good" close; whether one does depends on the close alone). The leftmost match starts at the
    first ``<think>`` with a good close after its tag, the lazy thought ends at the first such close, and the
    answer runs to the first ``</answer>`` after its tag."""
    last_end = text.rfind("</answer>")
    if last_end < 0:
        return None
    good: list[tuple[int, int]] = []  # (position of a good </think>, where its answer starts)
    j = text.find("</think>")
    while j >= 0:
        k = j + len("</think>")
        while k < len(text) and text[k].isspace():
            k += 1
        if text.startswith("<answer>", k) and last_end >= k + len("<answer>"):
            good.append((j, k + len("<answer>")))
        j = text.find("</think>", j + 1)
    if not good:
        return None
    # the first <think> decides: a later one could only reach fewer good closes
    i = text.find("<think>")
    if i < 0 or i + len("<think>") > good[-1][0]:
        return None
    start = i + len("<think>")
    answer_at = next(a for g, a in good if g >= start)
    return text[answer_at: text.find("</answer>", answer_at)]


def parse_answer(text: str, pattern: str = DEFAULT_ACTION_PATTERN) -> Parsed:
    """The text the pattern captures (its last group: the answer of a think+answer pattern). The two patterns
    we ship are matched by linear scans with the regex's result; any other pattern by ``re``."""
    text = bounded(text)
    if pattern in (DEFAULT_ACTION_PATTERN, THINK_ACTION_PATTERN):
        value = (_between(text, "<answer>", "</answer>") if pattern == DEFAULT_ACTION_PATTERN
                 else _think_answer(text))
        if value is None:
            return Parsed(error=f"no action found: the response must match {pattern}")
        return Parsed(value=value.strip())
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
        return Parsed(error=f"unknown action {quote(parsed.value)}: choose one of {names}")
    return Parsed(value=lookup[key])


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_tool_call(text: str, tools: list[dict[str, Any]]) -> Parsed:
    """Parse a Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and validate the
    arguments against the tool's JSON schema (``jsonschema``). String enums match case-insensitively
    and are passed on in the schema's spelling."""
    body = _between(bounded(text), "<tool_call>", "</tool_call>")
    if body is None:
        return Parsed(error='no tool call found: reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
    body = body.strip()
    if len(body) > MAX_TOOL_CALL_CHARS:
        return Parsed(error=f"the tool call is longer than {MAX_TOOL_CALL_CHARS} characters")
    payload, problem = load_json(body)
    if problem:
        return Parsed(error=f"the tool call is {problem}")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return Parsed(error='the tool call must be a JSON object with a "name" string')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        arguments, problem = load_json(arguments)
        if problem:
            return Parsed(error=f'"arguments" is {problem}')
    if not isinstance(arguments, dict):
        return Parsed(error='"arguments" must be a JSON object')
    schemas = {t["function"]["name"]: t["function"] for t in tools}
    name = payload["name"]
    if name not in schemas:
        return Parsed(error=f"unknown tool {quote(name)}: available tools are {', '.join(schemas)}")
    parameters = schemas[name].get("parameters", {})
    arguments = _canonical_enums(arguments, parameters)
    problem = _schema_error(arguments, parameters)
    if problem:
        return Parsed(error=f"bad arguments for {name}: {problem}")
    return Parsed(value=ToolCall(name, arguments))


def _canonical_enums(arguments: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    out = dict(arguments)
    for key, spec in parameters.get("properties", {}).items():
        value = out.get(key)
        if isinstance(value, str) and isinstance(spec, dict) and "enum" in spec:
            spelled = {str(e).lower(): e for e in spec["enum"]}
            out[key] = spelled.get(value.lower(), value)
    return out


def _schema_error(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """The most relevant schema violation, in one short line, or None."""
    import jsonschema

    schema = {"type": "object", **parameters}
    schema.setdefault("additionalProperties", False)  # an argument the tool does not take is a mistake
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message[:160]}"

"""Token-exact multi-turn conversations.

A row is built incrementally: the chat-templated first prompt, then per turn the model's sampled
token ids exactly as produced, then only the template's *delta* tokens for the next message
(user observation or tool result) plus the generation prompt. Nothing is re-tokenised, so the row
equals the tokens the policy was conditioned on and produced; ``response_mask`` is 1 on sampled
tokens only and ``logprobs`` align with them.

The delta of a new message is the template's rendering of a dummy conversation with and without
that message, cut after the assistant turn's end-of-turn token. That is exact when the template
is prefix-preserving, which ``ChatTemplate.check_prefix_preserving`` verifies at start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class TemplateError(ValueError):
    pass


class ChatTemplate:
    """A tokenizer's chat template used incrementally on token ids."""

    def __init__(self, tokenizer: Any, name: str = "tokenizer") -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.eos_id = tokenizer.eos_token_id
        if self.eos_id is None:
            raise TemplateError(f"{name}: the tokenizer has no eos token; turns cannot be closed")
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"{name}: the tokenizer has no chat template")
        self._renders_tools: bool | None = None

    # --- rendering
    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None, generation_prompt: bool = False) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def renders_tools(self) -> bool:
        """Whether the template itself renders ``tools=`` (many, e.g. SmolLM2's, ignore it)."""
        if self._renders_tools is None:
            probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
            tool = [{"type": "function", "function": {"name": "probe_tool_xyz", "parameters": {"type": "object", "properties": {}}}}]
            self._renders_tools = "probe_tool_xyz" in self.render(probe, tool)
        return self._renders_tools

    def system_content(self, system_prompt: str, tools: list[dict] | None) -> str:
        """The system message, with a Hermes-style <tools> block when the template ignores tools."""
        if not tools or self.renders_tools():
            return system_prompt
        block = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            f"{system_prompt}\n\n# Tools\n\nThese functions are yours to call. Their signatures are listed between "
            f"<tools></tools> tags:\n<tools>\n{block}\n</tools>\n\n"
            "To call one, write a JSON object with its name and arguments between <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    # --- token pieces
    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.render(messages, tools if self.renders_tools() else None, generation_prompt=True))

    def delta_ids(self, message: dict[str, Any], tools: list[dict] | None = None) -> list[int]:
        """Tokens to append after an assistant turn that ended with EOS: the rest of the turn's
        rendering, ``message``, and the generation prompt."""
        tools = tools if self.renders_tools() else None
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
        before = self.encode(self.render(base, tools))
        after = self.encode(self.render(base + [message], tools, generation_prompt=True))
        if after[: len(before)] != before:
            raise TemplateError(f"{self.name}: the chat template is not prefix-preserving for a {message['role']} message")
        cut = _last_index(before, self.eos_id) + 1
        if cut == 0:
            raise TemplateError(f"{self.name}: the template does not end an assistant turn with the eos token {self.eos_id}")
        return after[cut:]

    def check_prefix_preserving(self, tools: list[dict] | None = None) -> None:
        """Fail clearly unless a two-turn exchange built incrementally equals the template's rendering."""
        system = self.system_content("You are a test.", tools)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "first"}]
        ids = self.prompt_ids(messages, tools)
        reply = self.encode("reply one") + [self.eos_id]
        ids = ids + reply + self.delta_ids({"role": "user", "content": "second"}, tools)
        full = messages + [{"role": "assistant", "content": "reply one"}, {"role": "user", "content": "second"}]
        expected = self.encode(self.render(full, tools if self.renders_tools() else None, generation_prompt=True))
        if ids != expected:
            raise TemplateError(
                f"{self.name}: the chat template is not prefix-preserving (an incrementally built two-turn conversation "
                "differs from the template's rendering); token-exact multi-turn rollouts need a template that only "
                "appends when messages are added"
            )


def _last_index(ids: list[int], token: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1


@dataclass
class TokenRow:
    """The growing token sequence of one conversation."""

    input_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each model turn
    versions: list[int] = field(default_factory=list)  # per token: the policy version that sampled it, -1 for context

    def add_context(self, ids: list[int]) -> None:
        self.input_ids += ids
        self.response_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_response(self, ids: list[int], logprobs: list[float], version: int = 0) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probs")
        start = len(self.input_ids)
        self.input_ids += ids
        self.response_mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.versions += [version] * len(ids)
        self.turn_spans.append((start, len(self.input_ids)))

    def __len__(self) -> int:
        return len(self.input_ids)

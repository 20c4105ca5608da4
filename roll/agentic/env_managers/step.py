"""Step-wise env manager: one training row per turn (GiGPO, step_reinforce).

Each turn's prompt is the opening (system message, any demonstration exchanges, the first user
message with the instruction and first observation) and the last ``history_window`` exchanges; the row is exactly that prompt plus the
sampled tokens. Rows carry a hash of the observation the action was taken in, so GiGPO can group
identical states within a group.

An ``agent_template`` with ROLL's step-wise placeholders ({history}, {current_observation},
{env_instruction}, {step_count}, {current_step}, {history_length}, {max_response_length}) switches
to ROLL's layout instead: each turn's prompt is the system message and one user message that
holds the recent steps as text, ``(step: k, observation: ..., action: ..., reward: ...)`` joined by
", ", where ``history_length`` (``history_window``) counts the current step as ROLL does (5 shows
the 4 steps before it). Every past step is listed; an invalid action is marked so the model sees
it was refused.
"""

from __future__ import annotations

import string
import threading
from typing import Any

from roll.agentic.conversation import TokenRow
from roll.agentic.env_managers.base import EnvSlot, StepRecord, TrajEnvManager, state_hash
from roll.strategies.base import Generation

DEFAULT_HISTORY_WINDOW = 2
HISTORY_FIELDS = frozenset({"env_instruction", "step_count", "history_length", "history", "current_step", "current_observation"})
INVALID_MARK = " (not a valid action: answer in the format the instructions ask for)"


def uses_history_template(template: str | None) -> bool:
    """Whether ``template`` asks for ROLL's step-wise layout (any of its history placeholders)."""
    if not template:
        return False
    return any(name and name.split(".")[0] in HISTORY_FIELDS for _, name, _, _ in string.Formatter().parse(template))


def history_text(steps: list[StepRecord]) -> str:
    """Past steps as ROLL renders them: ``(step: k, observation: o, action: a, reward: r)`` joined by ", "."""
    return ", ".join(f"(step: {s.step_idx + 1}, observation: {s.observation}, action: {s.action}"
                     f"{'' if s.valid else INVALID_MARK}, reward: {s.reward})" for s in steps)


class StepEnvManager(TrajEnvManager):
    granularity = "step"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # an episode runs start to end in one thread: its instruction and steps so far live there
        self._episode = threading.local()

    def format_observation(self, slot: EnvSlot, observation: str, turn_idx: int, actions_left: int) -> str:
        if uses_history_template(slot.entry.get("agent_template")):
            return observation  # the conversation keeps plain observations; turn_prompt lays out the prompt
        return super().format_observation(slot, observation, turn_idx, actions_left)

    def opening(self, slot: EnvSlot, env: Any, observation: str, info: dict[str, Any], max_turns: int) -> list[dict[str, Any]]:
        if not uses_history_template(slot.entry.get("agent_template")):
            return super().opening(slot, env, observation, info, max_turns)
        self._episode.instruction = str(info.get("env_instruction") or "")
        self._episode.steps = []
        system = {"role": "system", "content": self.template.system_content(self.system_prompt(slot), info.get("tools"))}
        return [system, {"role": "user", "content": observation}]

    def turn_prompt(self, row: TokenRow, messages: list[dict[str, Any]], tools: list | None, slot: EnvSlot, turn: int) -> TokenRow:
        if uses_history_template(slot.entry.get("agent_template")):
            return self._history_prompt(messages, tools, slot, turn)
        window = slot.entry.get("history_window")
        window = DEFAULT_HISTORY_WINDOW if window is None else int(window)
        # messages = [system, demonstration pairs, first user (instruction + first observation), a1, o2, a2, ...];
        # keep the opening, the last `window` (action, observation) pairs, and always the current observation.
        opening = 2 + 2 * int(slot.entry.get("num_demonstrations") or 0)
        head, rest = messages[:opening], messages[opening:]
        kept = rest[-2 * window:] if window > 0 else rest[-1:]
        prompt = TokenRow()
        prompt.add_context(self.template.prompt_ids(head + kept, tools))
        return prompt

    def _history_prompt(self, messages: list[dict[str, Any]], tools: list | None, slot: EnvSlot, turn: int) -> TokenRow:
        steps = list(getattr(self._episode, "steps", [])) if turn > 0 else []
        window = slot.entry.get("history_window")
        window = DEFAULT_HISTORY_WINDOW + 1 if window is None else int(window)
        # ROLL keeps history[-window:-1] of the steps including the current one
        shown = (steps + [None])[-window:-1] if window > 0 else steps
        fields = {
            "env_instruction": getattr(self._episode, "instruction", ""),
            "history": history_text([s for s in shown if s is not None]),
            "step_count": turn,
            "history_length": len(shown),
            "current_step": turn + 1,
            "current_observation": messages[-1]["content"],
            "max_response_length": slot.entry.get("max_tokens_per_step", self.params.max_new_tokens),
        }
        user = {"role": "user", "content": slot.entry["agent_template"].format(**fields)}
        prompt = TokenRow()
        prompt.add_context(self.template.prompt_ids([messages[0], user], tools))
        return prompt

    def _add_turn(self, row: TokenRow, prompt: TokenRow, gen: Generation, steps: list[StepRecord], obs: str, turn: int) -> tuple[str, bool]:
        step_row = TokenRow(list(prompt.input_ids), list(prompt.response_mask), list(prompt.logprobs),
                            versions=list(prompt.versions))
        step_row.add_response(list(gen.token_ids), list(gen.logprobs), gen.version)
        text, closed = super()._add_turn(row, row, gen, steps, obs, turn)
        steps.append(StepRecord(step_row, 0.0, state_hash(obs), turn, observation=obs, action=text))
        self._episode.steps = steps  # the same list: the episode loop fills in each step's reward and validity
        return text, closed


class StepConcatEnvManager(StepEnvManager):
    """ROLL's StepConcatEnvManager (GEM's "concat" observation layout): step-wise rows whose prompt is the
    system message (none when ``agent_system_template`` is null) and one user message rendering
    ``agent_template`` with ``{history}``, the observations of the last ``history_length - 1`` steps
    joined by newlines (none when ``history_length`` is unset), and ``{current_observation}``, this step's
    observation followed by a newline and the env's suffix. The reply is trained on its own row, as
    in the step-wise manager; the other step-wise placeholders are filled as there."""

    def opening(self, slot: EnvSlot, env: Any, observation: str, info: dict[str, Any], max_turns: int) -> list[dict[str, Any]]:
        self._episode.instruction = str(info.get("env_instruction") or "")
        self._episode.steps = []
        self._episode.system = slot.entry.get("agent_system_template")  # None: the prompt has no system message
        return [{"role": "system", "content": self.system_prompt(slot)}, {"role": "user", "content": observation}]

    def format_observation(self, slot: EnvSlot, observation: str, turn_idx: int, actions_left: int) -> str:
        return observation  # the conversation keeps plain observations; turn_prompt lays out the prompt

    def turn_prompt(self, row: TokenRow, messages: list[dict[str, Any]], tools: list | None, slot: EnvSlot, turn: int) -> TokenRow:
        steps = list(getattr(self._episode, "steps", [])) if turn > 0 else []
        window = slot.entry.get("history_window")
        shown = (steps + [None])[-int(window):-1] if window else []
        current = f"{messages[-1]['content']}\n{self.suffix()}"
        fields = {
            "history": "\n".join(s.observation for s in shown if s is not None),
            "current_observation": current,
            "observation": messages[-1]["content"],
            "suffix": self.suffix(),
            "env_instruction": getattr(self._episode, "instruction", ""),
            "step_count": turn,
            "history_length": len(shown),
            "current_step": turn + 1,
            "max_response_length": slot.entry.get("max_tokens_per_step", self.params.max_new_tokens),
        }
        template = slot.entry.get("agent_template") or "{current_observation}"
        system = getattr(self._episode, "system", None)
        prompt_messages = ([{"role": "system", "content": system}] if system is not None else [])
        prompt_messages.append({"role": "user", "content": template.format(**fields)})
        prompt = TokenRow()
        prompt.add_context(self.template.prompt_ids(prompt_messages, None))
        return prompt

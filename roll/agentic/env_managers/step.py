"""Step-wise env manager: one training row per turn (GiGPO, step_reinforce).

Each turn's prompt is the opening (system message, any demonstration exchanges, the first user
message with the instruction and first observation) and the last ``history_window`` exchanges; the row is exactly that prompt plus the
sampled tokens. Rows carry a hash of the observation the action was taken in, so GiGPO can group
identical states within a group.
"""

from __future__ import annotations

from typing import Any

from roll.agentic.conversation import TokenRow
from roll.agentic.env_managers.base import EnvSlot, StepRecord, TrajEnvManager, state_hash
from roll.strategies.base import Generation

DEFAULT_HISTORY_WINDOW = 2


class StepEnvManager(TrajEnvManager):
    granularity = "step"

    def turn_prompt(self, row: TokenRow, messages: list[dict[str, Any]], tools: list | None, slot: EnvSlot, turn: int) -> TokenRow:
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

    def _add_turn(self, row: TokenRow, prompt: TokenRow, gen: Generation, steps: list[StepRecord], obs: str, turn: int) -> tuple[str, bool]:
        step_row = TokenRow(list(prompt.input_ids), list(prompt.response_mask), list(prompt.logprobs))
        step_row.add_response(list(gen.token_ids), list(gen.logprobs))
        steps.append(StepRecord(step_row, 0.0, state_hash(obs), turn))
        return super()._add_turn(row, row, gen, steps, obs, turn)

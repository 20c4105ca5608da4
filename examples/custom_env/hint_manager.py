"""A user's own env manager: adds a hint to every observation and counts the hints.

Select it for a tag or a whole rollout:

    custom_envs:
      SimpleSokoban:
        env_manager_cls: custom_env.hint_manager.HintEnvManager
    # or: train_env_manager.env_manager_cls: custom_env.hint_manager.HintEnvManager
"""

from __future__ import annotations

from roll.agentic.env_managers.trajectory import TrajEnvManager


class HintEnvManager(TrajEnvManager):
    def format_observation(self, slot, observation, turn_idx, actions_left):
        text = super().format_observation(slot, observation, turn_idx, actions_left)
        return f"{text}\nHint: use what the last reply told you."

    def run_episode(self, request):
        trajectory = super().run_episode(request)
        trajectory.metrics["hints_given"] = float(sum("Hint:" in m["content"] for m in trajectory.messages if m["role"] == "user"))
        return trajectory

"""Group filters (ROLL's ``group_filter_cls``): a collected GRPO group the filter drops is played again on a
fresh level, so a step trains on groups that carry a learning signal (dynamic sampling, as in DAPO).

A filter class is built once per rollout as ``cls(config, env_manager_config, mode)`` (``mode``: "train" or
"val") and asked ``filter(group_id, episode_id, group)`` for each complete group; True drops it. ``group`` is
the group's trajectories (``roll.agentic.env_managers.base.Trajectory``: ``score``, ``metrics``,
``turn_rewards``, ``messages``), not ROLL's DataProto. A dropped group is replayed at most
``group_filter_max_resamples`` times per collection; then its last episodes are kept, and counted.
"""

from __future__ import annotations

from typing import Any


class GroupFilter:
    """Keeps every group (the default; ROLL's default class path maps here)."""

    def __init__(self, config: Any, env_manager_config: Any, mode: str) -> None:
        self.mode = mode

    def filter(self, group_id: int, episode_id: int, group: list[Any]) -> bool:
        return False


class DropUniformRewards(GroupFilter):
    """In training, drops a group whose episodes all scored the same: with rewards normalised within the group
    every advantage is 0, so it adds no gradient and only dilutes the batch. Validation keeps everything."""

    def filter(self, group_id: int, episode_id: int, group: list[Any]) -> bool:
        if self.mode != "train" or len(group) < 2:
            return False
        scores = [float(t.score) for t in group]
        return max(scores) - min(scores) <= 1e-6

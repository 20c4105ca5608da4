"""Trajectory-wise env manager (one training row per episode)."""

from roll.agentic.env_managers.base import TrajEnvManager

__all__ = ["TrajEnvManager"]

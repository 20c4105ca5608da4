"""Gym-style text environments. Importing this package registers them with Gymnasium:

    import gymnasium, envs
    env = gymnasium.make("sokoban", dim_room=(6, 6), num_boxes=1)
"""

from envs.base import Outcome, TextEnv
from envs.registration import make_env, register_envs

register_envs()

__all__ = ["Outcome", "TextEnv", "make_env", "register_envs"]

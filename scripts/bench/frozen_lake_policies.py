"""How much of FrozenLake simple rules solve: the ceiling the offsets line (``From you: goal 2 down, 1 right.``)
puts within reach of a policy that only reads it, against random moves on the same maps.

Each policy plays the real env (4x4, non-slippery, 5 moves, the default's maps) through its text replies.

    .venv/bin/python scripts/bench/frozen_lake_policies.py [--maps 3000]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.frozen_lake import GOAL, HOLE, FrozenLakeEnv  # noqa: E402

STEPS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
Policy = Callable[[FrozenLakeEnv, random.Random], str]


def _closer_moves(env: FrozenLakeEnv) -> list[str]:
    """The moves that shorten the distance to the goal: down/up first, then right/left (the line's order)."""
    goal = next((r, row.index(GOAL)) for r, row in enumerate(env.desc) if GOAL in row)
    rows, cols = goal[0] - env.pos[0], goal[1] - env.pos[1]
    return ([("Down" if rows > 0 else "Up")] if rows else []) + ([("Right" if cols > 0 else "Left")] if cols else [])


def random_moves(env: FrozenLakeEnv, rng: random.Random) -> str:
    return rng.choice(list(STEPS))


def toward_goal(env: FrozenLakeEnv, rng: random.Random) -> str:
    """The first move the offsets line names, holes or not."""
    return _closer_moves(env)[0]


def toward_goal_around_holes(env: FrozenLakeEnv, rng: random.Random) -> str:
    """A move the line names that does not step onto a hole, when there is one."""
    moves = _closer_moves(env)
    safe = [m for m in moves if env.desc[env.pos[0] + STEPS[m][0]][env.pos[1] + STEPS[m][1]] != HOLE]
    return (safe or moves)[0]


def success(policy: Policy, maps: int, max_steps: int = 5) -> float:
    env, rng, solved = FrozenLakeEnv(max_steps=max_steps), random.Random(1), 0
    for seed in range(maps):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(f"<answer>{policy(env, rng)}</answer>")
            done = terminated or truncated
        solved += env.is_success()
    return solved / maps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maps", type=int, default=3000)
    args = parser.parse_args()
    for name, policy in [("random moves (baseline)", random_moves), ("toward the goal", toward_goal),
                         ("toward the goal, around holes", toward_goal_around_holes)]:
        print(f"{name:32s} {success(policy, args.maps):.3f} of {args.maps} maps")


if __name__ == "__main__":
    main()

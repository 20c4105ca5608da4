"""FrozenLake as a text env: walk from the start to the goal without falling into a hole.

Maps are random (``size`` x ``size``, each cell frozen with probability ``p``) and always have a
path from start to goal; ``is_slippery`` moves in the intended direction only a third of the time
(otherwise to one of the two perpendicular directions), as in Gymnasium's FrozenLake.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from envs.base import Outcome
from envs.grid import GridTextEnv
from envs.parsing import DEFAULT_ACTION_PATTERN

# Map cells
START, FROZEN, HOLE, GOAL = "S", "F", "H", "G"
# Render codes
PLAYER, FROZEN_CODE, HOLE_CODE, GOAL_CODE, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)
DEFAULT_GRID_LOOKUP = {PLAYER: "P", FROZEN_CODE: "_", HOLE_CODE: "O", GOAL_CODE: "G", PLAYER_IN_HOLE: "X", PLAYER_ON_GOAL: "√"}
DEFAULT_GRID_VOCAB = {"P": "player", "_": "frozen", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}

ACTIONS = {"Left": 0, "Down": 1, "Right": 2, "Up": 3}  # Gymnasium's ids
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
MAX_MAP_TRIES = 1000

_COLORS = {PLAYER: (50, 90, 200), FROZEN_CODE: (200, 230, 250), HOLE_CODE: (20, 40, 90), GOAL_CODE: (90, 170, 70),
           PLAYER_IN_HOLE: (150, 30, 30), PLAYER_ON_GOAL: (240, 200, 40)}


def generate_map(size: int, p: float, rng: random.Random) -> list[str]:
    """A random size x size map with a start, a goal and a path between them."""
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p (frozen probability) must be in (0, 1], got {p}")
    for _ in range(MAX_MAP_TRIES):
        cells = [[FROZEN if rng.random() < p else HOLE for _ in range(size)] for _ in range(size)]
        start = rng.randrange(size * size)
        goal = rng.randrange(size * size - 1)
        goal += goal >= start  # distinct from start
        cells[start // size][start % size] = START
        cells[goal // size][goal % size] = GOAL
        if _has_path(cells, divmod(start, size), divmod(goal, size)):
            return ["".join(row) for row in cells]
    raise RuntimeError(f"no solvable FrozenLake map in {MAX_MAP_TRIES} tries (size={size}, p={p})")


def _has_path(cells: list[list[str]], start: tuple[int, int], goal: tuple[int, int]) -> bool:
    size = len(cells)
    seen = {start}
    stack = [start]
    while stack:
        r, c = stack.pop()
        if (r, c) == goal:
            return True
        for dr, dc in _MOVES.values():
            n = (r + dr, c + dc)
            if 0 <= n[0] < size and 0 <= n[1] < size and n not in seen and cells[n[0]][n[1]] != HOLE:
                seen.add(n)
                stack.append(n)
    return False


def shortest_path(desc: list[str]) -> list[str] | None:
    """Action names of a shortest non-slippery path from S to G (None if there is none)."""
    size = len(desc)
    start = next((r, row.index(START)) for r, row in enumerate(desc) if START in row)
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    frontier = [start]
    names = {v: k for k, v in ACTIONS.items()}
    while frontier:
        nxt = []
        for r, c in frontier:
            if desc[r][c] == GOAL:
                path, cell = [], (r, c)
                while parents[cell] is not None:
                    cell, name = parents[cell]
                    path.append(name)
                return path[::-1]
            for action, (dr, dc) in _MOVES.items():
                n = (r + dr, c + dc)
                if 0 <= n[0] < size and 0 <= n[1] < size and n not in parents and desc[n[0]][n[1]] != HOLE:
                    parents[n] = ((r, c), names[action])
                    nxt.append(n)
        frontier = nxt
    return None


class FrozenLakeEnv(GridTextEnv):
    """Reward 1 on reaching the goal; falling into a hole ends the episode with 0."""

    default_grid_lookup = DEFAULT_GRID_LOOKUP
    default_grid_vocab = DEFAULT_GRID_VOCAB
    colors = _COLORS
    # the holes stay on the board only: listing them too makes a 4-example, 5-turn conversation 1,100 tokens, not 870 (SmolLM2)
    position_codes = {"you": (PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL), "goal": (GOAL_CODE, PLAYER_ON_GOAL)}

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        max_steps: int | None = 100,
        map_desc: list[str] | None = None,
        grid_lookup: Mapping[Any, str] | None = None,
        grid_vocab: Mapping[str, str] | None = None,
        cell_separator: str = "",
        describe_positions: bool = False,
        describe_offsets: bool = False,
        action_pattern: str = DEFAULT_ACTION_PATTERN,
        format_penalty: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(grid_lookup=grid_lookup, grid_vocab=grid_vocab, cell_separator=cell_separator,
                         describe_positions=describe_positions, describe_offsets=describe_offsets,
                         action_pattern=action_pattern,
                         format_penalty=format_penalty, max_steps=max_steps, render_mode=render_mode)
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        self.fixed_map = list(map_desc) if map_desc else None
        self.desc: list[str] = []
        self.pos = (0, 0)
        self._rng = random.Random(0)

    def _new_episode(self, seed: int, options: dict[str, Any]) -> None:
        self._rng = random.Random(seed)  # also drives slipping, so an episode replays exactly
        self.desc = list(options.get("map_desc") or self.fixed_map or generate_map(self.size, self.p, self._rng))
        self.pos = next((r, row.index(START)) for r, row in enumerate(self.desc) if START in row)

    def action_vocabulary(self) -> dict[str, int]:
        return ACTIONS

    def _apply(self, action: int) -> Outcome:
        if self.is_slippery:
            action = (action + self._rng.choice((-1, 0, 1))) % 4  # intended or a perpendicular direction
        dr, dc = _MOVES[action]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        if not (0 <= r < len(self.desc) and 0 <= c < len(self.desc[0])):
            return Outcome(0.0, effective=False)
        self.pos = (r, c)
        cell = self.desc[r][c]
        return Outcome(1.0 if cell == GOAL else 0.0, terminated=cell in (GOAL, HOLE))

    def is_success(self) -> bool:
        return bool(self.desc) and self.desc[self.pos[0]][self.pos[1]] == GOAL

    def codes(self) -> list[list[int]]:
        rows = []
        for r, row in enumerate(self.desc):
            line = []
            for c, cell in enumerate(row):
                here = (r, c) == self.pos
                if cell == HOLE:
                    line.append(PLAYER_IN_HOLE if here else HOLE_CODE)
                elif cell == GOAL:
                    line.append(PLAYER_ON_GOAL if here else GOAL_CODE)
                else:
                    line.append(PLAYER if here else FROZEN_CODE)
            rows.append(line)
        return rows

    def instruction(self) -> str:
        slip = " The ice is slippery, so a move may carry you sideways instead." if self.is_slippery else ""
        return (
            "FrozenLake. Walk across the ice from where you stand to the goal; stepping onto a hole ends the game."
            f"{slip}\nSymbols: {self.symbol_legend()}.{self.positions_note()}\n"
            f"Moves: {', '.join(ACTIONS)}. Reply with one move in answer tags, like <answer>Left</answer>."
        )

    def expert_action(self) -> str:
        r, c = self.pos
        desc = [row.replace(START, FROZEN) for row in self.desc]
        desc[r] = desc[r][:c] + START + desc[r][c + 1:]
        plan = shortest_path(desc)
        if not plan:
            raise ValueError("no path to the goal from this position")
        return plan[0]

"""Breadth-first Sokoban solver: the shortest action sequence, or None."""

from __future__ import annotations

from collections import deque

from envs.sokoban.level import ACTIONS, Level

_NAMES = {v: k for k, v in ACTIONS.items()}


def dead_cells(level: Level) -> bytearray:
    """Floor cells from which a box can never reach a target (found by pulling boxes back from targets)."""
    w = level.width
    walls = level.walls
    live = bytearray(len(walls))
    queue = deque(level.targets)
    for t in level.targets:
        live[t] = 1
    while queue:
        cell = queue.popleft()
        for d in (-w, w, -1, 1):
            # A box at cell+d can be pushed to cell from cell+2d.
            src, stand = cell + d, cell + 2 * d
            if 0 <= stand < len(walls) and not walls[src] and not walls[stand] and not live[src]:
                live[src] = 1
                queue.append(src)
    return bytearray(0 if (walls[i] or live[i]) else 1 for i in range(len(walls)))


def solve(level: Level, max_states: int = 2_000_000) -> list[str] | None:
    """Shortest sequence of action names that solves ``level`` (None if unsolvable within max_states)."""
    offsets = level.offsets()
    walls = level.walls
    dead = dead_cells(level)
    targets = frozenset(level.targets)
    start = (level.player, tuple(sorted(level.boxes)))
    if frozenset(start[1]) == targets:
        return []
    parents: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        box_set = set(boxes)
        for action, d in offsets.items():
            nxt = player + d
            if walls[nxt]:
                continue
            if nxt in box_set:
                dest = nxt + d
                if walls[dest] or dest in box_set or dead[dest]:
                    continue
                new_boxes = tuple(sorted(dest if b == nxt else b for b in boxes))
            else:
                new_boxes = boxes
            child = (nxt, new_boxes)
            if child in parents:
                continue
            parents[child] = (state, action)
            if new_boxes is not boxes and frozenset(new_boxes) == targets:
                return _path(parents, child)
            if len(parents) > max_states:
                return None
            queue.append(child)
    return None


def _path(parents: dict, state: tuple) -> list[str]:
    actions = []
    while parents[state] is not None:
        state, action = parents[state]
        actions.append(_NAMES[action])
    return actions[::-1]

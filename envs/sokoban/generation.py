"""Solvable Sokoban levels by reverse play.

1. Carve a random room (a random walk through a walled grid, widened at random).
2. Put the boxes on targets (the solved position) and the player on a free floor cell.
3. Play backwards: the player wanders and pulls boxes (the exact reverse of a push), for
   ``search_depth`` reverse moves, remembering the position with the most box displacement.

Every position reached by reverse moves from a solved position is solvable (play the moves
forward), so no solver is needed to accept a level. Everything is driven by one
``random.Random(seed)``: deterministic per seed and re-entrant (no module state, no lock).
"""

from __future__ import annotations

import random

from envs.sokoban.level import Level

MAX_TRIES = 64


class GenerationError(RuntimeError):
    pass


def generate_level(
    dim_room: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = 100, seed: int | None = None
) -> tuple[Level, int]:
    """Return (level, tries): a solvable, unsolved level and how many rooms were drawn for it."""
    height, width = int(dim_room[0]), int(dim_room[1])
    if height < 3 or width < 3:
        raise ValueError(f"dim_room must be at least (3, 3), got {dim_room}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    interior = (height - 2) * (width - 2)
    if interior < 2 * num_boxes + 1:
        raise ValueError(f"a {height}x{width} room has too little floor for {num_boxes} boxes")
    rng = random.Random(seed)
    walk = max(int(search_depth), 1)
    for tries in range(1, MAX_TRIES + 1):
        walls = _carve_room(height, width, num_boxes, rng)
        level = _reverse_play(height, width, walls, num_boxes, walk, rng)
        if level is not None:
            return level, tries
    raise GenerationError(f"no level after {MAX_TRIES} rooms (dim_room={dim_room}, num_boxes={num_boxes}, seed={seed})")


def _carve_room(height: int, width: int, num_boxes: int, rng: random.Random) -> bytearray:
    walls = bytearray(b"\x01" * (height * width))
    steps = int(1.5 * (height + width))
    min_floor = 2 * num_boxes + 2
    r, c = rng.randrange(1, height - 1), rng.randrange(1, width - 1)
    dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[rng.randrange(4)]
    floor = 0
    bits = rng.getrandbits  # one C call per draw: the walk's power-of-two choices are its hot path
    i = 0
    while i < steps or floor < min_floor:
        cell = r * width + c
        if walls[cell]:
            walls[cell] = 0
            floor += 1
        # Widen the corridor now and then so rooms have space to push boxes around.
        if bits(1):
            wr, wc = r + dc, c + dr  # a side cell of the walking direction
            if 0 < wr < height - 1 and 0 < wc < width - 1 and walls[wr * width + wc]:
                walls[wr * width + wc] = 0
                floor += 1
        if bits(1):
            dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[bits(2)]
        nr, nc = r + dr, c + dc
        if 0 < nr < height - 1 and 0 < nc < width - 1:
            r, c = nr, nc
        i += 1
        if i > 50 * steps:  # a tiny room cannot reach min_floor; the caller's size check prevents this
            break
    return walls


def _reverse_play(height: int, width: int, walls: bytearray, num_boxes: int, walk: int, rng: random.Random) -> Level | None:
    offsets = (-width, width, -1, 1)
    randrange = rng.randrange
    floor = [i for i, w in enumerate(walls) if not w]
    if len(floor) < num_boxes + 1:
        return None
    # A box on a target only moves when pulled along two free cells in a line: draw targets among
    # such cells (rejection sampling is cheaper than scanning the room).
    n = len(walls)
    targets: list[int] = []
    for _ in range(16 * num_boxes):
        cell = floor[randrange(len(floor))]
        if cell not in targets and any(0 <= cell + 2 * d < n and not walls[cell + d] and not walls[cell + 2 * d] for d in offsets):
            targets.append(cell)
            if len(targets) == num_boxes:
                break
    else:
        return None
    player = floor[randrange(len(floor))]
    while player in targets:
        player = floor[randrange(len(floor))]
    boxes = list(targets)  # start solved
    occupied = bytearray(walls)  # 1 where a wall or a box stands
    for b in boxes:
        occupied[b] = 1
    target_set = set(targets)

    best_score = 0
    best = None
    bits = rng.getrandbits
    for _ in range(walk):
        d = offsets[bits(2)]
        nxt = player + d
        if occupied[nxt]:
            continue
        behind = player - d
        if occupied[behind] and not walls[behind] and bits(2):  # a box behind: pull it (usually)
            occupied[behind] = 0
            occupied[player] = 1
            boxes[boxes.index(behind)] = player
            player = nxt
            score = _displacement(boxes, targets, width)
            if score > best_score and not target_set.issuperset(boxes):
                best_score, best = score, (tuple(boxes), player)
        else:
            player = nxt
    if best is None:
        return None
    best_boxes, best_player = best
    # The player may stand anywhere it can walk to from there without moving a box: walking back
    # keeps the level solvable, and the agent has to find its way to the boxes first.
    blocked = bytearray(walls)
    for b in best_boxes:
        blocked[b] = 1
    player = rng.choice(_reachable(best_player, blocked, offsets))
    return Level(height, width, bytes(walls), tuple(targets), best_boxes, player)


def _reachable(start: int, blocked: bytearray, offsets: tuple[int, ...]) -> list[int]:
    seen = bytearray(len(blocked))
    seen[start] = 1
    stack = [start]
    cells = [start]
    while stack:
        cell = stack.pop()
        for d in offsets:
            n = cell + d
            if not blocked[n] and not seen[n]:
                seen[n] = 1
                stack.append(n)
                cells.append(n)
    return cells


def _displacement(boxes: list[int], targets: list[int], width: int) -> int:
    """Sum over boxes of the Manhattan distance to their starting target (box identity kept)."""
    total = 0
    for b, t in zip(boxes, targets):
        total += abs(b // width - t // width) + abs(b % width - t % width)
    return total

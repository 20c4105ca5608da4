"""Sokoban levels as flat arrays: cell index = row * width + col."""

from __future__ import annotations

from dataclasses import dataclass

# Cell codes of the room state (gym-sokoban's numbering).
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

# Action names and their (row, col) moves; ids follow gym-sokoban (1..4).
ACTIONS = {"Up": 1, "Down": 2, "Left": 3, "Right": 4}
MOVES = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}


@dataclass(frozen=True)
class Level:
    """An immutable Sokoban position: walls, targets, boxes and the player."""

    height: int
    width: int
    walls: bytes  # 1 = wall, per cell
    targets: tuple[int, ...]
    boxes: tuple[int, ...]
    player: int

    def offsets(self) -> dict[int, int]:
        """Action id -> cell-index offset."""
        return {a: dr * self.width + dc for a, (dr, dc) in MOVES.items()}

    def room_state(self, boxes: tuple[int, ...] | None = None, player: int | None = None) -> list[list[int]]:
        boxes = self.boxes if boxes is None else boxes
        player = self.player if player is None else player
        cells = [WALL if w else FLOOR for w in self.walls]
        for t in self.targets:
            cells[t] = TARGET
        for b in boxes:
            cells[b] = BOX_ON_TARGET if cells[b] == TARGET else BOX
        cells[player] = PLAYER_ON_TARGET if cells[player] == TARGET else PLAYER
        w = self.width
        return [cells[r * w : (r + 1) * w] for r in range(self.height)]

    def is_solved(self, boxes: tuple[int, ...] | None = None) -> bool:
        return set(self.boxes if boxes is None else boxes) == set(self.targets)

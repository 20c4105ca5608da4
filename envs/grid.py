"""Grid-world text envs: a configurable symbol per cell code (grid_lookup) and a vocabulary that
tells the model what each symbol means (grid_vocab), so a different grid vocabulary is a config change.

``cell_separator`` goes between the cells of a row. With none (ROLL's boards), a BPE tokenizer merges runs of
cells into one token (SmolLM2 reads ``__PO`` as ``__`` + ``PO``), so a column is not a token position; a space
makes every cell its own token.

``describe_positions`` adds one line under the board naming where the player and the env's key cells stand as
(row, column) pairs counted from 1 at the top left, so a model need not count cells to know where it is.
``describe_offsets`` adds one line saying how far each key cell lies from the player in rows and columns
(``From you: goal 2 down, 1 right.``): the geometry with the subtraction done, in the words a move is named by."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from envs.base import TextEnv


class GridTextEnv(TextEnv):
    default_grid_lookup: ClassVar[dict[int, str]]  # cell code -> symbol
    default_grid_vocab: ClassVar[dict[str, str]]  # default symbol -> meaning
    colors: ClassVar[dict[int, tuple[int, int, int]]]  # cell code -> RGB for pictures
    position_codes: ClassVar[dict[str, tuple[int, ...]]]  # name in the positions line -> codes of cells holding it

    def __init__(self, *, grid_lookup: Mapping[Any, str] | None = None, grid_vocab: Mapping[str, str] | None = None,
                 cell_separator: str = "", describe_positions: bool = False, describe_offsets: bool = False,
                 **kwargs: Any) -> None:
        codes = len(self.default_grid_lookup)
        self.grid_lookup = {int(k): str(v) for k, v in (grid_lookup or self.default_grid_lookup).items()}
        if sorted(self.grid_lookup) != list(range(codes)) or len(set(self.grid_lookup.values())) != codes:
            raise ValueError(f"grid_lookup must map each cell code 0..{codes - 1} to a distinct symbol, got {grid_lookup}")
        self.grid_vocab = dict(grid_vocab) if grid_vocab else {
            self.grid_lookup[code]: self.default_grid_vocab[symbol] for code, symbol in self.default_grid_lookup.items()
        }
        if not isinstance(cell_separator, str) or "\n" in cell_separator or set(cell_separator) & set("".join(self.grid_lookup.values())):
            raise ValueError(f"cell_separator must be a string without newlines or grid symbols, got {cell_separator!r}")
        self.cell_separator = cell_separator
        for key, value in (("describe_positions", describe_positions), ("describe_offsets", describe_offsets)):
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false, got {value!r}")
            if value and not getattr(self, "position_codes", None):
                raise ValueError(f"{key}: {type(self).__name__} names no position_codes to describe")
        self.describe_positions, self.describe_offsets = describe_positions, describe_offsets
        self.extra_chars = "".join(self.grid_lookup.values()) + cell_separator
        self._symbol_to_code = {v: k for k, v in self.grid_lookup.items()}
        super().__init__(**kwargs)

    def codes(self) -> list[list[int]]:
        """The current grid as cell codes."""
        raise NotImplementedError

    def render_text(self) -> str:
        lookup, grid = self.grid_lookup, self.codes()
        lines = [self.cell_separator.join(lookup[c] for c in row) for row in grid]
        if self.describe_positions:
            lines.append(positions_line(grid, self.position_codes))
        if self.describe_offsets:
            lines.append(offsets_line(grid, self.position_codes))
        return "\n".join(lines)

    def parse_text(self, text: str) -> list[list[int]]:
        """The grid of cell codes a rendered text shows (inverse of render_text)."""
        sep, lines = self.cell_separator, text.split("\n")
        lines = lines[:len(lines) - self.describe_positions - self.describe_offsets]
        return [[self._symbol_to_code[ch] for ch in (line.split(sep) if sep else line)] for line in lines]

    def positions_note(self) -> str:
        """The instruction's sentences about the lines under the board ("" without any)."""
        note = ""
        if self.describe_positions:
            note += "\nUnder each board a line lists positions as (row, column), counting from (1, 1) at the top left."
        if self.describe_offsets:
            note += "\nA line under each board says how many rows up or down and columns left or right things are from you."
        return note

    def symbol_legend(self) -> str:
        return ", ".join(f"{s}: {m}" for s, m in self.grid_vocab.items())

    def render_rgb(self, tile: int = 16) -> np.ndarray:
        palette = np.array([self.colors[c] for c in range(len(self.colors))], dtype=np.uint8)
        return np.kron(palette[np.asarray(self.codes())], np.ones((tile, tile, 1), dtype=np.uint8))


def positions_line(grid: list[list[int]], position_codes: Mapping[str, tuple[int, ...]]) -> str:
    """Where each named thing stands, e.g. ``Positions: you (1, 2); boxes (2, 3), (3, 3); targets (4, 4), (4, 5).``"""
    parts = []
    for name, codes in position_codes.items():
        cells = [f"({r + 1}, {c + 1})" for r, row in enumerate(grid) for c, code in enumerate(row) if code in codes]
        parts.append(f"{name} {', '.join(cells) if cells else 'none'}")
    return f"Positions: {'; '.join(parts)}."


def offsets_line(grid: list[list[int]], position_codes: Mapping[str, tuple[int, ...]]) -> str:
    """How far each named thing lies from the player (the first name), e.g. ``From you: goal 2 down, 1 right.``"""
    (_, player_codes), *others = position_codes.items()
    you = next(((r, c) for r, row in enumerate(grid) for c, code in enumerate(row) if code in player_codes), None)
    parts = []
    for name, codes in others:
        cells = [(r, c) for r, row in enumerate(grid) for c, code in enumerate(row) if code in codes]
        said = [_offset(r - you[0], c - you[1]) for r, c in cells] if you else []
        parts.append(f"{name} {' and '.join(said) if said else 'none'}")
    return f"From you: {'; '.join(parts)}."


def _offset(rows: int, cols: int) -> str:
    """``2 down, 1 right`` for a cell 2 rows below and 1 column right of the player; ``here`` for its own cell."""
    words = [f"{abs(rows)} {'down' if rows > 0 else 'up'}"] if rows else []
    words += [f"{abs(cols)} {'right' if cols > 0 else 'left'}"] if cols else []
    return ", ".join(words) or "here"

"""Grid-world text envs: a configurable symbol per cell code (grid_lookup) and a vocabulary that
tells the model what each symbol means (grid_vocab), so a different grid vocabulary is a config change.

``cell_separator`` goes between the cells of a row. With none (ROLL's boards), a BPE tokenizer merges runs of
cells into one token (SmolLM2 reads ``__PO`` as ``__`` + ``PO``), so a column is not a token position; a space
makes every cell its own token.

``describe_positions`` adds one line under the board naming where the player and the env's key cells stand as
(row, column) pairs counted from 1 at the top left, so a model need not count cells to know where it is."""

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
                 cell_separator: str = "", describe_positions: bool = False, **kwargs: Any) -> None:
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
        if not isinstance(describe_positions, bool):
            raise ValueError(f"describe_positions must be true or false, got {describe_positions!r}")
        if describe_positions and not getattr(self, "position_codes", None):
            raise ValueError(f"describe_positions: {type(self).__name__} names no position_codes to describe")
        self.describe_positions = describe_positions
        self.extra_chars = "".join(self.grid_lookup.values()) + cell_separator
        self._symbol_to_code = {v: k for k, v in self.grid_lookup.items()}
        super().__init__(**kwargs)

    def codes(self) -> list[list[int]]:
        """The current grid as cell codes."""
        raise NotImplementedError

    def render_text(self) -> str:
        lookup, grid = self.grid_lookup, self.codes()
        board = "\n".join(self.cell_separator.join(lookup[c] for c in row) for row in grid)
        return f"{board}\n{positions_line(grid, self.position_codes)}" if self.describe_positions else board

    def parse_text(self, text: str) -> list[list[int]]:
        """The grid of cell codes a rendered text shows (inverse of render_text)."""
        sep, lines = self.cell_separator, text.split("\n")
        if self.describe_positions:
            lines = lines[:-1]
        return [[self._symbol_to_code[ch] for ch in (line.split(sep) if sep else line)] for line in lines]

    def positions_note(self) -> str:
        """The instruction's sentence about the positions line ("" without one)."""
        if not self.describe_positions:
            return ""
        return "\nUnder each board a line lists positions as (row, column), counting from (1, 1) at the top left."

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

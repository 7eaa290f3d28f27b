"""A listing for a terminal too narrow for its table: one block a record, its heading, then a field a line. Names,
signatures and paths fold whole at the edge, never cut or squeezed to nothing (the README's 80 columns)."""

from __future__ import annotations

from typing import Sequence, Union

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

WIDE = 120  # columns from which a listing is a table; below, cards
Value = Union[str, Text]


def cards(title: str, records: Sequence[tuple[Value, Sequence[tuple[str, Value]]]], caption: str = "") -> Group:
    """``records``: (heading, [(field, value), ...]) each."""
    parts: list[RenderableType] = [Text(title, style="bold italic")]
    for heading, fields in records:
        parts.append(_folding(heading, "bold"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in fields:
            grid.add_row(name, _folding(value))
        parts.append(Padding(grid, (0, 0, 1, 2)))
    if caption:
        parts.append(Text(caption, style="dim", overflow="fold"))
    return Group(*parts)


def _folding(value: Value, style: str = "") -> Text:
    text = value.copy() if isinstance(value, Text) else Text(str(value))
    if style:
        text.stylize(style)
    text.overflow = "fold"
    return text

"""A name in a table cell (a winner's label, a path) that breaks only at its own joints when the column is narrower
than it: after ``.``, ``[``, ``,``, ``/`` or ``-``, never mid-word. rich folds a long word at the column's edge
(``cpu.matmul.blas[defa`` / ``ult]``); this renderable tells the table the widest joint-free piece it needs
(its minimum width) and lays the name out in lines that end at joints."""

from __future__ import annotations

import re
from typing import Any, Iterator

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.text import Text

_PIECES = re.compile(r"[^.\[,/\-]*[.\[,/\-]?")


class Name:
    """``text`` laid out at its joints in the width its column gets (``style`` for all of it)."""

    def __init__(self, text: str, style: str = "") -> None:
        self.text, self.style = text, style
        self.pieces = [p for p in _PIECES.findall(text) if p] or [text]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(max(len(p) for p in self.pieces), len(self.text))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        yield Text("\n".join(self.lines(options.max_width)), style=self.style, overflow="fold")

    def lines(self, width: int) -> list[str]:
        """The name in lines of at most ``width`` characters, each ending at a joint (a piece wider than ``width``
        alone on its line)."""
        out: list[str] = []
        line = ""
        for piece in self.pieces:
            if line and len(line) + len(piece) > width:
                out.append(line)
                line = ""
            line += piece
        out.append(line)
        return out

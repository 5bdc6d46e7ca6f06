"""Plain aligned columns for the client's long listings (`aisched jobs`).

rich lays a `Table` out cell by cell (measuring, wrapping, cropping), about 2 ms a row, so a
listing of a thousand waiting jobs cost about a CPU-second; these lines cost microseconds.
The layout is the one the rich tables of the other commands have (no box, two spaces between
columns, a bold header). Colours (ANSI) only on a terminal that allows them (`NO_COLOR` unset,
`TERM` not `dumb`); there the last column is cut to the terminal's width (and a column given a
most width, to it), and a pipe gets whole lines. Every cell is made printable (`printable.py`):
its text may be another user's.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from aisched.cli.printable import printable

_ANSI = {"bold": "1", "yellow": "33", "green": "32", "blue": "34", "red": "31", "magenta": "35"}
GAP = "  "


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell's text and a style of `_ANSI` (or "" for none)."""

    text: str
    style: str = ""


def colour_allowed(out: IO[str]) -> bool:
    return out.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[str | Cell]],
    right: frozenset[str] = frozenset(),
    out: IO[str] | None = None,
    cut: Mapping[str, int] | None = None,
) -> None:
    """Write the header and the rows, each column as wide as its widest cell; the columns
    named in `right` are right-aligned. On a terminal, a cell of a column named in `cut` is
    cut to that many characters, so that one long cell (a name) leaves the last column its
    share of the width."""
    out = sys.stdout if out is None else out
    colour = colour_allowed(out)
    width = shutil.get_terminal_size().columns if out.isatty() else None
    most = [(cut or {}).get(h) if width is not None else None for h in headers]
    cells = [
        [
            Cell(_cut(printable(c.text), most[i]), c.style)
            if isinstance(c, Cell)
            else Cell(_cut(printable(c), most[i]))
            for i, c in enumerate(row)
        ]
        for row in rows
    ]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c.text))
    aligned = [h in right for h in headers]
    lines = [_line([Cell(h, "bold") for h in headers], widths, aligned, colour, width)]
    lines += [_line(row, widths, aligned, colour, width) for row in cells]
    out.write("\n".join(lines) + "\n")


def _cut(text: str, most: int | None) -> str:
    return text if most is None or len(text) <= most else text[: most - 1] + "…"


def _line(
    row: Sequence[Cell], widths: list[int], right: list[bool], colour: bool, width: int | None
) -> str:
    parts: list[str] = []
    used = 0
    last = len(row) - 1
    for i, c in enumerate(row):
        text = c.text
        if i == last:
            if width is not None and used + len(text) > width:
                room = max(width - used, 1)
                text = text[: room - 1] + "…"
            pad = text.rjust(widths[i]) if right[i] else text
        else:
            pad = text.rjust(widths[i]) if right[i] else text.ljust(widths[i])
        used += len(pad) + len(GAP)
        if colour and c.style in _ANSI:
            # Only the text is coloured, not the padding, as rich does.
            styled = f"\x1b[{_ANSI[c.style]}m{text}\x1b[0m"
            pad = pad.replace(text, styled, 1)
        parts.append(pad)
    return GAP.join(parts).rstrip()

"""rich consoles for the CLI's lines of text (`show`'s fields, warnings and notes on stderr).

On a terminal a long line wraps at its width, between words. Anywhere else (a pipe, a file) a
line is written whole, never wrapped or cut, as `aisched jobs` writes its rows: a reader there
greps or parses it, and rich's default of 80 columns split a sentence or a path in two.
"""

from __future__ import annotations

from rich.console import Console


def console(*, stderr: bool = False) -> Console:
    """The console for stdout (or stderr): wrapping on a terminal only."""
    con = Console(stderr=stderr, highlight=False)
    if con.is_terminal:
        return con
    return Console(stderr=stderr, highlight=False, soft_wrap=True)

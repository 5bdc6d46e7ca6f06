"""Text from the service made safe to print on a terminal.

Much of what the CLI prints was written by other users: a job's command and the messages of
its end and its events name its programs and files, whose names may hold any byte but "/".
Printed as they are, the control characters in them reach the reader's terminal, an admin's
above all (who sees every job's): ESC sequences recolour, clear, retitle it, or write to its
clipboard (OSC 52), and Unicode's bidirectional controls make text read in another order than
it is. So each is shown as an escape (`\\x1b`, `\\u202e`), like `ls` and `git` show such names.
And rich reads `[...]` in what it prints as markup: a file named `[/x]` made `aisched show`
fail with a traceback, and `[link=...]` would put a link of the submitter's choosing under
the reader's mouse. Strings from the service go to rich as `Text`, never as markup.

Logs are not passed through here: a job's output is printed as the job wrote it (colours
included), as `cat` would.
"""

from __future__ import annotations

import re

from rich.text import Text

# C0 and C1 controls, DEL, and Unicode's bidirectional formatting characters.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every control character shown as an escape; with `lines`, newlines are
    kept (a message of several lines)."""
    return (_CONTROL_BUT_NEWLINE if lines else _CONTROL).sub(_escape, text)


def plain(text: str, style: str = "") -> Text:
    """`text` for rich: printable, and never read as markup."""
    return Text(printable(text), style=style)

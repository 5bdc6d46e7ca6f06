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

A job's log is written by its user and read by others, admins above all, so on a terminal
it goes through `TerminalOutput`: its colours (SGR sequences) and the controls of lines (tab,
carriage return: progress bars) are kept, every other control is shown as an escape. Sent to
a pipe or a file, or with `aisched logs --raw`, it is the bytes the job wrote, as `cat` gives.
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


# A log on a terminal: SGR (colours, bold) kept whole; a control of lines (tab, newline,
# carriage return) kept; every other control escaped.
_SGR = re.compile("\x1b\\[[0-9;:]*m")
_SGR_BEGUN = re.compile("\x1b(?:\\[[0-9;:]*)?\\Z")  # a chunk that ends inside one
_CONTROL_IN_OUTPUT = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


class TerminalOutput:
    """A job's output for a terminal, a chunk at a time (see the module docstring): a colour
    sequence cut between two chunks is held back until it is whole."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, chunk: str) -> str:
        text = self._held + chunk
        begun = _SGR_BEGUN.search(text[-32:])
        cut = len(text) - (len(begun.group()) if begun else 0)
        text, self._held = text[:cut], text[cut:]
        parts = _SGR.split(text)
        colours = _SGR.findall(text)
        out = [_CONTROL_IN_OUTPUT.sub(_escape, parts[0])]
        for colour, part in zip(colours, parts[1:], strict=True):
            out += [colour, _CONTROL_IN_OUTPUT.sub(_escape, part)]
        return "".join(out)

    def close(self) -> str:
        """What was held back, escaped: the output ended inside a sequence."""
        held, self._held = self._held, ""
        return _CONTROL_IN_OUTPUT.sub(_escape, held)

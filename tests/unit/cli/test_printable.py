"""Text from the service printed on a terminal: controls shown as escapes, never markup."""

from __future__ import annotations

import io

from rich.console import Console

from aisched.cli.printable import TerminalOutput, plain, printable


def test_controls_and_bidi_overrides_are_shown_as_escapes() -> None:
    assert printable("a\x1b[2Jb\x07\x9b\u202ec\td") == r"a\x1b[2Jb\x07\x9b\u202ec\x09d"
    assert printable("one\ntwo") == r"one\x0atwo"
    assert printable("one\ntwo\r", lines=True) == "one\ntwo\\x0d"
    assert printable("plain text, [ok] é 漢") == "plain text, [ok] é 漢"


def test_plain_text_is_never_read_as_markup() -> None:
    out = io.StringIO()
    Console(file=out, width=200).print(plain("/home/bob/[/x]/[bold]y[link=http://e.invalid]z"))
    assert out.getvalue() == "/home/bob/[/x]/[bold]y[link=http://e.invalid]z\n"


def test_a_log_on_a_terminal_keeps_its_colours_and_lines_and_escapes_the_rest() -> None:
    shown = TerminalOutput()
    # A colour cut between two chunks is held back until it is whole; a clipboard write (OSC
    # 52), a clear screen and a bidi override are escaped; tabs and line ends stay.
    chunks = ["ok \x1b[31mred\x1b[", "0m \x1b]52;c;aGk=\x07\x1b[2J\u202e\t10%\r20%\n", "end\x1b"]
    out = "".join(shown.feed(c) for c in chunks) + shown.close()
    assert out == "ok \x1b[31mred\x1b[0m \\x1b]52;c;aGk=\\x07\\x1b[2J\\u202e\t10%\r20%\nend\\x1b"

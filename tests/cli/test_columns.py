"""The plain column layout of `aisched jobs`: widths, alignment, colours only on a terminal."""

from __future__ import annotations

import io

import pytest

from aisched.cli.columns import Cell, render


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


ROWS: list[tuple[str | Cell, ...]] = [
    ("3", "waits", Cell("pending", "yellow"), "nodes reserved"),
    ("12", "big", "running", ""),
]


def test_columns_on_a_pipe() -> None:
    out = io.StringIO()
    render(("ID", "NAME", "STATE", "WHY"), ROWS, right=frozenset({"ID"}), out=out)
    assert out.getvalue() == (
        "ID  NAME   STATE    WHY\n 3  waits  pending  nodes reserved\n12  big    running\n"
    )


def test_colours_and_the_width_of_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "30")
    out = Terminal()
    render(("ID", "NAME", "STATE", "WHY"), ROWS, right=frozenset({"ID"}), out=out)
    assert out.getvalue().split("\n") == [
        "\x1b[1mID\x1b[0m  \x1b[1mNAME\x1b[0m   \x1b[1mSTATE\x1b[0m    \x1b[1mWHY\x1b[0m",
        " 3  waits  pending  nodes res…".replace("pending", "\x1b[33mpending\x1b[0m"),
        "12  big    running",
        "",
    ]


def test_no_colour_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    out = Terminal()
    render(("ID", "STATE"), [("1", Cell("failed", "red"))], out=out)
    assert out.getvalue() == "ID  STATE\n1   failed\n"

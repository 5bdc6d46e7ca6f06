"""ETAs in wall-clock words: a future start as the clock says it, a passed one as overdue."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from aisched.cli.eta import eta_words, span, waiting_words

# 2026-12-03 13:53:11 UTC
NOW = datetime(2026, 12, 3, 13, 53, 11, tzinfo=UTC).timestamp()


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_spans_read_as_words() -> None:
    assert [span(s) for s in (0, 12, 89, 150, 3900, 7500, 90000)] == [
        "0 s",
        "12 s",
        "89 s",
        "2 min",
        "65 min",
        "2 h 05 min",
        "1 d 1 h",
    ]


def test_a_future_eta_is_a_clock_time_and_how_long_until_it() -> None:
    assert eta_words(NOW + 12, NOW) == "13:53:23 (in 12 s)"
    assert eta_words(NOW + 2 * 86400, NOW) == "2026-12-05 13:53 (in 2 d 0 h)"


def test_a_passed_eta_is_overdue_never_a_past_start() -> None:
    assert eta_words(NOW - 30, NOW) == "overdue by 30 s (was 13:52:41)"
    assert eta_words(NOW - 0.5, NOW) == "now"


def test_a_reserved_job_says_from_when() -> None:
    assert (
        waiting_words("nodes reserved", NOW + 12, NOW) == "nodes reserved from 13:53:23 (in 12 s)"
    )
    assert waiting_words("nodes reserved", NOW - 5, NOW) == (
        "nodes reserved, start overdue by 5 s (was 13:53:06)"
    )
    assert waiting_words("nodes reserved once running jobs end", None, NOW) == (
        "nodes reserved once running jobs end"
    )
    assert waiting_words("room for 0 of 1 'main' tasks", NOW + 60, NOW) == (
        "room for 0 of 1 'main' tasks; ETA 13:54:11 (in 60 s)"
    )

"""Estimated start times in wall-clock words, for `jobs`, `show` and `top`.

The core hands out an ETA as a number on the service's clock (epoch seconds) and never formats
it; this is where it becomes words: "13:53:23 (in 12 s)". An ETA that has already passed is
never shown as a past start: it is "overdue" (the running work it waits for outlived its
estimate), and the next scheduling cycle estimates it again.
"""

from __future__ import annotations

import time

# The start a reserved job waits for is its reason's subject: "nodes reserved from 13:53:23".
RESERVED = "nodes reserved"
# Within this much of now, an ETA is "now" rather than overdue: cycles run about every second.
_SLACK_S = 1.0


def span(seconds: float) -> str:
    """A length of time in words: 12 s, 4 min, 1 h 05 min, 2 d 3 h."""
    s = max(int(round(seconds)), 0)
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{round(s / 60)} min"
    if s < 86400:
        return f"{s // 3600} h {(s % 3600) // 60:02d} min"
    return f"{s // 86400} d {(s % 86400) // 3600} h"


def clock(t: float, now: float) -> str:
    """The wall-clock time of `t`: HH:MM:SS within half a day of now, else the date too."""
    fmt = "%H:%M:%S" if abs(now - t) < 43200 else "%Y-%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def eta_words(eta: float, now: float) -> str:
    """ "13:53:23 (in 12 s)", "now", or "overdue by 5 s (was 13:53:23)"."""
    if eta > now + _SLACK_S:
        return f"{clock(eta, now)} (in {span(eta - now)})"
    if eta >= now - _SLACK_S:
        return "now"
    return f"overdue by {span(now - eta)} (was {clock(eta, now)})"


def waiting_words(reason: str, eta: float | None, now: float) -> str:
    """A pending job's reason with its ETA: "nodes reserved from 13:53:23 (in 12 s)", or the
    reason and "; ETA ..."."""
    if eta is None:
        return reason
    words = eta_words(eta, now)
    if reason == RESERVED:
        overdue = words.startswith("overdue")
        return f"{reason}, start {words}" if overdue else f"{reason} from {words}"
    return f"{reason}; ETA {words}" if reason else f"ETA {words}"

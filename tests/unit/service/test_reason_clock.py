"""Times written into stored reasons (`scheduler_state.clock`): the server's local time with its
zone, and the date when not today there. Each case runs in its own interpreter with `TZ` set, so
this process's zone is never changed."""

from __future__ import annotations

import calendar
import os
import subprocess
import sys

# 2026-12-07 22:00:00 in Japan (UTC+9, no daylight saving time).
NOW = calendar.timegm((2026, 12, 7, 13, 0, 0))


def clock_in(tz: str, t: float, now: float) -> str:
    code = (
        "import sys; from aisched.service.scheduler_state import clock; "
        "print(clock(float(sys.argv[1]), float(sys.argv[2])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, repr(t), repr(now)],
        env={**os.environ, "TZ": tz},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_a_time_today_has_its_zone() -> None:
    assert clock_in("JST-9", NOW + 3600 + 11 * 60 + 51, NOW) == "23:11:51 JST"


def test_a_time_on_another_day_has_its_date() -> None:
    later = NOW + 9 * 3600 + 11 * 60 + 51  # past midnight in Japan, still the 7th in UTC
    assert clock_in("JST-9", later, NOW) == "2026-12-08 07:11:51 JST"
    assert clock_in("UTC0", later, NOW) == "22:11:51 UTC"

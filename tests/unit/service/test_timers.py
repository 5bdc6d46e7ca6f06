"""The loop's timers: taken when due, in due order; a stale entry neither fires nor wakes."""

from __future__ import annotations

import math

from aisched.service.timers import Timer, Timers


def test_due_timers_are_taken_once_and_later_ones_stay() -> None:
    t = Timers()
    t.add(30.0, Timer.LIMIT, "3")
    t.add(10.0, Timer.BACKOFF, "1")
    t.add(20.0, Timer.GROW, "2")
    t.add(math.inf, Timer.LIMIT, "4")  # never due: not kept
    assert len(t) == 3
    assert t.pop_due(20.0) == {"1", "2"}
    assert t.pop_due(20.0) == set()
    assert t.next_due(lambda kind, job_id, due: True) == 30.0


def test_the_next_wake_skips_and_drops_entries_that_no_longer_stand() -> None:
    t = Timers()
    t.add(10.0, Timer.LIMIT, "old-attempt")
    t.add(15.0, Timer.BACKOFF, "1")
    t.add(40.0, Timer.LIMIT, "2")
    standing = {("1", 15.0): False, ("2", 40.0): True, ("old-attempt", 10.0): False}
    seen: list[str] = []

    def still_set(kind: Timer, job_id: str, due: float) -> bool:
        seen.append(job_id)
        return standing[(job_id, due)]

    assert t.next_due(still_set) == 40.0
    assert (seen, len(t)) == (["old-attempt", "1", "2"], 1)
    assert Timers().next_due(still_set) == math.inf

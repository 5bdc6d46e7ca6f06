"""The live jobs' timers, in a heap keyed by when they fall due: a running attempt's time
limit, a retry's backoff (`not_before`), an elastic job's first chance to grow.

A step of the loop then costs what fell due, not a walk over every live job: `pop_due` gives
the jobs whose timers have come, and `next_due` when the loop must wake next. Entries are
never updated in place; whoever changes what a timer depends on (a new attempt, a backoff set)
arms a new one (`Timers.add`), and an entry the job has moved past is dropped when it surfaces:
the caller says which entries still stand (`still_set`), so a stale one neither fires nor wakes
the loop early.

Owned by the loop thread, like the rest of the live state.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from enum import IntEnum


class Timer(IntEnum):
    LIMIT = 0  # the running attempt passes its time limit
    BACKOFF = 1  # a failed job may be placed again
    GROW = 2  # an elastic job short of tasks may first be grown (a wake-up only)


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer, str]] = []
        self._seq = itertools.count()  # ties in due time keep the order they were armed in

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due: float, kind: Timer, job_id: str) -> None:
        """Arm a timer; one that never falls due (`inf`) is not kept."""
        if math.isfinite(due):
            heapq.heappush(self._heap, (due, next(self._seq), kind, job_id))

    def pop_due(self, now: float) -> set[str]:
        """Take every timer due at `now` or before; the jobs they belong to (the caller checks
        what, if anything, each job's state says is due)."""
        heap, out = self._heap, set()
        while heap and heap[0][0] <= now:
            out.add(heapq.heappop(heap)[3])
        return out

    def next_due(self, still_set: Callable[[Timer, str, float], bool]) -> float:
        """When the earliest timer that still stands falls due (`inf`: none); entries that no
        longer stand are dropped on the way."""
        heap = self._heap
        while heap:
            due, _, kind, job_id = heap[0]
            if still_set(kind, job_id, due):
                return due
            heapq.heappop(heap)
        return math.inf

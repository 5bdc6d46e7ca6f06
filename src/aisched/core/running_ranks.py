"""Running jobs' rank keys for preemption by order (the policy's first order key, read at the
cycle's time), kept from one cycle to the next while they are known.

Preempt `by: order` compares possible victims' rank keys with each blocked job's bar. Most
cycles find that nobody ranks above any blocked job, and computing every running job's key
afresh to learn it grew with the running set, every cycle. How a running job's key moves with
time is known for two kinds of order:

- `steps` (`las`, which names its next step: `next_change_gpu_s`): the key depends on attained
  service alone and changes only when it reaches the next step, at a known instant. A key is
  kept, exactly, from the instant it was computed to the last instant still below that step.
- `falls` (`qssf`, `sjf`: shortest remaining first): the key depends on the job and its
  estimate alone, never falling as the estimate grows, and a running job's estimate is its time
  left, which shrinks until its expected end. A key computed at one instant is an upper bound
  of the key at every later instant before the expected end.

So per cycle the table is synced with the running set (set operations in C, and work for
what started, ended or reached its step), and the highest key is found from the highest kept
value: kept values above the rest are made exact first, usually one, for the job that stays on
top. A blocked job ranked at or above it finds nobody, known without any other key computed.

Invariants:
- After `sync(running, now)`, the table holds exactly the views of `running`, each with an
  interval containing `now` over which its value equals the key (`steps`) or is at least it
  (`falls`); `top(now, compute)` is then the highest key at `now` among them.
- `key(view, now, compute)` always equals `compute(view)`, the key at `now`.
- Entries hold their views, so an `id()` is never reused while it is kept; heap items of
  replaced entries are recognised by their serial number and dropped when met, and the heaps
  are rebuilt once they hold more than twice the entries.

Kept in the cluster arrays' memo like the core's other cross-cycle caches, one per policy and
preempt action (both held, so neither id can be reused meanwhile). Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from aisched.core.plugins.order import PredictedGpuTime, ShortestFirst
from aisched.core.snapshot import RunningJob
from aisched.model.resources import GPU_MILLI_WHOLE

# Steps back from the estimated crossing instant to find one still below the step; past this
# many (a job holding a tiny GPU share, whose service moves less than a rounding step per
# instant), the key is kept for no later instant than the one it was computed at.
_STEPS_BACK = 4
# Heap items kept beyond twice the entries before the heaps are rebuilt.
_SLACK = 64

Compute = Callable[[RunningJob], float]  # a running job's key at the cycle's time
NextChange = Callable[[float], "float | None"]


class Moves(Enum):
    """How a running job's rank key moves with time (see the module's description)."""

    STEPS = "steps"
    FALLS = "falls"


# Orders whose key depends on the job and its estimate alone and never falls as the estimate
# grows (tests/property/test_running_ranks.py checks it of each). Listed by class: an order
# left out only costs the keys computed afresh every cycle, never a wrong decision.
_FALLING_ORDERS: tuple[type, ...] = (PredictedGpuTime, ShortestFirst)


def moves_of(order: object) -> tuple[Moves, NextChange | None] | None:
    """How a running job's key under `order` moves, and its next step of attained service
    for `steps`; None when that is not known (its keys cannot be kept)."""
    next_change: NextChange | None = getattr(order, "next_change_gpu_s", None)
    if next_change is not None:
        return Moves.STEPS, next_change
    if type(order) in _FALLING_ORDERS:
        return Moves.FALLS, None
    return None


@dataclass(frozen=True, slots=True)
class _Entry:
    view: RunningJob
    value: float
    from_s: float
    to_s: float  # the value holds for every now in [from_s, to_s]
    serial: int


@dataclass(slots=True)
class KeptRanks:
    """One preempt action's kept rank keys. `next_change(attained)`: the order's next step of
    attained service (`steps` only; None: the key never changes again)."""

    owner: tuple[object, object]
    moves: Moves
    next_change: NextChange | None = None
    entries: dict[int, _Entry] = field(default_factory=dict)
    _now: float = -math.inf
    _synced: tuple[RunningJob, ...] = ()  # the running set of the last sync (held)
    _serial: int = 0
    _tops: list[tuple[float, int, int]] = field(default_factory=list)  # (-value, serial, id)
    _ends: list[tuple[float, int, int]] = field(default_factory=list)  # (to_s, serial, id)

    def owns(self, policy: object, action: object) -> bool:
        return self.owner[0] is policy and self.owner[1] is action

    def sync(self, running: tuple[RunningJob, ...], now: float, compute: Compute) -> None:
        """Make the table hold exactly `running`, every entry valid at `now`. A tuple, so the
        same object as last time holds the same views."""
        if now < self._now:  # an earlier instant: nothing kept is known to hold there
            self._clear()
        self._now = now
        entries = self.entries
        if running is not self._synced:  # else the same running set as last time
            self._synced = running
            ids = set(map(id, running))
            for i in entries.keys() - ids:
                del entries[i]
            # An entry holds its view, so a view new to the table has an id new to it too.
            if len(entries) < len(ids):
                for view in running:
                    if id(view) not in entries:
                        self._put(view, now, compute(view))
        ends = self._ends
        while ends and ends[0][0] < now:
            _, serial, i = heapq.heappop(ends)
            hit = entries.get(i)
            if hit is not None and hit.serial == serial:
                self._put(hit.view, now, compute(hit.view))
        if len(self._tops) + len(ends) > 4 * len(entries) + _SLACK:
            self._rebuild_heaps()

    def top(self, now: float, compute: Compute) -> float:
        """The highest key at `now` of the views synced (-inf when there are none). A kept
        upper bound above every other is made exact first, as often as it takes: usually
        once, for the job that stays on top."""
        tops, entries = self._tops, self.entries
        while tops:
            value, serial, i = tops[0]
            hit = entries.get(i)
            if hit is None or hit.serial != serial:
                heapq.heappop(tops)
            elif self._exact(hit, now):
                return -value
            else:
                self._put(hit.view, now, compute(hit.view))
        return -math.inf

    def key(self, view: RunningJob, now: float, compute: Compute) -> float:
        """`compute(view)`, the key at `now`; taken from the table when it is exact there."""
        hit = self.entries.get(id(view))
        if hit is not None and hit.view is view and self._exact(hit, now):
            return hit.value
        return compute(view)

    def _exact(self, entry: _Entry, now: float) -> bool:
        """Whether the entry's value is the key at `now` (a `falls` value is only a bound
        after the instant it was computed at)."""
        if self.moves is Moves.FALLS and entry.from_s != now:
            return False
        return entry.from_s <= now <= entry.to_s

    def _put(self, view: RunningJob, now: float, value: float) -> None:
        self._serial += 1
        entry = _Entry(view, value, now, self._holds_until(view, now), self._serial)
        i = id(view)
        self.entries[i] = entry
        heapq.heappush(self._tops, (-value, entry.serial, i))
        if entry.to_s < math.inf:
            heapq.heappush(self._ends, (entry.to_s, entry.serial, i))

    def _holds_until(self, view: RunningJob, now: float) -> float:
        """The last instant for which the value computed at `now` is known to hold."""
        if now < view.started_s:
            return now  # not started: its service and time left do not move yet
        if self.moves is Moves.FALLS:
            end = view.expected_end_s
            if end is None:
                return math.inf  # no time left to shrink: the key is fixed
            # Time left falls until the expected end; after it, it grows with service.
            return math.nextafter(end, -math.inf) if end > now else now
        return self._below_next_step(view, now)

    def _below_next_step(self, view: RunningJob, now: float) -> float:
        """The last instant known to have attained service below the next step from `now`'s
        (`now` itself when none is found)."""
        assert self.next_change is not None
        gpus = view.usage[2] / GPU_MILLI_WHOLE
        if gpus <= 0:
            return math.inf  # no GPU: its attained service does not move
        attained = view.attained_at(now)
        step = self.next_change(attained)
        if step is None:
            return math.inf
        at = now + (step - attained) / gpus
        # Rounding may put `at` on either side of the crossing: step back to an instant still
        # below it; attained service only grows with time, so every instant up to it is too.
        for _ in range(_STEPS_BACK):
            if at <= now:
                return now
            if view.attained_at(at) < step:
                return at
            at = math.nextafter(at, -math.inf)
        return now

    def _clear(self) -> None:
        self._synced = ()
        self.entries.clear()
        self._tops.clear()
        self._ends.clear()

    def _rebuild_heaps(self) -> None:
        entries = self.entries.items()
        self._tops = [(-e.value, e.serial, i) for i, e in entries]
        self._ends = [(e.to_s, e.serial, i) for i, e in entries if e.to_s < math.inf]
        heapq.heapify(self._tops)
        heapq.heapify(self._ends)

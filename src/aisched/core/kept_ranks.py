"""Ranks for preemption by order kept from one cycle to the next: running jobs' rank keys (the
policy's first order key, read at the cycle's time) and pending jobs' bars (what a victim's key
must be above).

Preempt `by: order` compares possible victims' rank keys with each blocked job's bar. Most
cycles find that nobody ranks above any blocked job, and learning it by computing every key
afresh grew with the running set and the queue, every cycle. A pending job's bar depends on
the job as the caller sees it (an immutable view) and the policy alone. How a running job's
key moves with time is known for two kinds of order:

- `steps` (`las`, which names its next step: `next_change_gpu_s`): the key depends on attained
  service alone and changes only when it reaches the next step, at a known instant. A key is
  kept, exactly, from the instant it was computed to the last instant still below that step.
- `falls` (`qssf`, `sjf`: shortest remaining first): the key depends on the job and its
  estimate alone, never falling as the estimate grows, and a running job's estimate is its time
  left, which shrinks until its expected end. A key computed at one instant is an upper bound
  of the key at every later instant before the expected end.

So per cycle each table is synced with its set of jobs (set operations in C, and work for what
came, went or reached a step). The highest running key is found from the highest kept value
(values above the rest are made exact first: usually one, for the job that stays on top), and
the blocked jobs' bars are read from the table (the lowest of all pending from a heap). When no
running key is above any blocked job's bar and no elastic job could be shrunk, preemption has
nothing to try this cycle.

Invariants:
- After `sync(running, now)`, `KeptRanks` holds exactly the views of `running`, each with an
  interval containing `now` over which its value equals the key (`steps`) or is at least it
  (`falls`); `top(now, compute)` is then the highest key at `now` among them (with `above`,
  at least it, and exactly it when above `above`), and `shrinkable` the number of them that
  preemption could shrink.
- `key(view, now, compute)` always equals `compute(view)`, the key at `now`.
- Under `steps`, `_by_value` files every entry's view under its value; after `sync` at `now`
  `views_above(bar, now)` holds exactly the views whose key at `now` is above `bar`.
- After `sync(pending)`, `KeptBars` holds exactly the jobs of `pending`, each with its bar
  (synced from a `PendingQueue`'s log, the log replays to exactly its jobs).
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
from operator import itemgetter

from aisched.core.pending import PendingQueue
from aisched.core.plugins.order import PredictedGpuTime, ShortestFirst
from aisched.core.snapshot import PendingJob, RunningChanges, RunningJob
from aisched.model.resources import GPU_MILLI_WHOLE

# Steps back from the estimated crossing instant to find one still below the step; past this
# many (a job holding a tiny GPU share, whose service moves less than a rounding step per
# instant), the key is kept for no later instant than the one it was computed at.
_STEPS_BACK = 4
# Heap items kept beyond twice the entries before the heaps are rebuilt.
_SLACK = 64

Compute = Callable[[RunningJob], float]  # a running job's key at the cycle's time
_BAR = itemgetter(1)
NextChange = Callable[[float], "float | None"]


class Moves(Enum):
    """How a running job's rank key moves with time (see the module's description)."""

    STEPS = "steps"
    FALLS = "falls"


# Orders whose key depends on the job and its estimate alone and never falls as the estimate
# grows (tests/property/test_kept_ranks.py checks it of each). Listed by class: an order left
# out only costs the keys computed afresh every cycle, never a wrong decision.
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


def shrinkable(view: RunningJob) -> bool:
    """Whether preemption could shrink this running job: preemptible, not stopping, elastic
    with tasks above its minimum."""
    job = view.job
    return (
        job.preemptible and not view.terminating and job.elastic and len(view.tasks) > job.gang_min
    )


@dataclass(frozen=True, slots=True)
class _Entry:
    view: RunningJob
    value: float
    from_s: float
    to_s: float  # the value holds for every now in [from_s, to_s]
    serial: int


@dataclass(slots=True)
class KeptRanks:
    """Running jobs' rank keys. `next_change(attained)`: the order's next step of attained
    service (`steps` only; None: the key never changes again)."""

    moves: Moves
    next_change: NextChange | None = None
    entries: dict[int, _Entry] = field(default_factory=dict)
    shrinkable: int = 0  # entries whose view preemption could shrink
    _now: float = -math.inf
    _synced: tuple[RunningJob, ...] = ()  # the running set of the last sync (held)
    _log: RunningChanges | None = None  # where the caller's log stood at the last sync
    _serial: int = 0
    _tops: list[tuple[float, int, int]] = field(default_factory=list)  # (-value, serial, id)
    _ends: list[tuple[float, int, int]] = field(default_factory=list)  # (to_s, serial, id)
    # `steps` only: the views kept at each value, so those above a bar are read without the
    # rest (a LAS key takes a few values, and most running jobs rank below most bars).
    _by_value: dict[float, dict[int, RunningJob]] = field(default_factory=dict)

    def sync(
        self,
        running: tuple[RunningJob, ...],
        now: float,
        compute: Compute,
        changes: RunningChanges | None = None,
    ) -> None:
        """Make the table hold exactly `running`, every entry valid at `now`. A tuple, so the
        same object as last time holds the same views. `changes`: the caller's log of the
        running set at `running` (`Snapshot.changes`), followed when it can be."""
        if now < self._now:  # an earlier instant: nothing kept is known to hold there
            self._clear()
        self._now = now
        entries = self.entries
        if running is not self._synced and not self._follow(changes, now, compute):
            self._log = changes
            ids = set(map(id, running))
            for i in entries.keys() - ids:
                self.shrinkable -= shrinkable(self._drop(i).view)
            # An entry holds its view, so a view new to the table has an id new to it too;
            # new attempts come last in a running set kept in start order: look from the back.
            came = len(ids) - len(entries)
            for view in reversed(running):
                if not came:
                    break
                if id(view) not in entries:
                    came -= 1
                    self._put(view, now, compute(view))
                    self.shrinkable += shrinkable(view)
        self._synced = running
        ends = self._ends
        while ends and ends[0][0] < now:
            _, serial, i = heapq.heappop(ends)
            hit = entries.get(i)
            if hit is not None and hit.serial == serial:
                self._put(hit.view, now, compute(hit.view))
        if len(self._tops) + len(ends) > 4 * len(entries) + _SLACK:
            self._rebuild_heaps()

    def _follow(self, changes: RunningChanges | None, now: float, compute: Compute) -> bool:
        """Apply what `changes` logged since the last sync, when it is the log that sync
        followed (or compared against) and has gone on from there; False otherwise."""
        last = self._log
        if (
            changes is None
            or last is None
            or changes.log is not last.log
            or changes.upto < last.upto
        ):
            return False
        entries = self.entries
        for view, came in changes.log[last.upto : changes.upto]:
            if came:  # ADDED or IN_PLACE
                self._put(view, now, compute(view))
                self.shrinkable += shrinkable(view)
            else:
                hit = entries.get(id(view))
                if hit is not None and hit.view is view:
                    self._drop(id(view))
                    self.shrinkable -= shrinkable(view)
        self._log = changes
        return True

    def top(self, now: float, compute: Compute, above: float = -math.inf) -> float:
        """At least the highest key at `now` of the views synced, and exactly it when it is
        above `above` (-inf when there are none). A kept upper bound above every other, and
        above `above`, is made exact first, as often as it takes: usually once, for the job
        that stays on top."""
        tops, entries = self._tops, self.entries
        while tops:
            value, serial, i = tops[0]
            hit = entries.get(i)
            if hit is None or hit.serial != serial:
                heapq.heappop(tops)
            elif -value <= above or self._exact(hit, now):
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

    def above(
        self, views: list[RunningJob], bar: float, now: float, compute: Compute
    ) -> list[RunningJob]:
        """The views (in their order) whose key at `now` is above `bar`: from the table where
        its value is exact, or (`falls`) a bound no higher than `bar`; computed otherwise."""
        entries, falls, out = self.entries, self.moves is Moves.FALLS, []
        for view in views:
            hit = entries.get(id(view))
            if hit is not None and hit.view is view and hit.from_s <= now <= hit.to_s:
                if not falls or hit.from_s == now:
                    if hit.value > bar:
                        out.append(view)
                    continue
                if hit.value <= bar:  # an upper bound: its key is no higher
                    continue
            if compute(view) > bar:
                out.append(view)
        return out

    def views_above(self, bar: float, now: float) -> list[RunningJob] | None:
        """`steps`, synced at `now`: every view kept whose key at `now` is above `bar`, in no
        set order, read from the values above it alone; None otherwise (`above` then)."""
        if self.moves is not Moves.STEPS or now != self._now:
            return None
        out: list[RunningJob] = []
        for value, views in self._by_value.items():
            if value > bar:
                out.extend(views.values())
        return out

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
        if self.moves is Moves.STEPS:
            if i in self.entries:
                self._drop(i)
            self._by_value.setdefault(value, {})[i] = view
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

    def _drop(self, i: int) -> _Entry:
        """Take the entry of id `i` out of the table (and its value's views)."""
        entry = self.entries.pop(i)
        if self.moves is Moves.STEPS:
            views = self._by_value[entry.value]
            del views[i]
            if not views:
                del self._by_value[entry.value]
        return entry

    def _clear(self) -> None:
        self._synced = ()
        self._log = None
        self.shrinkable = 0
        self.entries.clear()
        self._by_value.clear()
        self._tops.clear()
        self._ends.clear()

    def _rebuild_heaps(self) -> None:
        entries = self.entries.items()
        self._tops = [(-e.value, e.serial, i) for i, e in entries]
        self._ends = [(e.to_s, e.serial, i) for i, e in entries if e.to_s < math.inf]
        heapq.heapify(self._tops)
        heapq.heapify(self._ends)


@dataclass(slots=True)
class KeptBars:
    """Pending jobs' bars; `bar_of(pj)` computes one (it depends on the job alone). Synced
    from the caller's `PendingQueue` log when it is given and followable (a few jobs per
    cycle), else by comparing whole sets."""

    bar_of: Callable[[PendingJob], float]
    entries: dict[int, tuple[PendingJob, float, int]] = field(default_factory=dict)
    _synced: tuple[PendingJob, ...] = ()  # the pending set of the last sync (held)
    _queue: PendingQueue | None = None  # the queue whose log the last sync followed
    _generation: int = -1
    _seen: int = 0  # entries of that log already taken in
    _serial: int = 0
    _lows: list[tuple[float, int, int]] = field(default_factory=list)  # (bar, serial, id)

    def sync(self, pending: tuple[PendingJob, ...], queue: PendingQueue | None = None) -> None:
        """Make the table hold exactly `pending`: the jobs of `queue` now, when it is given.
        A tuple, so the same object as last time holds the same jobs."""
        if pending is self._synced:
            return
        self._synced = pending
        entries = self.entries
        if queue is not None and queue is self._queue and queue.generation == self._generation:
            log = queue.log
            for pj, added in log[self._seen :]:
                if added:
                    self._put(pj)
                else:
                    hit = entries.get(id(pj))
                    if hit is not None and hit[0] is pj:
                        del entries[id(pj)]
            self._seen = len(log)
        else:
            ids = set(map(id, pending))
            for i in entries.keys() - ids:
                del entries[i]
            came = len(ids) - len(entries)  # as in KeptRanks.sync: new ones come last, new ids
            for pj in reversed(pending):
                if not came:
                    break
                if id(pj) not in entries:
                    came -= 1
                    self._put(pj)
            self._queue = queue
            self._generation = queue.generation if queue is not None else -1
            self._seen = len(queue.log) if queue is not None else 0
        if len(self._lows) > 2 * len(entries) + _SLACK:
            self._lows = [(bar, serial, i) for i, (_, bar, serial) in entries.items()]
            heapq.heapify(self._lows)

    def bar(self, pj: PendingJob) -> float:
        """`bar_of(pj)`, from the table when the job is in it."""
        hit = self.entries.get(id(pj))
        return hit[1] if hit is not None and hit[0] is pj else self.bar_of(pj)

    def below(self, jobs: list[PendingJob], top: float) -> list[int]:
        """The positions, in order, of the `jobs` whose bar is below `top`."""
        entries, out = self.entries, []
        for k, pj in enumerate(jobs):  # `bar` inlined: this reads every blocked job
            hit = entries.get(id(pj))
            if (hit[1] if hit is not None and hit[0] is pj else self.bar_of(pj)) < top:
                out.append(k)
        return out

    def lowest_of_all(self) -> float:
        """The lowest bar of the jobs synced (inf when there are none), from a heap: a caller
        may ask it between cycles at the cost of the jobs that came and went."""
        lows, entries = self._lows, self.entries
        while lows:
            bar, serial, i = lows[0]
            hit = entries.get(i)
            if hit is not None and hit[2] == serial:
                return bar
            heapq.heappop(lows)
        return math.inf

    def lowest_without(self, ids: set[str]) -> float:
        """The lowest bar of the jobs synced whose id is not in `ids` (inf when none): the
        heap's items in ascending order until one is such a job, so the work grows with the
        jobs left out and the stale items met, not with the table."""
        lows, entries = self._lows, self.entries
        ahead = [(lows[0], 0)] if lows else []
        while ahead:
            (bar, serial, i), at = heapq.heappop(ahead)
            hit = entries.get(i)
            if hit is not None and hit[2] == serial and hit[0].id not in ids:
                return bar
            for child in (2 * at + 1, 2 * at + 2):
                if child < len(lows):
                    heapq.heappush(ahead, (lows[child], child))
        return math.inf

    def _put(self, pj: PendingJob) -> None:
        self._serial += 1
        bar = self.bar_of(pj)
        self.entries[id(pj)] = (pj, bar, self._serial)
        heapq.heappush(self._lows, (bar, self._serial, id(pj)))


@dataclass(slots=True)
class KeptRanking:
    """What one preempt action keeps: its running ranks and its pending bars."""

    owner: tuple[object, object]  # the policy and the action (held: ids stay)
    running: KeptRanks
    bars: KeptBars

    def owns(self, policy: object, action: object) -> bool:
        return self.owner[0] is policy and self.owner[1] is action

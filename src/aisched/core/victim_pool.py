"""The running jobs that one preempt or reclaim walk may evict, put in victim order only when a
what-if needs them so.

A walk asks for many blocked jobs who would be eligible to go, and most of them find nobody,
so the pool is kept in the order the running jobs came (cheap to filter) and a list of
candidates is sorted by the policy's victim selectors (`framework.victim_keys`) only when a
what-if eviction is about to take a prefix of it. The keys are computed once per job per walk.

Most searches for room take one victim, the first in victim order: `InVictimOrder` finds it
in one pass (the first selector's key of every job, whole keys only for those tied on it) and
sorts only when more than the first is read.

Invariant: `ordered(xs)` equals `xs` filtered out of the whole pool sorted by victim key, since
the key is a total order (its last word is the job id): sorting after filtering gives what
filtering after sorting gave; `InVictimOrder(pool, xs)` reads as `ordered(xs)`, position for
position. `holds(r)` is whether `r` is one of `jobs` (the same object), whenever `jobs` is first
read: the session's running set changes in a walk only by evictions and shrinks (which the walk
drops) and by binds (placed in this cycle, never in the pool). Pure, per cycle: nothing is kept
past the walk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, overload

from aisched.core.framework import victim_key, victim_keys
from aisched.core.snapshot import RunningJob

if TYPE_CHECKING:
    from aisched.core.session import Session

VictimKey = tuple[float | str, ...]


class VictimPool:
    """Every possible victim of one walk: preemptible, not already terminating, not placed in
    this cycle. `jobs` is in the session's running order, listed when first read (a walk that
    finds its candidates from kept ranks never reads it; `holds` asks of one job)."""

    __slots__ = ("_keys", "_now", "_victims", "_session", "_jobs", "_dropped")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._jobs: list[RunningJob] | None = None
        self._dropped: set[str] = set()
        self._victims = session.policy.victims
        self._now = session.now
        self._keys: dict[str, VictimKey] = {}

    @property
    def jobs(self) -> list[RunningJob]:
        if self._jobs is None:
            # `holds`'s test, inlined (this reads every running job; the property test of the
            # pool ties the two)
            bound_now, dropped = self._session.bound_now, self._dropped
            self._jobs = [
                r
                for r in self._session.running.values()
                if r.job.preemptible
                and not r.terminating
                and r.id not in bound_now
                and r.id not in dropped
            ]
        return self._jobs

    def holds(self, r: RunningJob) -> bool:
        """Whether `r` is in `jobs`: the session's running view of its job, a possible victim,
        not dropped."""
        session = self._session
        return (
            session.running.get(r.id) is r
            and r.job.preemptible
            and not r.terminating
            and r.id not in session.bound_now
            and r.id not in self._dropped
        )

    def ordered(self, jobs: Sequence[RunningJob]) -> list[RunningJob]:
        """`jobs` (members of the pool) in victim order: first to be evicted first."""
        keys = self._keys
        missing = [r for r in jobs if r.id not in keys]
        if missing:
            new = victim_keys(self._victims, missing, self._now)
            keys.update(zip([r.id for r in missing], new, strict=True))
        return sorted(jobs, key=lambda r: keys[r.id])

    def first(self, jobs: Sequence[RunningJob]) -> RunningJob:
        """`ordered(jobs)[0]` (`jobs` not empty): the lowest first key, whole keys compared
        only among the jobs tied on it."""
        victims, now = self._victims, self._now
        if not victims:
            return self.ordered(jobs)[0]
        selector = victims[0]
        many = getattr(selector, "keys", None)
        firsts = many(jobs, now) if many is not None else [selector.key(r, now) for r in jobs]
        low = min(firsts)
        tied = [r for r, k in zip(jobs, firsts, strict=True) if k == low]
        if len(tied) == 1:
            return tied[0]
        keys = self._keys
        return min(tied, key=lambda r: keys.get(r.id) or victim_key(victims, r, now))

    def drop(self, gone: Iterable[str]) -> None:
        """Take the jobs `gone` (evicted or shrunk) out of the pool."""
        out = set(gone)
        self._dropped |= out
        if self._jobs is not None:
            self._jobs = [r for r in self._jobs if r.id not in out]


class InVictimOrder(Sequence[RunningJob]):
    """`pool.ordered(jobs)`, sorted only when more than its first job is read."""

    __slots__ = ("_pool", "_jobs", "_first", "_sorted")

    def __init__(self, pool: VictimPool, jobs: list[RunningJob]) -> None:
        self._pool, self._jobs = pool, jobs
        self._first: RunningJob | None = None
        self._sorted: list[RunningJob] | None = None

    def __len__(self) -> int:
        return len(self._jobs)

    @overload
    def __getitem__(self, i: int) -> RunningJob: ...

    @overload
    def __getitem__(self, i: slice) -> list[RunningJob]: ...

    def __getitem__(self, i: int | slice) -> RunningJob | list[RunningJob]:
        if i == 0 and self._sorted is None and self._jobs:
            if self._first is None:
                self._first = self._pool.first(self._jobs)
            return self._first
        if self._sorted is None:
            self._sorted = self._pool.ordered(self._jobs)
        return self._sorted[i]

    def without(self, gone: set[str]) -> InVictimOrder:
        """The same order less the jobs `gone`."""
        out = InVictimOrder(self._pool, [r for r in self._jobs if r.id not in gone])
        if self._sorted is not None:
            out._sorted = [r for r in self._sorted if r.id not in gone]
        return out

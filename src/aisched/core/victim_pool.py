"""The running jobs that one preempt or reclaim walk may evict, put in victim order only when a
what-if needs them so.

A walk asks for many blocked jobs who would be eligible to go, and most of them find nobody,
so the pool is kept in the order the running jobs came (cheap to filter) and a list of
candidates is sorted by the policy's victim selectors (`framework.victim_keys`) only when a
what-if eviction is about to take a prefix of it. The keys are computed once per job per walk.

Invariant: `ordered(xs)` equals `xs` filtered out of the whole pool sorted by victim key, since
the key is a total order (its last word is the job id): sorting after filtering gives what
filtering after sorting gave. Pure, per cycle: nothing is kept past the walk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from aisched.core.framework import victim_keys
from aisched.core.snapshot import RunningJob

if TYPE_CHECKING:
    from aisched.core.session import Session

VictimKey = tuple[float | str, ...]


class VictimPool:
    """Every possible victim of one walk: preemptible, not already terminating, not placed in
    this cycle. `jobs` is in the session's running order."""

    __slots__ = ("_keys", "_now", "_victims", "jobs")

    def __init__(self, session: Session) -> None:
        bound_now = session.bound_now
        self.jobs: list[RunningJob] = [
            r
            for r in session.running.values()
            if r.job.preemptible and not r.terminating and r.id not in bound_now
        ]
        self._victims = session.policy.victims
        self._now = session.now
        self._keys: dict[str, VictimKey] = {}

    def ordered(self, jobs: Sequence[RunningJob]) -> list[RunningJob]:
        """`jobs` (members of the pool) in victim order: first to be evicted first."""
        keys = self._keys
        missing = [r for r in jobs if r.id not in keys]
        if missing:
            new = victim_keys(self._victims, missing, self._now)
            keys.update(zip([r.id for r in missing], new, strict=True))
        return sorted(jobs, key=lambda r: keys[r.id])

    def drop(self, gone: Iterable[str]) -> None:
        """Take the jobs `gone` (evicted or shrunk) out of the pool."""
        out = set(gone)
        self.jobs = [r for r in self.jobs if r.id not in out]

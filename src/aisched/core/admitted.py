"""The admitted order, kept from one cycle to the next.

A pending job's order key (`framework.order_key`), its admission (`enqueue.admission_refusal`)
and its placement shape depend only on the job as the caller sees it (the immutable
`PendingJob`), the policy, the queue tree and the cluster. Between two cycles the pending set
usually changes by a few jobs, so enqueue does not sort the whole queue again: it keeps the
admitted jobs sorted, and each cycle removes the jobs that left and inserts those that came
(binary search), then copies the list. A cycle's cost then grows with what changed, and only
a copy and a few set operations, done in C, grow with the queue.

Invariants:
- `keys` is sorted and holds exactly the keys of the admitted members, `jobs` and `shapes` in
  the same positions; a refused member is in `refused` and in no list.
- Keys are unique: every key ends with the job's tie break, whose last word is its id, and a
  job is pending at most once. So the kept list equals what a stable sort of the pending jobs
  by key gives, whatever order they came in.
- Members are held by reference, so no `id()` in `members` can be reused while it is kept.

Kept in the cluster arrays' memo (like the core's other cross-cycle caches), one per policy and
queue tree; it holds both, so neither id can be reused meanwhile. Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from aisched.core.snapshot import PendingJob

# Rebuilding (one sort) is cheaper than this many single insertions or removals, each of which
# moves the tail of the lists.
REBUILD_AT = 64

Key = tuple[float | str, ...]


@dataclass(frozen=True, slots=True)
class Member:
    pj: PendingJob
    key: Key
    refusal: str | None  # why the job can never run here, or None when admitted
    shape: Hashable


@dataclass(slots=True)
class AdmittedOrder:
    """The admitted pending jobs in scheduling order, with their shapes, and the refused ones."""

    owner: tuple[object, ...]  # the policy and queue tree it was built for (held: ids stay)
    members: dict[int, Member] = field(default_factory=dict)
    keys: list[Key] = field(default_factory=list)
    jobs: list[PendingJob] = field(default_factory=list)
    shapes: list[Hashable] = field(default_factory=list)
    refused: dict[int, Member] = field(default_factory=dict)
    queues: dict[str, int] = field(default_factory=dict)  # admitted jobs per queue name

    def update(
        self, pending: tuple[PendingJob, ...], judge: Callable[[PendingJob], Member]
    ) -> None:
        """Make the kept order that of `pending`; `judge` gives a job new to it its member."""
        ids = set(map(id, pending))
        members = self.members
        gone = members.keys() - ids
        came = ids - members.keys()
        if len(gone) + len(came) > REBUILD_AT or len(ids) != len(pending):
            self._rebuild(pending, judge)
            return
        for i in gone:
            m = members.pop(i)
            if m.refusal is not None:
                del self.refused[i]
                continue
            at = bisect_left(self.keys, m.key)
            assert self.jobs[at] is m.pj, "the kept order lost a job"
            del self.keys[at], self.jobs[at], self.shapes[at]
            self._count(m.pj.job.queue, -1)
        if came:  # new jobs come last in an insertion-ordered queue: look from the back
            for pj in reversed(pending):
                i = id(pj)
                if i in came:
                    self._add(i, judge(pj))
                    came.discard(i)
                    if not came:
                        break

    def _add(self, i: int, m: Member) -> None:
        self.members[i] = m
        if m.refusal is not None:
            self.refused[i] = m
            return
        at = bisect_left(self.keys, m.key)
        self.keys.insert(at, m.key)
        self.jobs.insert(at, m.pj)
        self.shapes.insert(at, m.shape)
        self._count(m.pj.job.queue, 1)

    def _count(self, queue: str, by: int) -> None:
        left = self.queues.get(queue, 0) + by
        if left:
            self.queues[queue] = left
        else:
            del self.queues[queue]

    @property
    def only_queue(self) -> str | None:
        """The one queue every admitted job is in, or None (none admitted, or several)."""
        return next(iter(self.queues)) if len(self.queues) == 1 else None

    def _rebuild(
        self, pending: tuple[PendingJob, ...], judge: Callable[[PendingJob], Member]
    ) -> None:
        old = self.members
        members: dict[int, Member] = {}
        for pj in pending:
            m = old.get(id(pj))
            members[id(pj)] = m if m is not None else judge(pj)
        # From `pending`, not `members`: a job given twice (bad input) stays twice, as a sort
        # of the queue would keep it; the next update then rebuilds again.
        admitted = sorted(
            (m for m in map(members.__getitem__, map(id, pending)) if m.refusal is None), key=_key
        )
        self.members = members
        self.refused = {i: m for i, m in members.items() if m.refusal is not None}
        self.keys = [m.key for m in admitted]
        self.jobs = [m.pj for m in admitted]
        self.shapes = [m.shape for m in admitted]
        self.queues = {}
        for m in admitted:
            self._count(m.pj.job.queue, 1)


def _key(m: Member) -> Key:
    return m.key


__all__ = ["REBUILD_AT", "AdmittedOrder", "Member"]

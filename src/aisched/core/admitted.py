"""The admitted order, kept from one cycle to the next.

A pending job's order key (`framework.order_key`), its admission (`enqueue.admission_refusal`)
and its placement shape depend only on the job as the caller sees it (the immutable
`PendingJob`), the policy, the queue tree and the cluster. Between two cycles the pending set
usually changes by a few jobs, so enqueue does not sort the whole queue again: it keeps the
admitted jobs sorted, and each cycle removes the jobs that left and inserts those that came
(binary search). When the caller keeps its jobs in a `PendingQueue`, what came and went is
read from the queue's log, so a cycle's cost grows with what changed; from a plain sequence
it is found by comparing the whole queue with the last one (a few set operations in C).

Besides the order it keeps, per queue, that queue's jobs in order and each shape's keys among
them (`QueueIndex`), so allocate can find the next job of a shape that has not failed without
walking the queue (`core.actions.shape_walk`); and every member by job id, for the statuses
stated by a rule (`core.statuses`).

Invariants:
- `keys` is sorted and holds exactly the keys of the admitted members, `jobs` and `shapes` in
  the same positions; a refused member is in `refused` and in no list. Each queue's index
  holds the same for that queue's admitted members, and its `shape_keys` partition its keys
  by shape, each list sorted; an empty queue or shape has no entry.
- Keys are unique: every key ends with the job's tie break, whose last word is its id, and a
  job is pending at most once. So the kept list equals what a stable sort of the pending jobs
  by key gives, whatever order they came in.
- `by_id` holds every member by job id. A cycle's statuses borrow it (`lend_members`);
  before it next changes, the borrower, if still alive, is given its own copy, so what it
  reads never changes. (A simulator drops each cycle's result before the next, so no copy
  is made there: a cycle costs no O(queue) copy.)
- Members are held by reference, so no `id()` in `members` can be reused while it is kept;
  the same holds for the jobs in the log of the queue it follows.

Kept in the cluster arrays' memo (like the core's other cross-cycle caches), one per policy and
queue tree; it holds both, so neither id can be reused meanwhile. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
import weakref
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aisched.core.pending import PendingQueue
from aisched.core.snapshot import PendingJob

# Rebuilding (one sort) is cheaper than this many single insertions or removals, each of which
# moves the tail of the lists.
REBUILD_AT = 64

Key = tuple[float | str, ...]


class Borrower(Protocol):
    """Who borrows the members by job id (a cycle's `Statuses`); must allow weak references."""

    def know_members(self, members: Mapping[str, Member]) -> None: ...


@dataclass(frozen=True, slots=True)
class Member:
    pj: PendingJob
    key: Key
    refusal: str | None  # why the job can never run here, or None when admitted
    shape: Hashable


@dataclass(slots=True)
class QueueIndex:
    """One queue's admitted jobs in order, and each shape's keys among them (sorted)."""

    keys: list[Key] = field(default_factory=list)
    jobs: list[PendingJob] = field(default_factory=list)
    shape_keys: dict[Hashable, list[Key]] = field(default_factory=dict)
    # Each shape's first key, as a heap, kept until a job comes or goes (`heads`).
    _heads: list[tuple[Key, Hashable]] | None = None

    def heads(self) -> list[tuple[Key, Hashable]]:
        """(first key, shape) of every shape, as a heap: a new list, the caller's to change.
        Worked out again only after the index changed: most queues keep theirs between
        cycles, and allocate's walk starts from it every cycle."""
        heads = self._heads
        if heads is None:
            heads = self._heads = [(keys[0], shape) for shape, keys in self.shape_keys.items()]
            heapq.heapify(heads)
        return heads.copy()

    def add(self, m: Member) -> None:
        self._heads = None
        at = bisect_left(self.keys, m.key)
        self.keys.insert(at, m.key)
        self.jobs.insert(at, m.pj)
        keys = self.shape_keys.get(m.shape)
        if keys is None:
            self.shape_keys[m.shape] = [m.key]
        else:
            insort(keys, m.key)

    def remove(self, m: Member) -> None:
        self._heads = None
        at = bisect_left(self.keys, m.key)
        assert self.jobs[at] is m.pj, "a queue's kept order lost a job"
        del self.keys[at], self.jobs[at]
        keys = self.shape_keys[m.shape]
        del keys[bisect_left(keys, m.key)]
        if not keys:
            del self.shape_keys[m.shape]


@dataclass(slots=True)
class AdmittedOrder:
    """The admitted pending jobs in scheduling order, with their shapes, and the refused ones."""

    owner: tuple[object, ...]  # the policy and queue tree it was built for (held: ids stay)
    members: dict[int, Member] = field(default_factory=dict)
    keys: list[Key] = field(default_factory=list)
    jobs: list[PendingJob] = field(default_factory=list)
    shapes: list[Hashable] = field(default_factory=list)
    refused: dict[int, Member] = field(default_factory=dict)
    by_queue: dict[str, QueueIndex] = field(default_factory=dict)  # admitted jobs per queue
    by_id: dict[str, Member] = field(default_factory=dict)
    # The queue whose log it follows, that log's generation, and how much of it was applied.
    source: PendingQueue | None = None
    generation: int = -1
    seen: int = 0
    # The statuses `by_id` was lent to since it last changed: before it next changes, those
    # still alive are given a copy (one, shared: nobody changes it).
    _borrowers: list[weakref.ref[Borrower]] = field(default_factory=list)

    def update(
        self,
        pending: Sequence[PendingJob],
        judge: Callable[[PendingJob], Member],
        source: PendingQueue | None = None,
    ) -> None:
        """Make the kept order that of `pending`; `judge` gives a job new to it its member.
        With `source` (the queue `pending` was taken from, unchanged since), only the
        changes in its log since the last update are applied, when the log has them."""
        if (
            source is not None
            and source is self.source
            and source.generation == self.generation
            and self.seen <= len(source.log)
        ):
            changes = source.log[self.seen :]
            if len(changes) <= REBUILD_AT and self._follow(changes, judge):
                self.seen = len(source.log)
                return
        self._compare(pending, judge)
        self.source = source
        self.generation = source.generation if source is not None else -1
        self.seen = len(source.log) if source is not None else 0

    def lend_members(self, borrower: Borrower) -> None:
        """Lend every member by job id to `borrower` (see the invariants)."""
        self._borrowers.append(weakref.ref(borrower))
        borrower.know_members(self.by_id)

    def _follow(
        self, changes: Sequence[tuple[PendingJob, bool]], judge: Callable[[PendingJob], Member]
    ) -> bool:
        """Apply a queue's changes in order; False at one that does not fit what is kept (the
        caller then compares whole queues, which mends any state this leaves)."""
        members = self.members
        for pj, added in changes:
            i = id(pj)
            if added:
                if i in members:
                    return False
                self._add(i, judge(pj))
            else:
                m = members.get(i)
                if m is None:
                    return False
                self._remove(i, m)
        return True

    def _compare(
        self, pending: Sequence[PendingJob], judge: Callable[[PendingJob], Member]
    ) -> None:
        ids = set(map(id, pending))
        members = self.members
        gone = members.keys() - ids
        came = ids - members.keys()
        if len(gone) + len(came) > REBUILD_AT or len(ids) != len(pending):
            self._rebuild(pending, judge)
            return
        for i in gone:
            self._remove(i, members[i])
        if came:  # new jobs come last in an insertion-ordered queue: look from the back
            for pj in reversed(pending):
                i = id(pj)
                if i in came:
                    self._add(i, judge(pj))
                    came.discard(i)
                    if not came:
                        break

    def _own_by_id(self) -> dict[str, Member]:
        if self._borrowers:
            alive = [b for ref in self._borrowers if (b := ref()) is not None]
            if alive:  # still read: they keep the table as it was
                copy = dict(self.by_id)
                for borrower in alive:
                    borrower.know_members(copy)
            self._borrowers.clear()
        return self.by_id

    def _add(self, i: int, m: Member) -> None:
        self.members[i] = m
        self._own_by_id()[m.pj.id] = m
        if m.refusal is not None:
            self.refused[i] = m
            return
        at = bisect_left(self.keys, m.key)
        self.keys.insert(at, m.key)
        self.jobs.insert(at, m.pj)
        self.shapes.insert(at, m.shape)
        queue = m.pj.job.queue
        index = self.by_queue.get(queue)
        if index is None:
            index = self.by_queue[queue] = QueueIndex()
        index.add(m)

    def _remove(self, i: int, m: Member) -> None:
        del self.members[i]
        by_id = self._own_by_id()
        if by_id.get(m.pj.id) is m:
            del by_id[m.pj.id]
        if m.refusal is not None:
            del self.refused[i]
            return
        at = bisect_left(self.keys, m.key)
        assert self.jobs[at] is m.pj, "the kept order lost a job"
        del self.keys[at], self.jobs[at], self.shapes[at]
        queue = m.pj.job.queue
        index = self.by_queue[queue]
        index.remove(m)
        if not index.keys:
            del self.by_queue[queue]

    @property
    def only_queue(self) -> str | None:
        """The one queue every admitted job is in, or None (none admitted, or several)."""
        return next(iter(self.by_queue)) if len(self.by_queue) == 1 else None

    def _rebuild(
        self, pending: Sequence[PendingJob], judge: Callable[[PendingJob], Member]
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
        self.by_id = {m.pj.id: m for m in members.values()}  # a new table: the lent one stays
        self._borrowers.clear()
        self.by_queue = {}
        for m in admitted:  # in key order: each list is appended to in order
            index = self.by_queue.get(m.pj.job.queue)
            if index is None:
                index = self.by_queue[m.pj.job.queue] = QueueIndex()
            index.keys.append(m.key)
            index.jobs.append(m.pj)
            index.shape_keys.setdefault(m.shape, []).append(m.key)


def _key(m: Member) -> Key:
    return m.key


__all__ = ["REBUILD_AT", "AdmittedOrder", "Borrower", "Member", "QueueIndex"]

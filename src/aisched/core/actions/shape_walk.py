"""allocate's walk in work that grows with what it places and the shapes waiting, not the queue.

The case: enqueue kept the candidates (`core.admitted`: none promoted for starving, none cut by
a queue depth), every one of them is in a queue no limit governs, users are not interleaved
(no drf) and no reservation is held. Allocate's general walk (`Allocate.execute`) then takes
the next job from the queue with the lowest fair-share key, ties to the earlier job; shares
change only when a placement changes usage, and within a cycle capacity only shrinks, so a job
whose shape has failed fails again for the same reason and changes nothing. So:

1. Between two binds the walk goes through the queues in order of share, queues of equal share
   merged by scheduling order. Only the first job of a shape not yet failed is tried; each
   queue finds its next one from the kept keys of each of its shapes (a small heap of shapes,
   binary search), never by passing the jobs in between one by one.
2. After a bind the shares are computed again, and each queue goes on from where it stood.
3. Every job left waits for its shape's reason: one rule in the statuses (`core.statuses`),
   not a status per job. Under strict order the first job that does not fit stops the walk and
   every later one waits behind it, again by one rule.
4. When an action runs after allocate, the blocked list is built as the general walk builds it:
   the jobs in the order it visits them (slices of the queues' kept lists, equal shares merged
   by key); once every shape has failed, the rest in candidate order (`Allocate._fail_rest`).
   With several queues it is merged only when first read (`Session.blocked`).
   With one queue both orders are the candidates' own, and preempt is told so.

The decisions, statuses and blocked list are those of the general walk, whose rules this module
must follow (tests/unit/core/test_incremental_cycle.py compares the two on the same inputs).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Hashable
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, TypeVar

from aisched.core.admitted import Key, QueueIndex
from aisched.core.queues import fair_key
from aisched.core.reservation import place_beside
from aisched.core.snapshot import PendingJob
from aisched.core.status import JobStatus, StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session

BEHIND = JobStatus(StatusCode.NOT_CONSIDERED, "behind a blocked job")
_first, _second = itemgetter(0), itemgetter(1)
T = TypeVar("T")


def applies(session: Session) -> bool:
    """Whether `walk` gives what the general walk would, this cycle."""
    kept = session.kept_order
    if kept is None or session.promoted or session.reservations or session.policy.fair_users:
        return False
    ungoverned = session.queues.ungoverned
    return all(queue in ungoverned for queue in kept.by_queue)


class _Queue:
    """One queue's place in the walk: its next job, and a heap of its shapes not yet failed
    by the key of their next job (entries of failed shapes are dropped when they surface)."""

    __slots__ = ("name", "index", "at", "shapes")

    def __init__(self, name: str, index: QueueIndex) -> None:
        self.name = name
        self.index = index
        self.at = 0  # position in `index` of the next job not yet visited
        self.shapes = index.heads()

    @property
    def left(self) -> bool:
        return self.at < len(self.index.keys)

    def head(self) -> Key:
        return self.index.keys[self.at]

    def next_try(self, untried: set[Hashable]) -> tuple[Key, Hashable] | None:
        """The key and shape of its next job whose shape has not failed, or None."""
        if not self.left:
            return None
        head = self.index.keys[self.at]
        shapes = self.shapes
        while shapes:
            key, shape = shapes[0]
            if shape not in untried:
                heapq.heappop(shapes)
            elif key < head:  # passed by the walk: that shape's next job at or after the head
                keys = self.index.shape_keys[shape]
                j = bisect_left(keys, head)
                if j == len(keys):
                    heapq.heappop(shapes)
                else:
                    heapq.heapreplace(shapes, (keys[j], shape))
            else:
                return key, shape
        return None

    def to(self, key: Key) -> tuple[_Queue, int, int]:
        """Visit its jobs before `key`: the span of its index they are."""
        start = self.at
        self.at = end = bisect_left(self.index.keys, key, start)
        return self, start, end

    def skip_to(self, key: Key) -> None:
        """Visit its jobs before `key`, with nothing to return."""
        self.at = bisect_left(self.index.keys, key, self.at)

    def rest(self) -> tuple[_Queue, int, int]:
        """Visit all its jobs left: the span of its index they are."""
        start = self.at
        self.at = end = len(self.index.keys)
        return self, start, end


# Jobs visited in one queue: positions [start, end) of its index.
Span = tuple[_Queue, int, int]


def walk(session: Session, strict: bool) -> None:
    """Allocate's walk over the kept candidates (see the module); `applies` must hold."""
    kept = session.kept_order
    assert kept is not None
    queues = [_Queue(name, index) for name, index in kept.by_queue.items()]
    # The shapes of every candidate, as the general walk starts with (a shape whose jobs are
    # all bound stays in it, so the switch to candidate order comes exactly when it does).
    untried: set[Hashable] = set()
    for q in queues:
        untried.update(q.index.shape_keys)
    failed: dict[Hashable, JobStatus] = {}
    track = not session.policy.allocate_last  # later actions read the blocked list
    # With one queue the blocked list is the candidates less those bound (built at the end);
    # with several, the visits are kept as they happen (a job that failed, or the spans of
    # queues passed together), and merged only if a later action reads the list.
    visits = track and len(queues) > 1
    visited: list[PendingJob | list[Span]] = []  # in the general walk's order
    bound: list[Key] = []
    shares = _Shares(session, queues)
    levels = shares.levels()
    while levels:
        if not untried and not strict:
            break
        share = levels[0][0]
        group: list[_Queue] = []
        while levels and levels[0][0] == share:
            group.append(heapq.heappop(levels)[2])
        while True:
            tries = [(t, q) for q in group if (t := q.next_try(untried)) is not None]
            if not tries:  # every job left in these queues fails: visited in key order
                if visits:
                    visited.append([q.rest() for q in group])
                else:
                    for q in group:
                        q.at = len(q.index.keys)
                break
            (key, shape), q = min(tries, key=_first_key)
            if visits:
                visited.append([other.to(key) for other in group])
            else:
                for other in group:
                    other.skip_to(key)
            pj = q.index.jobs[q.at]
            q.at += 1
            placed, _ = place_beside(session, pj)  # no reservation: never limited by one
            if not isinstance(placed, str):
                session.bind(pj, placed)
                bound.append(key)
                shares.changed(q)
                levels = shares.levels()
                break
            untried.discard(shape)
            if strict:
                session.set_status_cached(pj.id, StatusCode.WAIT_RESOURCES, placed)
                _stop(session, queues, pj)
                return
            failed[shape] = session.shared_status(StatusCode.WAIT_RESOURCES, placed)
            if visits:
                visited.append(pj)
            if not untried:
                break
    session.statuses.wait_by_shape(failed)
    if not track:
        return
    if len(queues) == 1:  # visit order is candidate order: say so, with the shapes
        positions = [bisect_left(kept.keys, key) for key in bound]
        session.blocked.extend(_without(kept.jobs, positions))
        session.blocked_shapes = _without(kept.shapes, positions)
        session.blocked_in_order = True
        return
    visited.append([q.rest() for q in queues if q.left])

    def rest(blocked: list[PendingJob]) -> None:
        for visit in visited:
            if isinstance(visit, list):
                _extend_merged(blocked, visit)
            else:
                blocked.append(visit)

    session.block_later(rest)


def _stop(session: Session, queues: list[_Queue], pj: PendingJob) -> None:
    """Strict order: `pj` did not fit, so every job not yet bound waits behind it; the blocked
    list is it, then the rest in candidate order (the general walk's `_defer_rest`)."""
    session.statuses.wait_all(BEHIND)
    if not session.policy.allocate_last:
        session.blocked.append(pj)
        _extend_merged(session.blocked, [q.rest() for q in queues if q.left])


class _Shares:
    """The queues' fair-share keys, each computed again only when a bind changed the usage
    of a queue on its path (a bind in one queue leaves every unrelated queue's key as it was)."""

    __slots__ = ("session", "queues", "keys")

    def __init__(self, session: Session, queues: list[_Queue]) -> None:
        self.session = session
        self.queues = queues
        self.keys: dict[str, tuple[float, ...]] = {}

    def changed(self, bound: _Queue) -> None:
        """A job of `bound` was placed: the shares along its path moved."""
        path = self.session.queue_path(bound.name)
        stale = [
            name for name in self.keys if any(q in path for q in self.session.queue_path(name))
        ]
        for name in stale:
            del self.keys[name]

    def levels(self) -> list[tuple[tuple[float, ...], Key, _Queue]]:
        """The queues with jobs left, as a heap by (fair-share key, key of the next job)."""
        keys = self.keys
        levels = []
        for q in self.queues:
            if q.left:
                share = keys.get(q.name)
                if share is None:
                    share = keys[q.name] = fair_key(self.session, q.index.jobs[q.at].job)
                levels.append((share, q.head(), q))
        heapq.heapify(levels)
        return levels


def _first_key(entry: tuple[tuple[Key, Hashable], _Queue]) -> Key:
    return entry[0][0]


def _extend_merged(out: list[PendingJob], spans: list[Span]) -> None:
    """Add to `out` the jobs of several queues' spans in key order (keys are unique): most
    often one span has jobs, and its slice is taken whole."""
    nonempty = [span for span in spans if span[1] < span[2]]
    if len(nonempty) == 1:
        q, start, end = nonempty[0]
        out.extend(q.index.jobs[start:end])
    elif nonempty:
        keyed = chain.from_iterable(
            zip(q.index.keys[start:end], q.index.jobs[start:end], strict=True)
            for q, start, end in nonempty
        )
        out.extend(map(_second, sorted(keyed, key=_first)))  # runs: Timsort merges them


def _without(items: list[T], positions: list[int]) -> list[T]:
    """`items` less the ones at `positions` (ascending), in order, by slices."""
    if not positions:
        return list(items)
    out: list[T] = []
    start = 0
    for p in positions:
        out.extend(items[start:p])
        start = p + 1
    out.extend(items[start:])
    return out

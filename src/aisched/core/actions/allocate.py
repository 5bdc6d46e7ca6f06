"""allocate: place whole gangs in scheduling order, queues and users interleaved fairly.

The next job comes from the queue (and, with drf, the user) with the lowest weighted dominant
share, so placements are shared out as they happen rather than by a share fixed at cycle start.
With backfill configured, or `strict: true` (strict order), allocation stops at the first job
that does not fit; the rest go to the later actions in order, so the blocked job's reservation
can be honoured (or, without backfill, simply wait behind it).

Jobs promoted by enqueue for starving come first, before any interleaving. Without backfill,
the first `reservations` promoted jobs that do not fit (oldest first) get a reservation here,
and every later job in the cycle leaves the reserved resources free unless its runtime bound
(upper estimate first) ends before the reservation starts (`place_beside`): greedy for everyone
else, but a starving gang's start is not pushed back. One at a time, as in EASY backfill, is
enough for that: when the first starts, the next holds the reservation; more would hold idle
capacity for gangs further back, and each reservation is a search over the running jobs' ends
every cycle.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

from aisched.core.actions import shape_walk
from aisched.core.placement import known_failure, placement_shape
from aisched.core.queues import as_taken, fair_key, queue_blocks, queue_takes
from aisched.core.reservation import HELD, place_beside, reserve_for
from aisched.core.snapshot import PendingJob
from aisched.core.status import JobStatus, StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session

Bucket = tuple[str, str]  # (queue, user's account when drf interleaves users, else "")


@dataclass(frozen=True, slots=True)
class Allocate:
    reservations: int = 1
    # Stop at the first job that does not fit, even without backfill (Tiresias' and Helios'
    # FIFO: `fifo-strict`); the default goes on to later jobs that fit (fit-first).
    strict: bool = False
    name: str = "allocate"

    def __post_init__(self) -> None:
        if self.reservations < 0:
            raise ValueError(f"reservations must be 0 or more, got {self.reservations}")

    def execute(self, session: Session) -> None:
        strict = session.policy.strict_order
        head = session.candidates[: session.promoted]
        held = 0
        for i, pj in enumerate(head):
            tried = self._place_promoted(session, pj)
            if tried is None:
                continue
            if strict:
                self._defer(session, session.candidates[i + 1 :])
                return
            # Without backfill, allocate holds the reservation itself, and every job after
            # this one keeps off its nodes unless it ends (upper estimate) before it starts.
            if held < self.reservations and reserve_for(session, tried):
                held += 1
        if shape_walk.applies(session):  # ungoverned queues: work grows with the binds
            shape_walk.walk(session, strict)
            return
        buckets: dict[Bucket, deque[tuple[int, PendingJob]]] = {}
        per_user = session.policy.fair_users
        for pos, pj in enumerate(session.candidates[session.promoted :], session.promoted):
            job = pj.job
            key = (job.queue, job.account if per_user else "")
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = deque()
            bucket.append((pos, pj))
        # Heap of (fair-share key, position of the bucket's next job, bucket). Shares change
        # only when a placement changes usage on a bucket's path; then the heap is rebuilt.
        heap = [
            (fair_key(session, items[0][1].job), items[0][0], b) for b, items in buckets.items()
        ]
        heapq.heapify(heap)
        # Shapes not yet known to fail. Capacity only shrinks in allocate, so once every
        # remaining shape has failed, every remaining job fails for its shape's reason.
        shapes = session.candidate_shapes
        if shapes is not None and not session.promoted:  # kept by enqueue across cycles
            untried = set(shapes)
        else:
            untried = {
                placement_shape(session, pj.job) for pj in session.candidates[session.promoted :]
            }
        guarded = bool(session.reservations)
        while heap:
            if not untried and not strict and not guarded:
                self._fail_rest(session, buckets)
                return
            share, _, key = heapq.heappop(heap)
            items = buckets[key]
            _, pj = items.popleft()
            if items:
                heapq.heappush(heap, (share, items[0][0], key))
            else:
                del buckets[key]
            taken = queue_takes(session, pj.job)
            if isinstance(taken, str):
                session.set_status_cached(pj.id, StatusCode.WAIT_QUEUE, taken)
                continue
            tried = as_taken(pj, taken)
            beside = False
            res = None if guarded else known_failure(session, taken)
            if res is None:
                placed, beside = place_beside(session, tried)
                if isinstance(placed, str):
                    res = placed
                else:
                    session.bind(pj, placed)
                    if len(heap) > 1:
                        heap = self._heap(session, buckets)
                    continue
            # A cut job's failure says nothing of its whole shape's: only its own is tried.
            untried.discard(placement_shape(session, taken))
            if beside:
                session.set_status_cached(pj.id, StatusCode.WAIT_RESERVATION, f"{res}{HELD}")
            else:
                session.set_status_cached(pj.id, StatusCode.WAIT_RESOURCES, res)
            session.blocked.append(pj)
            if strict:
                self._defer_rest(session, buckets)
                return

    @staticmethod
    def _place_promoted(session: Session, pj: PendingJob) -> PendingJob | None:
        """Try a job promoted for starving, before any fair-share interleaving; it keeps off
        the nodes of an older starving job's reservation like every later job. The job as
        its queue takes it when the cluster has no room for that (to reserve for), else
        None."""
        taken = queue_takes(session, pj.job)
        if isinstance(taken, str):
            session.set_status_cached(pj.id, StatusCode.WAIT_QUEUE, taken)
            return None  # its queue holds it, not the cluster: the rest may go on
        tried = as_taken(pj, taken)
        placed, beside = place_beside(session, tried)
        if isinstance(placed, str):
            if beside:
                session.set_status_cached(pj.id, StatusCode.WAIT_RESERVATION, f"{placed}{HELD}")
            else:
                session.set_status_cached(pj.id, StatusCode.WAIT_RESOURCES, placed)
            session.blocked.append(pj)
            return tried
        session.bind(pj, placed)
        return None

    @staticmethod
    def _defer(session: Session, rest: list[PendingJob]) -> None:
        for pj in rest:
            session.set_status_cached(pj.id, StatusCode.NOT_CONSIDERED, "behind a blocked job")
            session.blocked.append(pj)

    @staticmethod
    def _heap(
        session: Session, buckets: dict[Bucket, deque[tuple[int, PendingJob]]]
    ) -> list[tuple[tuple[float, ...], int, Bucket]]:
        heap = [(fair_key(session, its[0][1].job), its[0][0], b) for b, its in buckets.items()]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def _fail_rest(session: Session, buckets: dict[Bucket, deque[tuple[int, PendingJob]]]) -> None:
        if Allocate._fail_tail(session, buckets):
            return
        rest = sorted((item for items in buckets.values() for item in items), key=lambda x: x[0])
        ungoverned = session.queues.ungoverned
        statuses, blocked = session.statuses, session.blocked
        by_shape: dict[Hashable, JobStatus] = {}  # one status object per shape's reason
        for _, pj in rest:
            job = pj.job
            if job.queue not in ungoverned:
                reason = queue_blocks(session, job)
                if reason is not None:
                    session.set_status_cached(pj.id, StatusCode.WAIT_QUEUE, reason)
                    continue
            shape = placement_shape(session, job)
            status = by_shape.get(shape)
            if status is None:
                failed = known_failure(session, job)
                assert failed is not None
                status = by_shape[shape] = JobStatus(StatusCode.WAIT_RESOURCES, failed)
            statuses[pj.id] = status
            blocked.append(pj)

    @staticmethod
    def _fail_tail(session: Session, buckets: dict[Bucket, deque[tuple[int, PendingJob]]]) -> bool:
        """`_fail_rest` in C-speed bulk operations when every bucket left is of a queue no
        limit governs and enqueue kept the candidates' shapes: each job left then fails for
        its shape's cached reason. False when the case does not apply."""
        shapes = session.candidate_shapes
        ungoverned = session.queues.ungoverned
        if shapes is None or any(queue not in ungoverned for queue, _ in buckets):
            return False
        # In candidate order across the buckets, as the job-by-job walk goes.
        items = sorted(chain.from_iterable(buckets.values()), key=_position)
        rest = list(map(_pending, items))
        rest_shapes = list(map(shapes.__getitem__, map(_position, items)))
        cache = session.fail_cache
        by_shape: dict[Hashable, JobStatus] = {}  # one status object per shape's reason
        for shape in set(rest_shapes):
            failed = cache.get((shape, None))
            assert failed is not None, "a shape left untried"
            by_shape[shape] = JobStatus(StatusCode.WAIT_RESOURCES, failed)
        session.statuses.update(
            zip(map(_job_id, rest), map(by_shape.__getitem__, rest_shapes), strict=True)
        )
        session.blocked.extend(rest)
        return True

    @staticmethod
    def _defer_rest(session: Session, buckets: dict[Bucket, deque[tuple[int, PendingJob]]]) -> None:
        rest = sorted((item for items in buckets.values() for item in items), key=lambda x: x[0])
        for _, pj in rest:
            session.set_status_cached(pj.id, StatusCode.NOT_CONSIDERED, "behind a blocked job")
            session.blocked.append(pj)


_job_id = attrgetter("id")
_position = itemgetter(0)
_pending = itemgetter(1)

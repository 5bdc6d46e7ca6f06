"""allocate's common case done in work proportional to what it places, not to the queue.

The case: one queue, governed by no limit, no fair-share interleaving of users, nothing
promoted for starving and no reservation held, with the candidates' shapes kept by enqueue
(`core.admitted`). Allocate then takes the candidates strictly in order, and within a cycle
capacity only shrinks, so a job whose shape has failed fails again for the same reason. So:

1. Only the first job of each shape not yet failed is tried: a heap of each such shape's
   next position says which (`list.index` finds the next one after a bind, in C).
2. Every other job fails for its shape's cached reason. Statuses are written at the end in
   one bulk update, in candidate order, exactly as a job-by-job walk writes them; the blocked
   list is the candidates less the bound ones, in order.
3. Strict order (`fifo-strict`): binds in order up to the first job that does not fit; the rest
   wait behind it.

The decisions, statuses and blocked list are those of `Allocate.execute`'s general walk,
whose rules this module must follow (tests/unit/core compare the two on the same inputs).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from contextlib import suppress
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from aisched.core.reservation import place_beside
from aisched.core.status import JobStatus, StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session

BEHIND = "behind a blocked job"
T = TypeVar("T")
_job_id = attrgetter("id")


def applies(session: Session) -> bool:
    """Whether `allocate_in_order` gives what the general walk would, this cycle."""
    return (
        session.candidate_shapes is not None
        and session.candidate_queue in session.queues.ungoverned
        and not session.promoted
        and not session.reservations
        and not session.policy.fair_users
    )


def allocate_in_order(session: Session, strict: bool) -> None:
    """Place the candidates in order (see the module's description); `applies` must hold."""
    shapes = session.candidate_shapes
    assert shapes is not None
    if strict:
        _strict(session)
        return
    cands = session.candidates
    n = len(cands)
    # Each shape's first position: written from the back, so the front one stays.
    first = dict(zip(reversed(shapes), range(n - 1, -1, -1), strict=True))
    heap = [(p, s) for s, p in first.items()]
    heapq.heapify(heap)
    failed: dict[Hashable, JobStatus] = {}
    own: dict[int, JobStatus] = {}  # statuses of the jobs tried, by position
    bound: list[int] = []
    while heap:
        p, shape = heapq.heappop(heap)
        pj = cands[p]
        placed, _ = place_beside(session, pj)  # no reservation: never limited by one
        if isinstance(placed, str):
            failed[shape] = JobStatus(StatusCode.WAIT_RESOURCES, placed)
            continue
        session.bind(pj, placed)
        own[p] = session.statuses.pop(pj.id)  # re-written below, in candidate order
        bound.append(p)
        with suppress(ValueError):  # raised when no job of this shape is left
            heapq.heappush(heap, (shapes.index(shape, p + 1), shape))
    sts = list(map(failed.get, shapes))
    for p, status in own.items():
        sts[p] = status
    session.statuses.update(zip(map(_job_id, cands), sts, strict=True))  # type: ignore[arg-type]
    if not session.blocked:
        session.blocked.extend(_without(cands, bound))
        session.blocked_shapes = _without(shapes, bound)
        session.blocked_in_order = True
    else:
        session.blocked.extend(_without(cands, bound))


def _strict(session: Session) -> None:
    cands = session.candidates
    for p, pj in enumerate(cands):
        placed, _ = place_beside(session, pj)
        if isinstance(placed, str):
            session.set_status_cached(pj.id, StatusCode.WAIT_RESOURCES, placed)
            session.blocked.append(pj)
            rest = cands[p + 1 :]
            behind = JobStatus(StatusCode.NOT_CONSIDERED, BEHIND)
            session.statuses.update(zip(map(_job_id, rest), repeat(behind)))
            session.blocked.extend(rest)
            return
        session.bind(pj, placed)


def _without(jobs: list[T], positions: list[int]) -> list[T]:
    """`jobs` less the ones at `positions` (ascending), in order, by slices."""
    if not positions:
        return jobs
    out: list[T] = []
    start = 0
    for p in positions:
        out.extend(jobs[start:p])
        start = p + 1
    out.extend(jobs[start:])
    return out

"""Reservations: the earliest time and the nodes at which a blocked job can start.

Running jobs are assumed to end at their expected end (None: never, as far as we know). The
job fits after the first k of them, in end order, have ended; k is found by bisection, since
room only grows as jobs end. The reservation holds the nodes of that placement from the k-th
end time. Nodes already held by an earlier reservation are left out, so reservations never
overlap. All work happens on a scratch copy of the free state; the session is left unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aisched.core.placement import place_job
from aisched.core.session import Reservation
from aisched.core.snapshot import BoolArray, PendingJob, RunningJob
from aisched.core.statement import Statement
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session

NEVER = float("inf")


def _end(r: RunningJob) -> float:
    return NEVER if r.expected_end_s is None else r.expected_end_s


def find_reservation(session: Session, job: Job) -> Reservation | None:
    arrays = session.arrays
    taken: BoolArray = np.zeros(arrays.num_nodes, dtype=np.bool_)
    for res in session.reservations:
        taken |= res.nodes
    allowed = ~taken
    releases = sorted(session.running.values(), key=lambda r: (_end(r), r.started_s, r.id))
    base = session.free

    def fits(k: int) -> tuple[str, ...] | None:
        """Nodes of a placement once the first k releases have happened, or None."""
        scratch = base.copy()
        for r in releases[:k]:
            for t in r.tasks:
                scratch.give(arrays.index[t.node], t)
        with session.scratch(scratch):
            st = Statement(session)
            placed = place_job(session, st, job, allowed, mask_key=("reserve", k))
            st.discard()
        return None if isinstance(placed, str) else tuple(t.node for t in placed)

    lo, hi = 0, len(releases)
    nodes = fits(hi)  # always the placement for `hi`, the smallest k known to fit
    if nodes is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        found = fits(mid)
        if found is not None:
            hi, nodes = mid, found
        else:
            lo = mid + 1
    start: float | None = session.now if lo == 0 else _end(releases[lo - 1])
    if start is not None and start == NEVER:
        start = None
    if start is not None:
        start = max(start, session.now)
    mask: BoolArray = np.zeros(arrays.num_nodes, dtype=np.bool_)
    mask[[arrays.index[n] for n in nodes]] = True
    return Reservation(job.id, mask, start)


def allowed_nodes(session: Session, pj: PendingJob) -> tuple[BoolArray | None, tuple[str, ...]]:
    """Nodes `pj` may use without delaying a reservation: all but those of reservations it would
    run into, i.e. whose start comes before its runtime bound (upper estimate first) ends; a job
    with no bound runs into every reservation. Also the ids of those reservations (a cache key)."""
    bound = pj.runtime_bound_s
    end = None if bound is None else session.now + bound
    blocked_by = [
        r for r in session.reservations if r.start_s is None or end is None or end > r.start_s
    ]
    if not blocked_by:
        return None, ()
    taken = np.zeros(session.arrays.num_nodes, dtype=np.bool_)
    for r in blocked_by:
        taken |= r.nodes
    return ~taken, tuple(r.job_id for r in blocked_by)


def reserve_for(session: Session, pj: PendingJob) -> bool:
    """Give `pj` a reservation and the RESERVED status with its start as ETA; False when no
    placement is possible even once every running job with an expected end has ended."""
    from aisched.core.status import StatusCode

    r = find_reservation(session, pj.job)
    if r is None:
        return False
    session.reserve(r)
    when = "once running jobs end" if r.start_s is None else f"from t={r.start_s:g}s"
    session.set_status(pj.id, StatusCode.RESERVED, f"nodes reserved {when}", r.start_s)
    return True

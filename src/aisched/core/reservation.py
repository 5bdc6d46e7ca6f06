"""Reservations: the earliest time and the nodes at which a blocked job can start.

Running jobs are assumed to end at their expected end (None: never, as far as we know). The
job fits after the first k of them, in end order, have ended, and room only grows as jobs end,
so k is found by search:
1. A lower bound from GPU counts alone, for every k at once (numpy over releases × nodes): no
   placement exists before enough GPUs are free, in all and per node for the smallest task.
2. Galloping up from that bound (1, 2, 4, ... releases more) to the first k that really fits,
   then bisection below it. The bound is usually exact, so one placement attempt is the
   common case rather than a bisection over every running job.
The reservation holds the nodes of that placement from the k-th end time. Nodes already held by
an earlier reservation are left out, so reservations never overlap. All work happens on a
scratch copy of the free state; the session is left unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aisched.core.placement import place_job
from aisched.core.session import Reservation
from aisched.core.snapshot import BoolArray, FreeState, PendingJob, RunningJob
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
    # The free state after the first `done` releases; probes mostly move forwards, so it is
    # advanced in place and rebuilt only when a probe goes back.
    done, state = 0, base.copy()

    def after(k: int) -> FreeState:
        nonlocal done, state
        if k < done:
            done, state = 0, base.copy()
        for r in releases[done:k]:
            for t in r.tasks:
                state.give(arrays.index[t.node], t)
        done = k
        return state

    def fits(k: int) -> tuple[str, ...] | None:
        """Nodes of a placement once the first k releases have happened, or None."""
        with session.scratch(after(k)):
            st = Statement(session)
            placed = place_job(session, st, job, allowed, mask_key=("reserve", k))
            st.discard()
        return None if isinstance(placed, str) else tuple(t.node for t in placed)

    n = len(releases)
    lo = _fewest_releases(session, job, releases, allowed)
    if lo is None:
        return None
    # Gallop up from the bound to a k that fits; `lo` stays the smallest k not known to fail.
    step, hi = 1, lo
    nodes = fits(hi)
    while nodes is None:
        if hi == n:
            return None
        lo = hi + 1
        hi = min(hi + step, n)
        step *= 2
        nodes = fits(hi)
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


def _fewest_releases(
    session: Session, job: Job, releases: list[RunningJob], allowed: BoolArray
) -> int | None:
    """A lower bound on how many releases (in order) must happen before `job` can fit: enough
    free GPU in all, and enough nodes with room for its smallest task, on allowed nodes. None
    when even all of them are not enough. Counts GPUs only, so it may be low, never high."""
    groups = job.groups
    per_task = min(g.request.gpu_equivalent_milli for g in groups)
    if per_task == 0:
        return 0
    need_tasks = job.gang_min
    need_total = (
        job.total_request.gpu_equivalent_milli
        if job.min_available is None
        else per_task * need_tasks
    )
    arrays = session.arrays
    gained = np.zeros((len(releases) + 1, arrays.num_nodes), dtype=np.int64)
    index = arrays.index
    for i, r in enumerate(releases, 1):
        row = gained[i]
        for t in r.tasks:
            row[index[t.node]] += t.gpu_milli * len(t.gpus)
    free_after = np.cumsum(gained, axis=0)
    free_after += session.free.gpu_total
    free_after[:, ~allowed] = 0
    ok = (free_after.sum(axis=1) >= need_total) & (
        (free_after // per_task).sum(axis=1) >= need_tasks
    )
    first = np.flatnonzero(ok)
    return int(first[0]) if first.size else None


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
    if len(blocked_by) == 1:  # the common case, asked for every later job: one shared mask
        r = blocked_by[0]
        if r.outside is None:
            r.outside = ~r.nodes
        return r.outside, (r.job_id,)
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

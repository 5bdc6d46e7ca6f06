"""Reservations: the earliest time and the nodes at which a blocked job can start.

Running jobs are assumed to end at their expected end (None: never, as far as we know). A
service's replica is not waited for at all: it serves until its service scales down or is
cancelled, whatever its estimate says, so a job that fits only once a replica has gone gets no
reservation (it would hold its resources from every other job for ever) and waits as any job
that does not fit. The job fits after the first k of them, in end order, have ended, and room
only grows as jobs end, so k is found by search:
1. A lower bound from GPU counts alone, for every k at once (numpy over releases × nodes): no
   placement exists before enough GPUs are free, in all and per node for the smallest task.
2. Galloping up from that bound (1, 2, 4, ... releases more) to the first k that really fits,
   then bisection below it. The bound is usually exact, so one placement attempt is the
   common case rather than a bisection over every running job.
The reservation holds the resources of that placement (its GPUs, and the CPU and memory that go
with them) on its nodes from the k-th end time, not the whole nodes: a later job that would still
run at that start may use what the placement leaves over (`place_beside`: the least of what is
free now and of each reservation's headroom), as in Slurm's backfill. Nodes already held by an
earlier reservation are left out of the search, so reservations never overlap. The search works
on a scratch copy of the free state; the session is left unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aisched.core.decisions import TaskBinding
from aisched.core.placement import place_job
from aisched.core.session import Guard, Reservation
from aisched.core.snapshot import BoolArray, FreeState, PendingJob, RunningJob
from aisched.core.statement import Statement
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE

if TYPE_CHECKING:
    from aisched.core.session import Session

NEVER = float("inf")
# Appended to the reason of a job that did not fit beside the reservations it would run into.
HELD = "; the rest is reserved"


def _end(r: RunningJob) -> float:
    return NEVER if r.expected_end_s is None else r.expected_end_s


def find_reservation(session: Session, job: Job) -> Reservation | None:
    arrays = session.arrays
    taken: BoolArray = np.zeros(arrays.num_nodes, dtype=np.bool_)
    for res in session.reservations:
        taken |= res.nodes
    allowed = ~taken
    releases = sorted(
        (r for r in session.running.values() if not r.job.serves_until_scaled_down),
        key=lambda r: (_end(r), r.started_s, r.id),
    )
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

    def fits(k: int) -> tuple[TaskBinding, ...] | None:
        """A placement once the first k releases have happened, or None."""
        with session.scratch(after(k)):
            st = Statement(session)
            placed = place_job(session, st, job, allowed, mask_key=("reserve", k))
            st.discard()
        return None if isinstance(placed, str) else placed

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
    headroom = after(lo).copy()
    headroom.take_all(arrays.index, nodes)
    mask: BoolArray = np.zeros(arrays.num_nodes, dtype=np.bool_)
    mask[[arrays.index[t.node] for t in nodes]] = True
    return Reservation(job.id, mask, start, nodes, headroom)


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


def runs_into(session: Session, pj: PendingJob) -> list[Reservation]:
    """The reservations `pj` would still be running at: those whose start comes before its
    runtime bound (upper estimate first) ends; a job with no bound runs into every one."""
    bound = pj.runtime_bound_s
    end = None if bound is None else session.now + bound
    return [r for r in session.reservations if r.start_s is None or end is None or end > r.start_s]


def place_beside(session: Session, pj: PendingJob) -> tuple[tuple[TaskBinding, ...] | str, bool]:
    """Place `pj` now without delaying any reservation, and commit it to the session's free
    state (the caller records the bind). Also whether reservations limited it.

    1. A job that ends before every reservation starts may use all that is free.
    2. Otherwise it sees, per node and GPU, the least of what is free now and what each
       reservation it runs into leaves over at its start (the guard, shared by the jobs that run
       into the same reservations, with its own failure cache kept until capacity is given
       back).
    3. A placement found there is taken from the session's free state and from the headroom of
       each of those reservations, since it will still hold them at their start."""
    blocked_by = runs_into(session, pj)
    if not blocked_by:
        st = Statement(session)
        placed = place_job(session, st, pj.job)
        if isinstance(placed, str):
            st.discard()
        else:
            st.commit()
        return placed, False
    key = tuple(r.job_id for r in blocked_by)
    guard = session.guards.get(key)
    if guard is None:
        guard = session.guards[key] = Guard(_guarded_free(session.free, blocked_by), {})
    elif guard.stale:
        guard.free, guard.stale = _guarded_free(session.free, blocked_by), False
    saved = session.free, session.fail_cache
    session.free, session.fail_cache = guard.free, guard.fail_cache
    try:
        st = Statement(session)
        placed = place_job(session, st, pj.job)
        if isinstance(placed, str):
            st.discard()
        else:
            st.commit()  # the guard's free state now has the placement taken
    finally:
        session.free, session.fail_cache = saved
    if isinstance(placed, str):
        return placed, True
    st = Statement(session)
    st.take_all(placed)
    for r in blocked_by:
        assert r.headroom is not None
        r.headroom.take_all(session.arrays.index, placed)
    st.commit()
    return placed, True


def _guarded_free(free: FreeState, blocked_by: list[Reservation]) -> FreeState:
    g = free.copy()
    for r in blocked_by:
        h = r.headroom
        if h is None:
            continue
        np.minimum(g.cpu, h.cpu, out=g.cpu)
        np.minimum(g.mem, h.mem, out=g.mem)
        np.minimum(g.gpu_milli, h.gpu_milli, out=g.gpu_milli)
        np.minimum(g.gpu_mem, h.gpu_mem, out=g.gpu_mem)
        np.minimum(g.rdma, h.rdma, out=g.rdma)
    for a in (g.cpu, g.mem, g.gpu_milli, g.gpu_mem, g.rdma):
        np.maximum(a, 0, out=a)
    g.whole = (g.gpu_milli == GPU_MILLI_WHOLE).sum(axis=1).astype(np.int64)
    g.gpu_total = g.gpu_milli.sum(axis=1)
    return g


def allowed_nodes(session: Session, pj: PendingJob) -> tuple[BoolArray | None, tuple[str, ...]]:
    """Nodes `pj` may use without delaying a reservation: all but those of reservations it would
    run into (`runs_into`). Also the ids of those reservations (a cache key). Preemption uses
    it: a job kept waiting beside a reservation makes room off its nodes only."""
    blocked_by = runs_into(session, pj)
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
    """Give `pj` a reservation and the RESERVED status with its start as ETA (structured, never
    formatted into the reason); False when no placement is possible even once every running job
    but the services' replicas has ended."""
    from aisched.core.status import StatusCode

    r = find_reservation(session, pj.job)
    if r is None:
        return False
    session.reserve(r)
    # The start goes out as a number (the status's ETA), on the caller's clock: the service and
    # the CLI say it as the wall clock does, the simulator in virtual seconds. The reason only
    # says whether one is known.
    # A start at or before now (the work it waits on has run past its expected end) would say
    # "now" at every cycle: no estimate, as the `eta` action gives none there either.
    eta = r.start_s if r.start_s is not None and r.start_s > session.now else None
    reason = "nodes reserved" if eta is not None else "nodes reserved once running jobs end"
    session.set_status(pj.id, StatusCode.RESERVED, reason, eta)
    return True

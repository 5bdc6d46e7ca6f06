"""What-if eviction: would stopping these running jobs make room for a pending one?

Simulate on the session, then undo (Kueue's preemption: simulate, then issue). Victims are
tried as a prefix of their preference order; the shortest prefix that makes room is found by
galloping then bisection (room only grows as more is evicted), and then only victims with a
task on a node the placement uses are kept, so no job is stopped that did not need to be.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from aisched.core.decisions import TaskBinding
from aisched.core.placement import place_job
from aisched.core.snapshot import BoolArray, RunningJob
from aisched.core.statement import Statement
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session


def evict(session: Session, st: Statement, victim: RunningJob) -> None:
    """Remove `victim` from the session through `st` (undone by discard)."""
    arrays = session.arrays
    for t in victim.tasks:
        st.give(arrays.index[t.node], t)
    vec = victim.usage
    session.add_usage(victim.job, vec, -1.0)
    del session.running[victim.id]

    def undo() -> None:
        session.running[victim.id] = victim
        session.add_usage(victim.job, vec, 1.0)

    st.on_discard(undo)


def _fits_after(
    session: Session,
    job: Job,
    victims: Sequence[RunningJob],
    allowed: BoolArray | None,
    mask_key: Hashable,
) -> bool:
    st = Statement(session)
    for v in victims:
        evict(session, st, v)
    placed = place_job(session, st, job, allowed, ("evict", len(victims), mask_key))
    ok = not isinstance(placed, str)
    st.discard()
    return ok


def find_victims(
    session: Session,
    job: Job,
    candidates: Sequence[RunningJob],
    allowed: BoolArray | None = None,
    mask_key: Hashable = None,
) -> tuple[list[RunningJob], tuple[TaskBinding, ...]] | None:
    """The victims to stop and the placement they make room for, applied to the session
    through a committed statement; None (and nothing changed) when no prefix makes room.
    `allowed` limits the nodes the placement may use (`mask_key` names that limit)."""
    if not candidates:
        return None
    # Gallop (1, 2, 4, ...) then bisect: few victims are usually enough, and evicting all of
    # them to test the largest prefix first would cost O(running) every time.
    n = len(candidates)
    lo, hi = 1, 1
    while not _fits_after(session, job, candidates[:hi], allowed, mask_key):
        if hi == n:
            return None
        lo, hi = hi + 1, min(hi * 2, n)
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits_after(session, job, candidates[:mid], allowed, mask_key):
            hi = mid
        else:
            lo = mid + 1
    prefix = list(candidates[:lo])
    st = Statement(session)
    for v in prefix:
        evict(session, st, v)
    res = place_job(session, st, job, allowed, ("evict-final", lo, mask_key))
    st.discard()
    if isinstance(res, str):  # cannot happen after fits(lo); keep the session clean anyway
        return None
    used = {t.node for t in res}
    needed = [v for v in prefix if any(t.node in used for t in v.tasks)]
    st = Statement(session)
    for v in needed:
        evict(session, st, v)
    final = place_job(session, st, job, allowed, ("evict-needed", len(needed), mask_key))
    if isinstance(final, str):
        st.discard()
        needed = prefix
        st = Statement(session)
        for v in needed:
            evict(session, st, v)
        final = place_job(session, st, job, allowed, ("evict-final", lo, mask_key))
        if isinstance(final, str):
            st.discard()
            return None
    st.commit()
    return needed, final

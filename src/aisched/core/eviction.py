"""What-if eviction: would stopping these running jobs (or shrinking these elastic ones) make
room for a pending one?

Simulate on the session, then undo (Kueue's preemption: simulate, then issue). What may be
taken is a list of cuts in preference order: a cut is either a whole running job (evict it) or
one surplus task of a running elastic job (shrink it by that task). Cuts are tried as a prefix
of that order; the shortest prefix that makes room is found by galloping then bisection (room
only grows as more is taken; a prefix that the bound on room, `placement.may_fit` once all of
it is taken, rules out is not tried), and then only cuts with a task on a node the placement
uses are kept, and of the whole jobs among those, each one the job still fits without (tried
last taken first) is spared, so no job is stopped or shrunk that did not need to be. A job
whose whole cut is kept is evicted even if some of its task cuts are kept too; the rest of the
jobs are shrunk.

Invariants: a what-if leaves the session exactly as it found it; a shrunk job keeps at least
its `min_available` tasks (the caller offers only surplus tasks as cuts).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from aisched.core.decisions import TaskBinding
from aisched.core.placement import may_fit, place_job, sample_size
from aisched.core.snapshot import BoolArray, RunningJob
from aisched.core.statement import Statement
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session


class Cut(NamedTuple):
    """Capacity a what-if may take: all of `job` (`task` None), or that one task of it. A
    named tuple: the walk makes one per candidate it reads, and a tuple is made cheaply."""

    job: RunningJob
    task: TaskBinding | None = None


@dataclass(frozen=True, slots=True)
class Room:
    """What a successful search takes: jobs to evict, and jobs to shrink with the tasks they
    keep (in the order they were first cut), and the placement that fits once they are gone."""

    evicted: tuple[RunningJob, ...]
    shrunk: tuple[tuple[RunningJob, tuple[TaskBinding, ...]], ...]
    tasks: tuple[TaskBinding, ...]


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


def shrink(session: Session, st: Statement, job: RunningJob, keep: tuple[TaskBinding, ...]) -> None:
    """Let `job` go on with only `keep` of its tasks, through `st` (undone by discard). The
    smaller job is marked terminating: it is being restarted, so nothing takes more of it."""
    arrays = session.arrays
    kept = set(keep)
    for t in job.tasks:
        if t not in kept:
            st.give(arrays.index[t.node], t)
    smaller = replace(job, tasks=keep, terminating=True)
    session.add_usage(job.job, job.usage, -1.0)
    session.add_usage(job.job, smaller.usage, 1.0)
    session.running[job.id] = smaller

    def undo() -> None:
        session.running[job.id] = job
        session.add_usage(job.job, smaller.usage, -1.0)
        session.add_usage(job.job, job.usage, 1.0)

    st.on_discard(undo)


def _plan(
    cuts: Sequence[Cut],
) -> tuple[list[RunningJob], list[tuple[RunningJob, tuple[TaskBinding, ...]]]]:
    """Group cuts per job: the jobs to evict and the (job, kept tasks) to shrink."""
    whole: dict[str, RunningJob] = {}
    taken: dict[str, tuple[RunningJob, set[TaskBinding]]] = {}
    for c in cuts:
        if c.task is None:
            whole[c.job.id] = c.job
        else:
            taken.setdefault(c.job.id, (c.job, set()))[1].add(c.task)
    shrunk = [
        (job, tuple(t for t in job.tasks if t not in gone))
        for job_id, (job, gone) in taken.items()
        if job_id not in whole
    ]
    return list(whole.values()), shrunk


def _take(session: Session, st: Statement, cuts: Sequence[Cut]) -> None:
    evicted, shrunk = _plan(cuts)
    for v in evicted:
        evict(session, st, v)
    for job, keep in shrunk:
        shrink(session, st, job, keep)


def _placed_after(
    session: Session,
    job: Job,
    cuts: Sequence[Cut],
    allowed: BoolArray | None,
    mask_key: Hashable,
) -> tuple[TaskBinding, ...] | None:
    """Where `job` would go once `cuts` are taken, or None when it would not fit; the session
    is left as it was."""
    st = Statement(session)
    _take(session, st, cuts)
    placed = place_job(session, st, job, allowed, ("evict", len(cuts), mask_key))
    st.discard()
    return None if isinstance(placed, str) else placed


def _placed_on_first(
    session: Session, job: Job, first: Cut, allowed: BoolArray | None, mask_key: Hashable
) -> Room | tuple[TaskBinding, ...] | None:
    """The search's first what-if, taking `first` alone. Kept, as a `Room` already applied,
    when it is the answer: the job fits once `first` is taken, on a node `first` frees, with
    every node scored (so placing again would give the same); that is what `find_room` would
    apply after undoing the what-if, without the undo and the redo. Otherwise undone: the
    placement found, or None when the job does not fit."""
    st = Statement(session)
    _take(session, st, [first])
    placed = place_job(session, st, job, allowed, ("evict", 1, mask_key))
    if isinstance(placed, str):
        st.discard()
        return None
    if sample_size(session) != 0 or not set(_cut_nodes(first)) & {t.node for t in placed}:
        st.discard()
        return placed
    st.commit()
    evicted, shrunk = _plan([first])
    return Room(tuple(evicted), tuple(shrunk), placed)


def _room_with_all(session: Session, job: Job, cuts: Sequence[Cut]) -> bool:
    """Whether `job` may fit once every cut is taken (`placement.may_fit`, an upper bound on
    its room): when not, no prefix makes room (room only grows as more is taken), known
    from one copy of the free state rather than a search that would take every cut twice."""
    evicted, shrunk = _plan(cuts)  # a job cut whole and task by task gives each task once
    tasks = [t for v in evicted for t in v.tasks]
    tasks += [t for r, keep in shrunk for t in r.tasks if t not in keep]
    free = session.free.given_back(session.arrays.index, tasks)
    return may_fit({}, session.arrays, free, job)


def _placed_if_room(
    session: Session,
    job: Job,
    cuts: Sequence[Cut],
    allowed: BoolArray | None,
    mask_key: Hashable,
    bounded: bool,
) -> tuple[TaskBinding, ...] | None:
    """`_placed_after`, known to be None without the what-if when `bounded` and the job may
    not fit once every one of `cuts` is taken (then only the failure caches are cleared, as
    the what-if's give-backs would have)."""
    if bounded and not _room_with_all(session, job, cuts):
        session.released()
        return None
    return _placed_after(session, job, cuts, allowed, mask_key)


def _cut_nodes(c: Cut) -> tuple[str, ...]:
    return tuple(t.node for t in c.job.tasks) if c.task is None else (c.task.node,)


def find_room(
    session: Session,
    job: Job,
    cuts: Sequence[Cut],
    allowed: BoolArray | None = None,
    mask_key: Hashable = None,
) -> Room | None:
    """What to evict and shrink, and the placement it makes room for, applied to the session
    through a committed statement; None (and nothing changed) when no prefix of `cuts` makes
    room. `allowed` limits the nodes the placement may use (`mask_key` names that limit)."""
    if not cuts:
        return None
    # Gallop (1, 2, 4, ...) then bisect: few cuts are usually enough, and taking all of them
    # to test the largest prefix first would cost O(running) every time.
    n = len(cuts)
    lo, hi = 1, 1
    first = _placed_on_first(session, job, cuts[0], allowed, mask_key)
    if isinstance(first, Room):  # the usual case: one victim makes room
        return first
    if first is None and n > 1 and not _room_with_all(session, job, cuts):
        session.released()  # as the what-ifs this stands for would have, each giving back
        return None
    # Every node scored: a what-if the bound rules out fails, so it need not be made (with a
    # sample, each placement moves where the next sample starts, so every one is made).
    bounded = sample_size(session) == 0
    found = first
    while found is None:
        if hi == n:
            return None
        lo, hi = hi + 1, min(hi * 2, n)
        found = _placed_if_room(session, job, cuts[:hi], allowed, mask_key, bounded)
    while lo < hi:
        mid = (lo + hi) // 2
        placed = _placed_if_room(session, job, cuts[:mid], allowed, mask_key, bounded)
        if placed is not None:
            hi, found = mid, placed
        else:
            lo = mid + 1
    prefix = list(cuts[:lo])
    # Where the job goes once the whole prefix is taken: `found`, when placement is a function
    # of the free state alone (every node scored); a sample depends on the order of earlier
    # placements, so then it is placed again, as the search always did.
    replays = sample_size(session) == 0
    res = found
    if not replays:
        st = Statement(session)
        _take(session, st, prefix)
        again = place_job(session, st, job, allowed, ("evict-final", lo, mask_key))
        st.discard()
        if isinstance(again, str):  # cannot happen after fits(lo); keep the session clean
            return None
        res = again
    used = {t.node for t in res}
    needed = [c for c in prefix if any(node in used for node in _cut_nodes(c))]
    needed = _without_spare_jobs(session, job, needed, prefix[-1], allowed, mask_key)
    st = Statement(session)
    if replays and len(needed) == len(prefix):
        final: tuple[TaskBinding, ...] | str = _apply(session, st, prefix, found)
    else:
        _take(session, st, needed)
        final = place_job(session, st, job, allowed, ("evict-needed", len(needed), mask_key))
    if isinstance(final, str):
        st.discard()
        needed = prefix
        st = Statement(session)
        if replays:
            final = _apply(session, st, prefix, found)
        else:
            _take(session, st, needed)
            final = place_job(session, st, job, allowed, ("evict-final", lo, mask_key))
            if isinstance(final, str):
                st.discard()
                return None
    st.commit()
    evicted, shrunk = _plan(needed)
    return Room(tuple(evicted), tuple(shrunk), final)


def _without_spare_jobs(
    session: Session,
    job: Job,
    needed: list[Cut],
    last: Cut,
    allowed: BoolArray | None,
    mask_key: Hashable,
) -> list[Cut]:
    """`needed` less the whole jobs whose eviction the blocked job does not need: each one in
    turn, the last taken first, is left out when the job still fits without it (a what-if).
    On one node the shortest prefix may hold a job that only came first in victim order (a
    1-GPU job before the 4-GPU one that alone makes room for 4 GPUs); the victim order still
    decides who is tried first, this only spares who was not needed. `last`, the prefix's
    last cut, is needed (the prefix without it made no room), and task cuts are kept: their
    search already takes the fewest tasks in order."""
    spare = [c for c in reversed(needed) if c.task is None and c is not last]
    if not spare:
        return needed
    kept = needed
    for c in spare:
        without = [k for k in kept if k is not c]
        if _placed_after(session, job, without, allowed, mask_key) is not None:
            kept = without
    return kept


def _apply(
    session: Session, st: Statement, cuts: Sequence[Cut], tasks: tuple[TaskBinding, ...]
) -> tuple[TaskBinding, ...]:
    """Take `cuts` and bind `tasks`, the placement found for that very state, through `st`:
    what placing again would do, without the search."""
    _take(session, st, cuts)
    st.take_all(tasks)
    return tasks


def find_victims(
    session: Session,
    job: Job,
    candidates: Sequence[RunningJob],
    allowed: BoolArray | None = None,
    mask_key: Hashable = None,
) -> tuple[list[RunningJob], tuple[TaskBinding, ...]] | None:
    """`find_room` with whole jobs only: the victims to stop and the placement."""
    room = find_room(session, job, [Cut(r) for r in candidates], allowed, mask_key)
    if room is None:
        return None
    return list(room.evicted), room.tasks

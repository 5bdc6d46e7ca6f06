"""Queue arithmetic for one cycle: limits, guarantees, borrowing and fair-share keys.

A queue's `limit` (and `user_limit`) caps the resources it names (`Queue.limit_caps`), a 0
among them included: `{gpus: 0}` lets the queue use no GPU. A resource it does not name is not
governed there, so a queue can cap GPUs without also naming CPUs and memory. A zero in a
`guarantee` guarantees nothing, so with `borrowing: false` only what the guarantee holds some
of is capped (`_caps`). A cap is a usage vector with `inf` where it governs nothing
(`cap_vector`).

A queue is charged for the tasks a job runs, never for more. A job that may start with fewer
tasks than it asks for (`min_available`, elastic jobs among them) is let in with as many of
its first tasks as every queue on its path has room for, at least its minimum (`queue_takes`
cuts it to them: its last groups' last tasks are left out, as a shrink leaves them); it waits
for its queue only when not even its minimum fits there. Volcano's and Kueue's partial
admission do the same. A queue's `user_limit` is one more such cap, on what one user's jobs
hold there (and under it): it holds a job, cuts it and bounds its regrowth like `limit`, on
the usage of the job's user alone. Growing such a job restarts it, so a grow is worth it only
when its queue would take it back with more tasks than it holds (`tasks_to_regrow`).

A job that may not be evicted is held off other top-level queues' guarantees too
(`holds_others_guarantee`). The cycle (`queue_takes`) and a grow's prediction outside one
(`tasks_to_regrow`) share that rule and its cut to the minimum (`_holds_others_guarantee`,
`_unevictable_tasks`): a prediction by the limits alone grew such a job at its minimum beside
another queue's idle guarantee, and the cycle took it back no larger, its work lost for nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from aisched.core.session import cluster_totals, queue_path_of, usage_vector
from aisched.core.snapshot import (
    ZERO,
    PendingJob,
    RunningJob,
    Snapshot,
    Usage,
    add_usage,
)
from aisched.model.job import Job
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import DIM_NAMES, Dim, Resources

if TYPE_CHECKING:
    from aisched.core.decisions import TaskBinding
    from aisched.core.eviction import Cut
    from aisched.core.session import Session


def cap_vector(cap: Resources, governs: frozenset[Dim]) -> Usage:
    """`cap` as a usage vector, `inf` on each resource not in `governs`."""
    amounts = usage_vector(cap)
    return (
        amounts[0] if Dim.CPU in governs else math.inf,
        amounts[1] if Dim.MEMORY in governs else math.inf,
        amounts[2] if Dim.GPU in governs else math.inf,
    )


def _limit(q: Queue) -> Usage | None:
    return None if q.limit is None else cap_vector(q.limit, q.limit_caps())


def _user_limit(q: Queue) -> Usage | None:
    return None if q.user_limit is None else cap_vector(q.user_limit, q.user_limit_caps())


def _guarantee_cap(q: Queue) -> Usage | None:
    """What `borrowing: false` keeps the queue within (None when it may borrow)."""
    return None if q.borrowing else cap_vector(q.guarantee, q.guarantees())


def _over(usage: Usage, cap: Usage) -> int | None:
    """The first dimension where `usage` exceeds `cap` (a `cap_vector`), or None."""
    for i in range(3):
        if usage[i] > cap[i]:
            return i
    return None


def exceeds_limit_alone(session: Session, job: Job) -> str | None:
    """Why the job could never run in its queue: its minimum alone is above a limit on its
    path (the whole job, unless it may start with fewer tasks)."""
    req = usage_vector(first_tasks_request(job, job.gang_min))
    for qname in session.queue_path(job.queue):
        q = session.queues.get(qname)
        if (cap := _limit(q)) is not None and (dim := _over(req, cap)) is not None:
            return f"needs more {DIM_NAMES[dim]} than queue {qname}'s limit{_of_none(cap, dim)}"
        if (cap := _user_limit(q)) is not None and (dim := _over(req, cap)) is not None:
            return (
                f"needs more {DIM_NAMES[dim]} than queue {qname}'s per-user limit"
                f"{_of_none(cap, dim)}"
            )
        if (cap := _guarantee_cap(q)) is not None and (dim := _over(req, cap)) is not None:
            return f"needs more {DIM_NAMES[dim]} than queue {qname}'s guarantee (no borrowing)"
    return None


def holds_others_guarantee(session: Session, job: Job, req: Usage) -> str | None:
    """Why a job that may not be evicted (`preemptible: false`) may not start with `req`: it
    would hold capacity guaranteed to another queue, which reclaim could then never take back
    (a user of a queue without a guarantee could keep another queue's jobs waiting for as long
    as it ran). Such work beyond its own top-level queue's guarantee must fit in what no
    top-level queue is guaranteed, counted over every running job that may not be evicted;
    as Volcano keeps such jobs within their queue's deserved share. Only where a guarantee
    governs the dimension: with none configured, nothing changes."""
    return _holds_others_guarantee(
        session.queues, session.totals, session.running.values(), session.queue_path, job, req
    )


def _holds_others_guarantee(
    queues: QueueTree,
    totals: Usage,
    running: Iterable[RunningJob],
    queue_path: Callable[[str], tuple[str, ...]],
    job: Job,
    req: Usage,
) -> str | None:
    """`holds_others_guarantee` on its parts, so that a cycle (`queue_takes`) and a grow's
    prediction outside one (`tasks_to_regrow`) apply the one rule: `totals` the cluster's
    capacity, `running` the jobs holding resources (the job itself not among them)."""
    if job.preemptible:
        return None
    tops = queues.children(None)
    guarantees = {q.name: usage_vector(q.guarantee) for q in tops}
    if not any(x > 0 for g in guarantees.values() for x in g):
        return None
    held = {name: ZERO for name in guarantees}
    for r in running:
        if not r.job.preemptible and (top := queue_path(r.job.queue)[0]) in held:
            held[top] = add_usage(held[top], r.usage)
    mine = queue_path(job.queue)[0]
    held[mine] = add_usage(held.get(mine, ZERO), req)
    for i in range(3):
        if not any(g[i] > 0 for g in guarantees.values()):
            continue
        pool = totals[i] - sum(g[i] for g in guarantees.values())
        over = sum(max(0.0, h[i] - guarantees.get(q, ZERO)[i]) for q, h in held.items())
        if over > pool:
            return (
                f"it may not be evicted (preemptible: false), and would hold {DIM_NAMES[i]} "
                "guaranteed to another queue"
            )
    return None


def queue_takes(session: Session, job: Job) -> Job | str:
    """The job as its queue lets it start now: itself when every queue on its path has room
    for its whole request; a job that may start with fewer tasks cut to the most of its first
    tasks they have room for, at least its minimum (`cut_to`); else why the queue holds it
    (limit reached, may not borrow). A job that may not be evicted is also held off other
    queues' guarantees (`holds_others_guarantee`), cut to its minimum where only that fits
    (`_unevictable_tasks`). Place the job returned, and bind the job asked about."""
    taken = _queue_takes(session, job)
    if job.preemptible or isinstance(taken, str):
        return taken
    tasks = _unevictable_tasks(
        job, taken.num_tasks, lambda req: holds_others_guarantee(session, job, req)
    )
    if isinstance(tasks, str):
        return tasks
    return taken if tasks == taken.num_tasks else cut_to(job, tasks)


def _unevictable_tasks(job: Job, tasks: int, holds: Callable[[Usage], str | None]) -> int | str:
    """How many tasks a job that may not be evicted starts with, when its queues' limits let
    it start with its first `tasks`: all of them when they hold no other queue's guarantee
    (`holds`: why a request would), else its minimum where that alone does not (a job that may
    start with fewer), else why it waits. Only `tasks` and the minimum are tried, so the
    cycle's `queue_takes` and the grow's `tasks_to_regrow` agree by sharing this."""
    why = holds(usage_vector(first_tasks_request(job, tasks)))
    if why is None:
        return tasks
    if job.gang_min == job.num_tasks or tasks == job.gang_min:
        return why
    least = usage_vector(first_tasks_request(job, job.gang_min))
    return why if holds(least) else job.gang_min


def _queue_takes(session: Session, job: Job) -> Job | str:
    """`queue_takes` by the queues' limits alone."""
    if job.queue in session.queues.ungoverned:
        return job
    reason = _blocks(session, job, usage_vector(job.total_request))
    if reason is None:
        return job
    if job.gang_min == job.num_tasks:
        return reason
    path = session.queue_path(job.queue)
    rooms = _rooms_left(session.queues, path, session.usage_of, session.user_usage_of, job)
    tasks = _tasks_fitting(job, rooms)
    if tasks >= job.gang_min:
        return cut_to(job, tasks)
    least = _blocks(session, job, usage_vector(first_tasks_request(job, job.gang_min)))
    return least or reason


def as_taken(pj: PendingJob, taken: Job) -> PendingJob:
    """`pj` with the job its queue takes (`queue_takes`) in its place, to place or reserve
    for; the decisions still name `pj`."""
    return pj if taken is pj.job else replace(pj, job=taken)


def queue_blocks(session: Session, job: Job) -> str | None:
    """Why the job's queue does not let it start now, not even at its minimum (`queue_takes`
    without the cut job)."""
    taken = queue_takes(session, job)
    return taken if isinstance(taken, str) else None


def _blocks(session: Session, job: Job, req: Usage) -> str | None:
    """Why `req` more of `job`'s user's in its queue would go over a limit, a user limit (or a
    guarantee that may not be borrowed above) on its path. A user limit counts what the job's
    account holds (`Job.counted_with`), not every account that ever had its user's name."""
    for qname in session.queue_path(job.queue):
        q = session.queues.get(qname)
        after = add_usage(session.usage_of(qname), req)
        if (cap := _limit(q)) is not None and (dim := _over(after, cap)) is not None:
            return f"queue {qname} would exceed its {DIM_NAMES[dim]} limit{_of_none(cap, dim)}"
        if (cap := _guarantee_cap(q)) is not None and (dim := _over(after, cap)) is not None:
            return f"queue {qname} would exceed its {DIM_NAMES[dim]} guarantee and may not borrow"
        if (cap := _user_limit(q)) is not None:
            mine = add_usage(_held_by(session.user_usage_of, qname, job), req)
            if (dim := _over(mine, cap)) is not None:
                return (
                    f"user {job.user} would exceed queue {qname}'s per-user {DIM_NAMES[dim]} limit"
                    f"{_of_none(cap, dim)}"
                )
    return None


def _of_none(cap: Usage, dim: int) -> str:
    """What a reason adds where the cap is 0: that the queue may use none of it at all (a
    limit of 0 is no oversight of ours)."""
    return f" (0: it may use no {DIM_NAMES[dim]})" if cap[dim] == 0 else ""


def first_tasks_request(job: Job, tasks: int) -> Resources:
    """What the job's first `tasks` tasks ask for, its groups in turn."""
    if tasks >= job.num_tasks:
        return job.total_request
    return cut_to(job, tasks).total_request


def cut_to(job: Job, tasks: int) -> Job:
    """`job` with its first `tasks` tasks only (at least its minimum): its last groups' last
    tasks left out. The tasks keep their group names and indices, so a binding of the cut job
    is a binding of the job."""
    if tasks >= job.num_tasks:
        return job
    groups = []
    left = tasks
    for g in job.groups:
        if left <= 0:
            break
        keep = min(g.replicas, left)
        groups.append(g if keep == g.replicas else replace(g, replicas=keep))
        left -= keep
    return replace(job, groups=tuple(groups), min_available=min(job.gang_min, tasks))


def _caps(q: Queue) -> list[Usage]:
    """What a queue's usage may not go above (`cap_vector`s): its limit, and its guarantee
    when it may not borrow."""
    return [cap for cap in (_limit(q), _guarantee_cap(q)) if cap is not None]


def _rooms_left(
    queues: QueueTree,
    path: tuple[str, ...],
    used: Callable[[str], Usage],
    user_used: Callable[[str, str], Usage],
    job: Job,
) -> list[list[float]]:
    """Per cap on `path`, what is left under it per dimension (inf where it governs none): a
    queue's caps on what `used` says it holds, its user limit on what `user_used` says the
    job's account holds there (`_held_by`)."""
    rooms = []
    for qname in path:
        q = queues.get(qname)
        held = [(cap, used(qname)) for cap in _caps(q)]
        if (cap := _user_limit(q)) is not None:
            held.append((cap, _held_by(user_used, qname, job)))
        for c, u in held:
            rooms.append([c[i] - u[i] for i in range(3)])  # inf where c governs nothing
    return rooms


def _held_by(user_used: Callable[[str, str], Usage], qname: str, job: Job) -> Usage:
    """What the job's account holds in `qname` and under it, by `user_used` per account key."""
    total = ZERO
    for key in job.counted_with:
        total = add_usage(total, user_used(qname, key))
    return total


def _tasks_fitting(job: Job, rooms: list[list[float]]) -> int:
    """How many of the job's first tasks, its groups in turn, fit under every room (which it
    uses up as it counts)."""
    fitting = 0
    for g in job.groups:
        req = usage_vector(g.request)
        take = g.replicas
        for room in rooms:
            for left, per_task in zip(room, req, strict=True):
                if per_task > 0 and left != math.inf:
                    take = min(take, max(0, math.floor(left / per_task)))
        fitting += take
        if take < g.replicas:
            break
        for room in rooms:
            for i in range(3):
                room[i] -= take * req[i]
    return fitting


def tasks_to_regrow(snapshot: Snapshot, running: RunningJob) -> int:
    """How many tasks the job of `running`, one of `snapshot`'s running views, would be let
    start with by its queue once it has given back what it holds: `queue_takes`' rules
    outside a cycle, its queues' limits on the usage per (queue, user) and, for a job that may
    not be evicted, the hold off other queues' guarantees over the other running jobs
    (`_unevictable_tasks`, the cycle's own); 0 when not even its minimum. Growing an elastic
    job requeues it: a grow is worth it only when this is more than the tasks it holds, and a
    requeued job its queue will not take back, or takes back smaller, loses the tasks it ran
    for nothing."""
    queues, job, held = snapshot.queues, running.job, running.usage
    if job.queue in queues.ungoverned or not queues.has(job.queue):
        tasks = job.num_tasks
    else:
        usage = snapshot.user_usage()

        def used(qname: str, user: str | None = None) -> Usage:
            """What `qname` (the account key `user`'s part of it, if named) will hold once the
            job gave back (what it holds is its own account's)."""
            mine = user is None or user == job.account
            total = add_usage(ZERO, held, -1.0) if mine else ZERO
            for (leaf, owner), u in usage.items():
                in_path = queues.has(leaf) and qname in queues.path(leaf)
                if (user is None or owner == user) and in_path:
                    total = add_usage(total, u)
            return total

        path = queues.path(job.queue)
        tasks = _tasks_fitting(job, _rooms_left(queues, path, used, used, job))
    if tasks < job.gang_min:
        return 0
    if job.preemptible:
        return tasks
    totals = cluster_totals(snapshot.arrays)
    path_of = partial(queue_path_of, queues)

    def holds(req: Usage) -> str | None:
        others = (r for r in snapshot.running if r.job.id != job.id)  # it gave back its own
        return _holds_others_guarantee(queues, totals, others, path_of, job, req)

    taken = _unevictable_tasks(job, tasks, holds)
    return 0 if isinstance(taken, str) else taken


def guarantee_claim(session: Session, job: Job) -> tuple[str, Job] | None:
    """The queue whose guarantee the job reclaims for, and the job as that guarantee holds it:
    the deepest queue on its path (its own first, then those above it) whose guarantee governs
    some resource, is not exceeded, and has room for the job's minimum; the job itself when
    the room holds its whole request, else cut to the most of its first tasks it holds
    (`cut_to`). None when no queue on its path has such room. A queue's usage counts the
    queues under it, so a queue without a guarantee of its own reclaims for its parent's, from
    queues outside that parent, as Kueue's cohorts and Volcano's hierarchical queues lend a
    parent's share to its children. The choice hangs on the minimum alone, which a cut by the
    limits keeps (`queue_takes`), so the job and its cut name the same queue. Reclaim takes
    capacity back for this much of a job and no more: an elastic job larger than the guarantee
    still gets the guarantee, as a job of that size would."""
    for qname in reversed(session.queue_path(job.queue)):
        g = usage_vector(session.queues.get(qname).guarantee)
        if not any(x > 0 for x in g):
            continue
        used = session.usage_of(qname)
        if any(gi > 0 and ui > gi for gi, ui in zip(g, used, strict=True)):
            continue
        room = [gi - ui if gi > 0 else math.inf for gi, ui in zip(g, used, strict=True)]
        tasks = _tasks_fitting(job, [room])
        if tasks >= job.gang_min:
            return qname, cut_to(job, tasks)
    return None


def borrowed(
    session: Session, queue: str, minus: Usage, spared: Iterable[str] = (), whole: bool = False
) -> bool:
    """True when `queue` is above its guarantee now on some dimension, and it and every queue
    above it would still be at or above theirs after giving up `minus`: its work there is
    borrowed. `whole`: `minus` is a whole job, which may also go when it holds some of what a
    queue borrowed (`_gives_borrowed`), though that queue goes below its guarantee after it.
    The queues in `spared` are not judged: those of the reclaiming queue's path, which the job
    reclaimed for refills."""
    return _may_give(session, queue, set(spared), {}, minus, whole)


def borrowed_usage(queues: QueueTree, usage: Mapping[str, Usage]) -> dict[str, Usage]:
    """Per queue of `queues`, how much of what it uses is borrowed, per resource: the most
    that could be taken from it with no queue on its path (itself, then those above it) going
    below its guarantee, as `borrowed` judges a victim. `usage`: per queue, the queues under
    it counted. A queue with no guarantee on its path has borrowed all it uses; one without a
    guarantee of its own, inside its parent's, has borrowed only what the parent uses above
    its own. The only top-level queue owns the whole cluster: nothing it uses is borrowed.
    (`borrowed`'s leave for one whole job to take a queue below its guarantee is a job's, not
    an amount's: not counted here.)"""
    out: dict[str, Usage] = {}
    roots = [q for q in queues.queues if q.parent is None]
    for q in queues.queues:
        if roots == [q]:
            out[q.name] = ZERO
            continue
        amount = list(usage.get(q.name, ZERO))
        for qname in queue_path_of(queues, q.name):
            g = usage_vector(queues.get(qname).guarantee)
            used = usage.get(qname, ZERO)
            for i, gi in enumerate(g):
                if gi > 0:  # a resource its guarantee does not name is not held back by it
                    amount[i] = min(amount[i], max(used[i] - gi, 0.0))
        out[q.name] = (amount[0], amount[1], amount[2])
    return out


def _may_give(
    session: Session,
    queue: str,
    spared: set[str],
    taken: dict[str, Usage],
    gives: Usage,
    whole: bool,
) -> bool:
    """`borrowed` after the queues have given up `taken` (per queue) already: whether `queue`
    may give up `gives` more."""
    if not session.queues.has(queue):
        return False
    usage = session.usage_of(queue)
    g = usage_vector(session.queues.get(queue).guarantee)
    if not any(u > gi for u, gi in zip(usage, g, strict=True)):
        return False
    for qname in session.queue_path(queue):
        if qname in spared:
            continue
        g = usage_vector(session.queues.get(qname).guarantee)
        before = add_usage(session.usage_of(qname), taken.get(qname, ZERO), -1.0)
        left = add_usage(before, gives, -1.0)
        if all(gi == 0 or lf >= gi for gi, lf in zip(g, left, strict=True)):
            continue
        if not (whole and _gives_borrowed(g, before, gives)):
            return False
    return True


def _gives_borrowed(guarantee: Usage, before: Usage, gives: Usage) -> bool:
    """Whether a job that gives up `gives` holds some of what its queue borrowed, the queue
    holding `before` against `guarantee`: above it on a governed dimension the job uses. Such
    a job may be reclaimed though its queue then goes below its guarantee (as Volcano's and
    Kueue's reclaim take a borrowing queue's job); else a queue whose one job spans its
    guarantee and what it borrowed never gave the borrowed part back. The queue goes below by
    less than that one job, and only once: after it, it is not above its guarantee any more.
    Its requeued job reclaims nothing in turn from the queue that took it, which reclaimed
    only up to its own guarantee (`guarantee_claim`), so borrows nothing."""
    return any(
        gi > 0 and b > gi and gv > 0 for gi, b, gv in zip(guarantee, before, gives, strict=True)
    )


def task_usage(t: TaskBinding) -> Usage:
    """What one running task holds, as `RunningJob.usage` counts it."""
    return (float(t.milli_cpu), float(t.mem_mib), float(t.gpu_milli * len(t.gpus)))


def keeping_guarantees(
    session: Session, cuts: Iterable[Cut], spared: Iterable[str] = ()
) -> list[Cut]:
    """The `cuts` that may be taken together, in their order, without taking any queue below
    its guarantee, nor any queue above it below its own (a parent's usage counts its
    children's), but by one whole job that holds some of what the queue borrowed
    (`_gives_borrowed`): each cut is judged on what its queues hold after the cuts kept before
    it (`borrowed` with all of them given up), so every prefix of the result, and every subset
    of one, is allowed too (as Volcano's reclaim and Kueue count their victims). Judging each
    victim alone against the queue's usage before any eviction let a prefix of them take a
    queue far below its guarantee, whose requeued jobs then reclaimed in turn. A job cut whole
    after some of its tasks were cut counts only what is left of it; a task cut never takes a
    queue below its guarantee. `spared`: the queues not judged (`borrowed`)."""
    not_judged = set(spared)
    taken: dict[str, Usage] = {}  # per queue, what the cuts kept so far give up
    tasks_cut: dict[str, Usage] = {}  # per job, what its kept task cuts give up
    kept: list[Cut] = []
    for c in cuts:
        job_id, queue = c.job.id, c.job.job.queue
        if c.task is None:
            gives = add_usage(c.job.usage, tasks_cut.get(job_id, ZERO), -1.0)
        else:
            gives = task_usage(c.task)
        if not _may_give(session, queue, not_judged, taken, gives, c.task is None):
            continue
        for qname in session.queue_path(queue):
            taken[qname] = add_usage(taken.get(qname, ZERO), gives)
        if c.task is not None:
            tasks_cut[job_id] = add_usage(tasks_cut.get(job_id, ZERO), gives)
        kept.append(c)
    return kept


def fair_key(session: Session, job: Job) -> tuple[float, ...]:
    """Hierarchical weighted dominant share along the job's queue path (lower goes first),
    then its user's share when drf is on."""
    queues, usage, share = session.queues, session.queue_usage, session.dominant_share
    key = [share(usage.get(q, ZERO)) / queues.weight_of(q) for q in session.queue_path(job.queue)]
    if session.policy.fair_users:
        u = session.user_usage.get((job.queue, job.account))
        key.append(session.dominant_share(u) if u is not None else 0.0)
    return tuple(key)

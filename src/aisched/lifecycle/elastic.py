"""When an elastic job running short of tasks is grown.

An elastic job may start with fewer tasks than it asked for (down to `min_available`). Once
its attempt has run `grow_after_s`, while nothing is pending (capacity freed by a preemption or
a shrink is owed to the job waiting for it), and idle capacity would take at least one more of
its tasks, it is requeued from its checkpoint (a stop of kind `Stop.REQUEUE`: no failure, no
preemption counted) and the next cycle places it with as many tasks as fit.

A job is grown only as far as its queue would take it back: a queue lets a job that may
start with fewer tasks in with as many as its limit has room for (`core.queues`), so a job
started short by its queue grows once work of that queue ends, and not while its queue is full,
however idle the cluster is. A job that may not be evicted is taken back only as far as it
stays off other queues' guarantees (the cycle's own rule, `core.queues.tasks_to_regrow`), so it
is not grown into capacity guaranteed to another queue.

A grow that brought no more tasks is not tried again at that size (`grew_from`, forgotten once
an attempt starts larger, so a job shrunk later grows back again): the core may
place fewer tasks than `tasks_to_grow` counts (it packs, reserves, keeps room), and a job
requeued every `grow_after_s` for nothing would lose its work since the last checkpoint each
time and, without checkpoints, never finish (found by the lifecycle's property test).

One job grows at a time (`next_to_grow`), and only while idle capacity is owed to nobody
(`capacity_is_idle`): nothing pending, no job waiting for victims, none stopping to be
requeued (a grow under way). The next is looked at once the one grown has been placed again,
against what is idle then. Found by the parity test's random cases: the service requeued every
job that the idle capacity of one instant could take a task of, where the simulator grew one
and placed it before it looked at the next; several requeued for one hole lose their work
since the last checkpoint, and all but one for nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aisched.core.elastic import extra_tasks_fit
from aisched.core.queues import tasks_to_regrow
from aisched.core.snapshot import ClusterArrays, FreeState
from aisched.lifecycle.holdings import Holdings
from aisched.model.job import Job
from aisched.model.queue import QueueTree


@dataclass(frozen=True, slots=True)
class Running:
    """A running attempt of an elastic job, as growth sees it: `held` tasks, started at
    `attempt_started_at`; `grew_from` as for `grow_at`."""

    job: Job
    held: int
    attempt_started_at: float | None
    grew_from: int | None = None


def short_of_tasks(job: Job, held: int) -> bool:
    """Whether `job` is an elastic job running with fewer tasks than it asked for."""
    return job.elastic and 0 < held < job.num_tasks


def grow_at(
    job: Job,
    held: int,
    attempt_started_at: float | None,
    grow_after_s: float,
    grew_from: int | None = None,
) -> float:
    """The earliest time the running attempt may be grown (`inf` when it never may).
    `grew_from`: how many tasks the job held when it was last grown (None: never)."""
    if not short_of_tasks(job, held) or attempt_started_at is None:
        return math.inf
    if grew_from is not None and held <= grew_from:
        return math.inf  # the last grow brought nothing: not again at this size
    return attempt_started_at + grow_after_s


def grew_from_after_start(grew_from: int | None, tasks: int) -> int | None:
    """`grew_from` once an attempt has started with `tasks` tasks: forgotten when the grow
    brought more (it worked; a later shrink may be grown back from), kept when not."""
    return None if grew_from is not None and tasks > grew_from else grew_from


def tasks_to_grow(job: Job, held: int, arrays: ClusterArrays, free: FreeState) -> int:
    """How many more of its tasks idle capacity would take now (at most the missing ones)."""
    missing = job.num_tasks - held
    if missing < 1:
        return 0
    extra = sum(extra_tasks_fit(arrays, free, g.request, missing) for g in job.groups)
    return min(extra, missing)


def grow_message(held: int, extra: int) -> str:
    return f"growing from {held} to up to {held + extra} tasks into idle capacity"


def capacity_is_idle(*, pending: bool, waiting_for_victims: bool, requeuing: bool) -> bool:
    """Whether idle capacity is owed to nobody, so a job may grow into it: no job is pending,
    none waits for victims (what they free is kept for it), none is stopping to be requeued
    (a grow under way: one at a time)."""
    return not (pending or waiting_for_victims or requeuing)


def queue_takes_back(queues: QueueTree, held: Holdings, r: Running) -> int:
    """`next_to_grow`'s `queue_room` for a driver: how many tasks `r`'s queue would let it
    start with once it gives back what it holds (0: not even its minimum), by the rules the
    next cycle's `queue_takes` applies to it (`core.queues.tasks_to_regrow`): its queues'
    limits and, unless it may be evicted, the hold off other queues' guarantees."""
    view = held.views.get(r.job.id)
    if view is None:
        return r.job.num_tasks
    return tasks_to_regrow(held.snapshot(queues), view)


def next_to_grow(
    running: Iterable[Running],
    now: float,
    grow_after_s: float,
    arrays: ClusterArrays,
    free: FreeState,
    queue_room: Callable[[Running], int] = lambda r: r.job.num_tasks,
) -> tuple[Job, int] | None:
    """The one job to grow now, with how many more of its tasks idle capacity and its queue
    would take: the first by id (shorter ids first, so numbered ids go in their order) whose
    time to grow has come and that both would take at least one more task of. `queue_room`:
    how many tasks its queue would take it back with once it gives back what it holds (a grow
    is a requeue, and a queue takes back only what its limits have room for, and a job that
    may not be evicted only what stays off other queues' guarantees: a job its queue would
    take back no larger would lose its work for nothing). None when none may. Ask only
    when `capacity_is_idle`, and again once the job grown has been placed."""
    ready = [
        r
        for r in running
        if now >= grow_at(r.job, r.held, r.attempt_started_at, grow_after_s, r.grew_from)
    ]
    for r in sorted(ready, key=lambda r: (len(r.job.id), r.job.id)):
        extra = tasks_to_grow(r.job, r.held, arrays, free)
        if extra >= 1:
            extra = min(extra, queue_room(r) - r.held)
            if extra >= 1:
                return r.job, extra
    return None

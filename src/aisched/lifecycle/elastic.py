"""When an elastic job running short of tasks is grown.

An elastic job may start with fewer tasks than it asked for (down to `min_available`). Once
its attempt has run `grow_after_s`, while nothing is pending (capacity freed by a preemption or
a shrink is owed to the job waiting for it), and idle capacity would take at least one more of
its tasks, it is requeued from its checkpoint (a stop of kind `Stop.REQUEUE`: no failure, no
preemption counted) and the next cycle places it with as many tasks as fit.

A grow that brought no more tasks is not tried again at that size (`grew_from`): the core may
place fewer tasks than `tasks_to_grow` counts (it packs, reserves, keeps room), and a job
requeued every `grow_after_s` for nothing would lose its work since the last checkpoint each
time and, without checkpoints, never finish (found by the lifecycle's property test).
"""

from __future__ import annotations

import math

from aisched.core.elastic import extra_tasks_fit
from aisched.core.snapshot import ClusterArrays, FreeState
from aisched.model.job import Job


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


def tasks_to_grow(job: Job, held: int, arrays: ClusterArrays, free: FreeState) -> int:
    """How many more of its tasks idle capacity would take now (at most the missing ones)."""
    missing = job.num_tasks - held
    if missing < 1:
        return 0
    extra = sum(extra_tasks_fit(arrays, free, g.request, missing) for g in job.groups)
    return min(extra, missing)


def grow_message(held: int, extra: int) -> str:
    return f"growing from {held} to up to {held + extra} tasks into idle capacity"

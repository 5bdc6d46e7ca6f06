"""The loop's in-memory view of one live job and its tasks, and the write batch.

`LiveJob` mirrors a `jobs` row that is not yet terminal; `LiveTask` mirrors a `tasks` row of
the job's current attempt. The loop thread alone owns them. Every change to them that must
survive a crash goes through a `Batch`, which the loop flushes in one transaction *before* it
acts on the change (launch, signal): state is written before it is acted on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from aisched.core.decisions import TaskBinding
from aisched.core.snapshot import PendingJob, RunningJob
from aisched.executors.base import LaunchError, TaskExited, TaskHandle, TaskKey, TaskLaunch
from aisched.lifecycle.attempts import Stop
from aisched.lifecycle.services import CrashLoop
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE
from aisched.model.states import JobState
from aisched.store.db import Store, Tx

log = logging.getLogger(__name__)

# A job whose oldest attempts are forgotten keeps its first events still: its submission and
# how its first attempt began (`limits.keep_attempts`, `retention`).
FIRST_EVENTS_KEPT = 5

__all__ = ["Batch", "LiveJob", "LiveTask", "Origin", "Requests", "Stop", "TaskPhase"]

# A bound attempt's launch requests, one per task in rank order, or why they could not be put
# together (`launches`).
Requests = list[TaskLaunch] | LaunchError


class TaskPhase(StrEnum):
    LAUNCHING = "launching"  # written, maybe started: a restart must look for it
    RUNNING = "running"
    EXITED = "exited"


@dataclass(slots=True)
class LiveTask:
    name: str
    rank: int
    binding: TaskBinding
    log_path: str
    phase: TaskPhase = TaskPhase.LAUNCHING
    handle: TaskHandle | None = None
    exit: TaskExited | None = None


@dataclass(slots=True)
class LiveJob:
    job: Job
    state: JobState
    submitted_at: float
    checkpoint_dir: str
    # What it counts for against `limits.user_max_job_bytes` (`bytes_counted`), fixed when it
    # became live so that its end takes off what its start added.
    counted_bytes: int = 0
    doc_bytes: int = 0  # its document's size as stored, once (`limits.user_max_ended_bytes`)
    attempt: int = 0  # attempts started so far; the current one while running
    failures: int = 0
    preemptions: int = 0
    # Clean exits under `always` in a row from attempts shorter than `LONG_RUN_S`
    # (`lifecycle.attempts`): each doubles the wait before the next restart. Stored, so a
    # scheduler restart does not start the doubling again.
    quick_exits: int = 0
    started_at: float | None = None
    attempt_started_at: float | None = None
    not_before: float | None = None
    stopping: Stop | None = None
    stop_message: str = ""
    # Victims of a preemption made for this job: it waits, out of the cycle, until they stop,
    # then starts on the tasks the core bound it to if they fit (`lifecycle.preemption`). Not
    # stored: after a scheduler restart it is placed afresh.
    waiting_for: frozenset[str] = frozenset()
    waiting_since: float | None = None
    waiting_tasks: tuple[TaskBinding, ...] = ()
    tasks: list[LiveTask] = field(default_factory=list)
    # While stopping to shrink: the bindings it restarts on. Not stored: a scheduler restart
    # in between requeues the job instead (it is placed again with as many tasks as fit).
    shrink_to: tuple[TaskBinding, ...] | None = None
    # Tasks held when last grown (not stored): a grow that brought no more is not tried again
    # at that size (see lifecycle.elastic).
    grew_from: int | None = None
    attained_gpu_s: float = 0.0
    exit_code: int | None = None
    # (code, reason, eta) last written for this job, so unchanged statuses cost no write.
    written_status: tuple[str, str, float | None] | None = None
    # Nodes that left which it last waited for (`lost_node_grace_s`), named again should it
    # fail as never fitting once they have stayed away past the grace. Not stored.
    waited_for_left: tuple[str, ...] = ()
    # Likewise the nodes that shrank at a restart (`SchedulerState.shrank`) it waited for.
    waited_for_shrunk: tuple[str, ...] = ()
    pending_view: PendingJob | None = None
    running_view: RunningJob | None = None
    # A service's replicas that failed in a row (`lifecycle.services`), or None. Not stored:
    # derived again from its failed replicas' ends at a restart (`Recovery`).
    crash_loop: CrashLoop | None = None

    @property
    def id(self) -> str:
        return self.job.id

    def key(self, task: LiveTask) -> TaskKey:
        return (self.job.id, self.attempt, task.name)

    def gpus_held(self) -> float:
        return sum(len(t.binding.gpus) * t.binding.gpu_milli for t in self.tasks) / float(
            GPU_MILLI_WHOLE
        )

    def live_tasks(self) -> list[LiveTask]:
        return [t for t in self.tasks if t.phase != TaskPhase.EXITED]


@dataclass(frozen=True, slots=True)
class Origin:
    """A command applied since the last flush that made jobs: their ids, the command's Future,
    and the callbacks it queued in `Batch.after` (its reply), so that a command whose values the
    store cannot hold can be taken out of the batch whole (`Scheduler._refuse_unstorable`)."""

    future: Future[Any]
    job_ids: frozenset[str]
    after: tuple[Callable[[], None], ...]


@dataclass(slots=True)
class Batch:
    """Writes of one step of the loop, applied in one transaction by `flush`; `after` runs once
    the transaction has committed (replies to callers, signals to the executor). A flush that
    fails leaves the batch as it was, for the next step to flush again."""

    new_jobs: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    new_tasks: list[dict[str, Any]] = field(default_factory=list)
    tasks: dict[TaskKey, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[float, str, str, str]] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)  # ended jobs to delete (`retention`)
    # Live jobs' attempts to delete: (job id, first attempt kept) (`retention`).
    forget_attempts: list[tuple[str, int]] = field(default_factory=list)
    forget_audit: list[int] = field(default_factory=list)  # seqs of old audit rows, likewise
    after: list[Callable[[], None]] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)

    def job(self, job_id: str, **values: Any) -> None:
        self.jobs.setdefault(job_id, {}).update(values)

    def task(self, key: TaskKey, **values: Any) -> None:
        self.tasks.setdefault(key, {}).update(values)

    def event(self, time_s: float, job_id: str, kind: str, message: str) -> None:
        self.events.append((time_s, job_id, kind, message))

    def empty(self) -> bool:
        return not (
            self.new_jobs
            or self.jobs
            or self.new_tasks
            or self.tasks
            or self.events
            or self.forget
            or self.forget_attempts
            or self.forget_audit
        )

    def write(self, tx: Tx) -> None:
        tx.insert_jobs(self.new_jobs)
        tx.update_jobs(self.jobs)
        tx.insert_tasks(self.new_tasks)
        tx.update_tasks(self.tasks)
        tx.add_events(self.events)
        tx.forget_jobs(self.forget)
        for job_id, first_kept in self.forget_attempts:  # after the events: its note is kept
            tx.forget_attempts(job_id, first_kept, FIRST_EVENTS_KEPT)
        tx.forget_audit(self.forget_audit)

    def of_jobs(self, job_ids: frozenset[str]) -> Batch:
        """The writes of these jobs alone (to try them on their own)."""
        out = Batch()
        out.new_jobs = [r for r in self.new_jobs if r["id"] in job_ids]
        out.jobs = {k: v for k, v in self.jobs.items() if k in job_ids}
        out.new_tasks = [r for r in self.new_tasks if r["job_id"] in job_ids]
        out.tasks = {k: v for k, v in self.tasks.items() if k[0] in job_ids}
        out.events = [e for e in self.events if e[1] in job_ids]
        return out

    def drop_jobs(self, job_ids: frozenset[str]) -> None:
        """Take every write of these jobs out (jobs never stored, so nothing else names them)."""
        self.new_jobs = [r for r in self.new_jobs if r["id"] not in job_ids]
        self.jobs = {k: v for k, v in self.jobs.items() if k not in job_ids}
        self.new_tasks = [r for r in self.new_tasks if r["job_id"] not in job_ids]
        self.tasks = {k: v for k, v in self.tasks.items() if k[0] not in job_ids}
        self.events = [e for e in self.events if e[1] not in job_ids]

    def flush(self, store: Store) -> None:
        if not self.empty():
            with store.tx() as tx:
                self.write(tx)
        after = self.after
        self.new_jobs, self.jobs, self.new_tasks, self.tasks, self.events = [], {}, [], {}, []
        self.forget = []
        self.forget_attempts = []
        self.forget_audit = []
        self.after = []
        self.origins = []
        # Each on its own: one that fails (a stop whose file cannot be written) must not drop
        # the others (other stops, launches, the answers callers wait for).
        for fn in after:
            try:
                fn()
            except Exception:
                log.exception("an action after a stored step failed")

"""The loop's configuration, the commands other threads queue for it, its counters, and the
refusal a command gets (`Rejected`). Plain values: no behaviour, no state."""

from __future__ import annotations

import math
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from aisched.model.job import Job
from aisched.store.db import Row


@dataclass(frozen=True, slots=True)
class LoopConfig:
    data_dir: Path
    cycle_interval_s: float = 5.0
    max_backoff_s: float = 300.0
    # The longest the loop sleeps without being woken (a safety net for missed wake-ups).
    tick_s: float = 1.0
    # A preemption's beneficiary gives up waiting for its victims after their grace period plus
    # this, and is scheduled afresh (a victim that never stops must not block it forever;
    # `lifecycle.preemption`, the simulator's `victim_wait_s` too).
    victim_wait_s: float = 30.0
    master_addr: str = "127.0.0.1"
    # Variables every task starts with, under its own and the contract's (PATH, HOME, ...).
    base_env: tuple[tuple[str, str], ...] = ()
    # After a cycle that took t seconds, the next waits at least t x this: under a stream of
    # submissions the queue grows and so does a cycle; this keeps three quarters of the time
    # for taking submissions in, while an idle scheduler (fast cycles) still answers at once.
    cycle_gap_factor: float = 3.0
    # Estimated starts (the `eta` action) are worked out by at most one cycle in this long;
    # the cycles between keep each waiting job's last one (0: every cycle).
    eta_interval_s: float = 5.0
    # An elastic job missing tasks is grown (restarted larger from its checkpoint) once it has
    # run this long in its attempt, idle capacity fits more of its tasks and nothing waits.
    elastic_grow_after_s: float = 60.0
    # How often a job that names no checkpoint interval is taken to checkpoint, in the view the
    # core chooses victims by (`lifecycle.work.checkpoint_interval_s`): by default it is not.
    checkpoint_interval_s: float = math.inf
    # The service's id (`Store.instance_id`): names checkpoint directories outside data_dir.
    instance: str = ""
    # The most jobs one user may have not yet ended (`limits.user_max_jobs`; 0: no limit).
    # Submissions past it are refused with 429; a service counts with its `max_replicas`.
    user_max_jobs: int = 0
    # What one user's jobs not yet ended may take in the store together, in bytes of their
    # documents (`limits.user_max_job_bytes`; 0: no limit). Past it, 429 too.
    user_max_job_bytes: int = 0
    # A waiting job that fits only with nodes that left the cluster (a raylet restart, a
    # network blip) waits this long for them to come back before it is failed as never fitting.
    lost_node_grace_s: float = 600.0
    # Ended jobs are forgotten this long after they ended (`limits.keep_ended`; 0: never).
    keep_ended_s: float = 0.0
    # Audit rows are deleted this long after they were written (`limits.keep_audit`; 0: never).
    keep_audit_s: float = 0.0
    # ...and one user's oldest ended jobs sooner, when their documents and files together take
    # more than this (`limits.user_max_ended_bytes`; 0: no bound).
    user_max_ended_bytes: int = 0
    # What one user's running jobs' logs may take together before the largest are stopped
    # (`limits.user_max_running_log_bytes`; 0: no bound).
    user_max_running_log_bytes: int = 0
    # A live job keeps the records (task rows, folders, events) of its latest this many
    # attempts; older ones are forgotten (`limits.keep_attempts`; 0: every one is kept).
    keep_attempts: int = 0
    # Check the lifecycle's invariants after every cycle and raise on a broken one (tests).
    validate: bool = False


class Rejected(Exception):
    """A command refused: `status` is the HTTP status the API answers with."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class NotAccepting(Rejected):
    """A new submission while the service takes none (disk pressure, a failing store): `status`
    507 or 503, the message readiness's first problem."""


@dataclass(frozen=True, slots=True)
class SubmitCommand:
    job: Job
    fmt: str
    warnings: tuple[str, ...]
    received_at: float
    future: Future[Row]
    idempotency_key: str | None = None
    # Set while the service takes no new work: only a retry of a submission already taken
    # (its Idempotency-Key) is answered, with its job; a new one is refused with this.
    not_accepting: NotAccepting | None = None


@dataclass(frozen=True, slots=True)
class SubmitAllCommand:
    """Jobs submitted together (a pipeline): all are stored, or none."""

    items: tuple[tuple[Job, str, tuple[str, ...]], ...]  # (job, format, warnings)
    received_at: float
    future: Future[list[Row]]
    idempotency_key: str | None = None
    not_accepting: NotAccepting | None = None  # as SubmitCommand's


@dataclass(frozen=True, slots=True)
class ScaleCommand:
    """Keep `replicas` live replicas of service `service_id` (the autoscaler's command), the
    replica `replace` (when given) stopped and counted out first; `ready`: the replicas found
    ready (None: not known), which a scale-down takes last."""

    service_id: str
    replicas: int
    reason: str
    future: Future[int]
    replace: str | None = None
    ready: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class CancelCommand:
    job_id: str
    future: Future[str]


@dataclass(frozen=True, slots=True)
class CancelSelection:
    """Which live jobs a bulk cancel takes: those of `user` (None: every user's) as the
    account of `uid` (`identity.same_account`), in `queue` (None: any), in `state` ("pending"
    or "running"; None: both). A service's replicas are left to their service, which owns
    them."""

    user: str | None = None
    uid: int | None = None
    queue: str | None = None
    state: str | None = None


@dataclass(frozen=True, slots=True)
class BulkCancelCommand:
    selection: CancelSelection
    # Each job taken, with its state after the command (cancelled, or running while it stops).
    future: Future[list[tuple[str, str]]]


Command = SubmitCommand | SubmitAllCommand | ScaleCommand | CancelCommand | BulkCancelCommand


@dataclass(slots=True)
class LoopStats:
    """Counters the metrics endpoint reads (written by the loop thread only)."""

    cycles: int = 0
    last_cycle_s: float = 0.0
    held_for_cycle_errors: int = 0  # jobs a cycle failed on alone, held back (`poison`)
    held_for_step_errors: int = 0  # jobs whose exit, timers or re-check raised: left alone
    cycle_durations: list[float] | None = None

"""Why an attempt is stopped, and what its job becomes once every task of it has ended.

An attempt ends in one of two ways: its tasks end by themselves (all with code 0: a success;
one otherwise: a failure, and the rest of the gang is stopped), or the driver stops it for a
reason (`Stop`). `after_attempt` is the one rule that turns how it ended into what comes next:

| how it ended                 | next                                                      |
| ---------------------------- | --------------------------------------------------------- |
| cancelled                    | CANCELLED                                                 |
| preempted                    | requeued (PENDING), its preemption counted                |
| shrunk, kept tasks known     | restarted at once on the kept tasks (a new attempt)       |
| shrunk, kept tasks unknown   | requeued (a shrink cut short by a scheduler restart)      |
| requeued (grow, interrupted) | requeued, nothing counted                                 |
| over its time limit          | FAILED, no retry                                          |
| a task could never run       | FAILED, no retry (its image is missing: a retry would too) |
| a task failed                | retried after a backoff while retries are left, else FAILED |
| all tasks exited with 0      | SUCCEEDED; under `always` restarted after a wait (below)    |

The two drivers used to disagree about a shrink (the simulator restarted it on the kept tasks
at once; the service did the same except when its scheduler had restarted in between, when it
requeued it). The rule kept is the service's: restart on the kept tasks when they are known,
requeue otherwise. In the simulator they are always known.

Retries wait `backoff_s * 2**(failures - 1)`, capped by the driver's `max_backoff_s`: a job
that keeps failing does not spin, and the cap keeps the wait bounded for large counts. A clean
exit under `always` is no failure and counts none, but waits before its restart: `true` under
`always` started a new attempt in the same second as each exit, hundreds a minute, each with
its own log directory. The wait is Kubernetes' for a container that keeps exiting, even with
0: an attempt that ran less than `LONG_RUN_S` is a quick exit, and the *n*-th quick exit in a
row waits `max(backoff_s, MIN_RESTART_WAIT_S) * 2**(n - 1)`, capped by `max_backoff_s`
(`restart_wait_s`); an attempt that ran `LONG_RUN_S` or more ends the run (whatever its end),
and its clean exit waits `backoff_s` alone. The run is the driver's to keep (`quick_exits`,
given and returned like the failure count); failures keep their own backoff, and a service's
replicas that fail for good their own (`services.CrashLoop`), so no wait is doubled twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from aisched.core.decisions import TaskBinding
from aisched.model.job import Job, RestartPolicy
from aisched.model.states import JobState

# An attempt under `always` that ran less than this and exited cleanly is a quick exit: the next
# wait doubles. One that ran this long ends the run (Kubernetes resets a container's backoff
# after it ran 10 minutes; a service's crash loop, `services.CRASH_RESET_S`, is this too).
LONG_RUN_S = 600.0
# The least a quick exit waits, whatever the job's backoff: `backoff: 0` must not spin.
MIN_RESTART_WAIT_S = 1.0


class Stop(StrEnum):
    """Why a running attempt is being stopped; decides what the job becomes when it has."""

    PREEMPT = "preempt"  # requeued, restart count up, no failure counted
    CANCEL = "cancel"  # cancelled
    FAILED = "failed"  # a task failed: the rest of the gang is stopped, then retry or fail
    TIMEOUT = "timeout"  # over its time limit: failed, no retry
    # Its user's running jobs' logs over their bound (`limits.user_max_running_log_bytes`):
    # failed, no retry, as a timeout (a retry would write as much again).
    LOGS = "logs"
    # A task could not run at all (its image missing or unpullable): failed, no retry, since
    # the next attempt would fail the same way; it is not a crash of the job's code.
    UNRUNNABLE = "unrunnable"
    REQUEUE = "requeue"  # to grow, or the attempt never fully started: requeued, free
    # An elastic job giving up tasks for another job: restarted at once (from its checkpoint)
    # on the tasks it keeps, without going back to the queue; no failure counted.
    SHRINK = "shrink"


@dataclass(frozen=True, slots=True)
class Finish:
    """The job ends in `state` (terminal) for `why`."""

    state: JobState
    why: str


@dataclass(frozen=True, slots=True)
class Requeue:
    """The job goes back to the queue (PENDING); `event` and `message` say why, for the log.
    With `not_before`, the cycle does not see it before then (a retry's backoff)."""

    event: str
    message: str
    not_before: float | None = None
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RestartOn:
    """A new attempt starts at once on `keep` (a shrunk elastic job), without the queue."""

    keep: tuple[TaskBinding, ...]
    message: str


Next = Finish | Requeue | RestartOn


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What comes after an attempt, with the job's counters once it is applied."""

    next: Next
    failures: int
    preemptions: int
    succeeded: bool = False
    quick_exits: int = 0  # quick clean exits under `always` in a row, this one included


def retry_wait_s(job: Job, failures: int, max_backoff_s: float) -> float:
    """How long the `failures`-th failure waits before its retry (exponential, capped)."""
    if failures < 1:
        return 0.0
    # The exponent is capped too: 2**1100 overflows a float long before the cap matters.
    return float(min(job.backoff_s * 2 ** min(failures - 1, 60), max_backoff_s))


def restart_wait_s(job: Job, quick_exits: int, max_backoff_s: float) -> float:
    """How long a clean exit under `always` waits before its restart, the `quick_exits`-th
    quick one in a row (0: the attempt ran `LONG_RUN_S` or more): `backoff_s` after a long
    run, else doubling from `max(backoff_s, MIN_RESTART_WAIT_S)`, capped by `max_backoff_s`."""
    if quick_exits < 1:
        return float(min(job.backoff_s, max_backoff_s))
    base = replace(job, backoff_s=max(job.backoff_s, MIN_RESTART_WAIT_S))
    return retry_wait_s(base, quick_exits, max_backoff_s)


def will_retry(job: Job, failures: int) -> bool:
    """Whether a job that has failed `failures` times (this one included) runs again."""
    return job.restart_policy != RestartPolicy.NEVER and failures <= job.max_retries


def after_attempt(
    job: Job,
    stop: Stop | None,
    message: str,
    *,
    failures: int,
    preemptions: int,
    now: float,
    max_backoff_s: float,
    keep: tuple[TaskBinding, ...] | None = None,
    started: int | None = None,
    ran_s: float = math.inf,
    quick_exits: int = 0,
) -> AttemptEnd:
    """What `job` becomes now that every task of its attempt has ended.

    `stop` is why the attempt was stopped (None: its tasks all exited with code 0); `message`
    says it in words; `failures`, `preemptions` and `quick_exits` are the job's counts before
    this attempt ended; `keep` the tasks a shrink keeps, when known; `started` how many tasks
    the attempt started (None: all of them), so that its end says so when some of the job's
    never ran; `ran_s` how long the attempt ran (from its start to now).
    """
    # A long run ends a run of quick exits, however it ended.
    quick = 0 if ran_s >= LONG_RUN_S else quick_exits
    if stop is None and job.restart_policy == RestartPolicy.ALWAYS:
        if ran_s < LONG_RUN_S:
            quick += 1
        wait = restart_wait_s(job, quick, max_backoff_s)
        text = (
            f"{_all_tasks(job, started)} exited; restart policy is always: restarting in {wait:g}s"
        )
        if quick > 1:
            text += (
                f" ({quick} runs in a row shorter than {LONG_RUN_S:g}s: the wait doubles "
                "until a run lasts that long)"
            )
        restart = Requeue("restarting", text, now + wait, wait)
        return AttemptEnd(restart, failures, preemptions, quick_exits=quick)
    end = _after_attempt(
        job,
        stop,
        message,
        failures=failures,
        preemptions=preemptions,
        now=now,
        max_backoff_s=max_backoff_s,
        keep=keep,
        started=started,
    )
    return replace(end, quick_exits=quick)


def _after_attempt(
    job: Job,
    stop: Stop | None,
    message: str,
    *,
    failures: int,
    preemptions: int,
    now: float,
    max_backoff_s: float,
    keep: tuple[TaskBinding, ...] | None,
    started: int | None,
) -> AttemptEnd:
    if stop == Stop.CANCEL:
        return AttemptEnd(Finish(JobState.CANCELLED, "cancelled"), failures, preemptions)
    if stop == Stop.PREEMPT:
        return AttemptEnd(Requeue("preempted", f"{message}; requeued"), failures, preemptions + 1)
    if stop == Stop.SHRINK and keep:
        text = f"{message}; restarting with {len(keep)} tasks from its checkpoint"
        return AttemptEnd(RestartOn(keep, text), failures, preemptions)
    if stop in (Stop.REQUEUE, Stop.SHRINK):
        if stop == Stop.SHRINK:  # the kept tasks died with the scheduler: placed afresh
            message = "a shrink cut short by a scheduler restart"
        return AttemptEnd(Requeue("requeued", f"{message}; requeued"), failures, preemptions)
    if stop in (Stop.TIMEOUT, Stop.LOGS):
        return AttemptEnd(Finish(JobState.FAILED, message), failures, preemptions)
    if stop == Stop.UNRUNNABLE:
        return AttemptEnd(
            Finish(JobState.FAILED, f"{message}; not retried"), failures + 1, preemptions
        )
    if stop == Stop.FAILED:
        failures += 1
        if will_retry(job, failures):
            wait = retry_wait_s(job, failures, max_backoff_s)
            text = f"{message}; retry {failures} of {job.max_retries} in {wait:g}s"
            return AttemptEnd(Requeue("retrying", text, now + wait, wait), failures, preemptions)
        why = (
            f"{message}; no retries left ({job.max_retries})"
            if job.restart_policy != RestartPolicy.NEVER
            else f"{message}; restart policy is never"
        )
        return AttemptEnd(Finish(JobState.FAILED, why), failures, preemptions)
    done = Finish(JobState.SUCCEEDED, f"{_all_tasks(job, started)} exited with code 0")
    return AttemptEnd(done, failures, preemptions, succeeded=True)


def _all_tasks(job: Job, started: int | None) -> str:
    """`all tasks`, or how many of how many when the attempt started fewer than the job has
    (a gang minimum below its task count, not elastic: the others never run)."""
    if started is None or started >= job.num_tasks:
        return "all tasks"
    return f"all {started} tasks that started (of {job.num_tasks})"


def time_limit_at(job: Job, attempt_started_at: float | None) -> float:
    """When the running attempt passes the job's time limit (`inf` without one)."""
    if job.time_limit_s is None or attempt_started_at is None:
        return math.inf
    return attempt_started_at + job.time_limit_s


def time_limit_message(job: Job) -> str:
    return f"exceeded its time limit of {job.time_limit_s:g}s"

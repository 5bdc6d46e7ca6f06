"""The attempt-end rule: stops that are final whatever the restart policy says, and the wait
before a restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aisched.lifecycle.attempts import (
    LONG_RUN_S,
    AttemptEnd,
    Finish,
    Requeue,
    Stop,
    after_attempt,
)
from aisched.model.job import Job, RestartPolicy
from aisched.model.states import JobState
from aisched.testing.builders import job


@pytest.mark.parametrize(
    ("stop", "want"),
    [
        (Stop.UNRUNNABLE, AttemptEnd(Finish(JobState.FAILED, "no image; not retried"), 1, 0)),
        (Stop.TIMEOUT, AttemptEnd(Finish(JobState.FAILED, "no image"), 0, 0)),
        (Stop.LOGS, AttemptEnd(Finish(JobState.FAILED, "no image"), 0, 0)),
    ],
)
def test_an_unrunnable_task_a_timeout_or_logs_over_their_bound_fail_the_job_without_a_retry(
    stop: Stop, want: AttemptEnd
) -> None:
    j = job("j").build()  # the default restart policy retries failures
    got = after_attempt(j, stop, "no image", failures=0, preemptions=0, now=0.0, max_backoff_s=60)
    assert got == want
    failed = after_attempt(
        j, Stop.FAILED, "x", failures=0, preemptions=0, now=0.0, max_backoff_s=60
    )
    assert isinstance(failed.next, Requeue)  # a crash is retried


def test_a_clean_exit_under_always_restarts_after_its_backoff_and_counts_no_failure() -> None:
    """`true` under `always` used to start a new attempt in the same second as each exit (1,800
    attempts in 80 s, each with its own log directory): it now waits its backoff, capped."""
    j = replace(job("j").build(), restart_policy=RestartPolicy.ALWAYS, backoff_s=10.0)
    end = after_attempt(j, None, "", failures=2, preemptions=1, now=100.0, max_backoff_s=60)
    text = "all tasks exited; restart policy is always: restarting in 10s"
    assert end == AttemptEnd(Requeue("restarting", text, 110.0, 10.0), 2, 1)
    capped = after_attempt(j, None, "", failures=0, preemptions=0, now=0.0, max_backoff_s=4)
    assert isinstance(capped.next, Requeue) and capped.next.not_before == 4.0


def test_a_success_says_how_many_tasks_ran_when_the_attempt_started_fewer_than_the_job_has() -> (
    None
):
    """A gang minimum below the task count started 4 of 8 tasks; all 4 exited 0 and the job
    was reported `all tasks exited with code 0`, not a word about the 4 that never ran."""
    j = job("j").task(8, cpu=4).min_available(1).build()
    short = after_attempt(j, None, "", failures=0, preemptions=0, now=0.0, max_backoff_s=60,
                          started=4)  # fmt: skip
    text = "all 4 tasks that started (of 8) exited with code 0"
    assert short == AttemptEnd(Finish(JobState.SUCCEEDED, text), 0, 0, succeeded=True)
    whole = after_attempt(j, None, "", failures=0, preemptions=0, now=0.0, max_backoff_s=60,
                          started=8)  # fmt: skip
    assert whole.next == Finish(JobState.SUCCEEDED, "all tasks exited with code 0")
    always = replace(j, restart_policy=RestartPolicy.ALWAYS, backoff_s=10.0)
    again = after_attempt(always, None, "", failures=0, preemptions=0, now=0.0,
                          max_backoff_s=60, started=4)  # fmt: skip
    assert isinstance(again.next, Requeue)
    assert again.next.message == (
        "all 4 tasks that started (of 8) exited; restart policy is always: restarting in 10s"
    )


def _attempt_end(
    j: Job, ran_s: float, quick_exits: int, *, max_backoff_s: float = 300, stop: Stop | None = None
) -> AttemptEnd:
    return after_attempt(
        j,
        stop,
        "x" if stop else "",
        failures=0,
        preemptions=0,
        now=1000.0,
        max_backoff_s=max_backoff_s,
        ran_s=ran_s,
        quick_exits=quick_exits,
    )


def test_quick_clean_exits_under_always_double_the_wait_as_a_crash_loop_does() -> None:
    """`sh -c "echo tick"` under `always` with `backoff: 0s` restarted at once, 1,478 attempts
    in a minute; with the default 10 s, 8,640 a day for ever. Quick exits in a row now double
    the wait from max(backoff, 1 s) up to the driver's cap, as Kubernetes' CrashLoopBackOff."""
    spin = replace(job("j").build(), restart_policy=RestartPolicy.ALWAYS, backoff_s=0.0)
    waits, quick = [], 0
    for _ in range(11):
        end = _attempt_end(spin, 0.01, quick)
        assert isinstance(end.next, Requeue) and end.failures == 0
        waits.append(end.next.wait_s)
        quick = end.quick_exits
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert quick == 11
    last = _attempt_end(spin, 0.01, 2)
    text = (
        "all tasks exited; restart policy is always: restarting in 4s (3 runs in a row shorter "
        "than 600s: the wait doubles until a run lasts that long)"
    )
    assert last == AttemptEnd(Requeue("restarting", text, 1004.0, 4.0), 0, 0, quick_exits=3)
    ten = replace(spin, backoff_s=10.0)
    assert [_attempt_end(ten, 5.0, n).next.wait_s for n in (0, 1, 2)] == [10, 20, 40]  # type: ignore[union-attr]


def test_a_long_run_ends_a_run_of_quick_exits_whatever_its_end() -> None:
    j = replace(job("j").build(), restart_policy=RestartPolicy.ALWAYS, backoff_s=10.0)
    long = _attempt_end(j, LONG_RUN_S, 7)
    assert isinstance(long.next, Requeue) and long.next.wait_s == 10.0
    assert long.quick_exits == 0
    failed = _attempt_end(j, LONG_RUN_S, 7, stop=Stop.FAILED)
    assert failed.quick_exits == 0 and failed.failures == 1
    # A short failure keeps the run as it was: failures have their own doubling.
    short = _attempt_end(j, 1.0, 7, stop=Stop.FAILED)
    assert short.quick_exits == 7 and isinstance(short.next, Requeue)
    assert short.next.wait_s == 10.0

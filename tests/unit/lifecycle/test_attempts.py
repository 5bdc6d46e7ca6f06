"""The attempt-end rule: stops that are final whatever the restart policy says, and the wait
before a restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aisched.lifecycle.attempts import AttemptEnd, Finish, Requeue, Stop, after_attempt
from aisched.model.job import RestartPolicy
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

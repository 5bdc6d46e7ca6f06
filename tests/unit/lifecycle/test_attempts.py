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

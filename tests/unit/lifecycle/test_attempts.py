"""The attempt-end rule for stops that are final whatever the restart policy says."""

from __future__ import annotations

import pytest

from aisched.lifecycle.attempts import AttemptEnd, Finish, Requeue, Stop, after_attempt
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

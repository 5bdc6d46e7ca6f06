"""A stop under way when the scheduler stopped is finished after the restart; its message is
not stored, so the job's end says why from what is: a time limit's or the running logs' bound's
words, not an empty reason."""

from __future__ import annotations

import pytest

from aisched.lifecycle.attempts import Stop
from aisched.model.states import JobState
from aisched.service.live import LiveJob
from aisched.service.recovery import _stop_message_after_restart
from aisched.testing.builders import job


@pytest.mark.parametrize(
    ("stop", "says"),
    [
        (Stop.TIMEOUT, "time limit"),
        (Stop.LOGS, "alice's running jobs' logs were over limits.user_max_running_log_bytes"),
        (Stop.REQUEUE, "a requeue cut short by a scheduler restart"),
    ],
)
def test_a_stop_finished_after_a_restart_says_why(stop: Stop, says: str) -> None:
    j = job("7").user("alice").time_limit(60).build()
    lj = LiveJob(j, JobState.RUNNING, 0.0, "", stopping=stop)
    assert says in _stop_message_after_restart(lj)

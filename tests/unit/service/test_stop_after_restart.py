"""A stop under way when the scheduler stopped is finished after the restart; its message is
not stored, so the job's end says why from what is: a time limit's or the running logs' bound's
words, or the event written as the stop began (a preemption's reason, a cancel, the task that
failed), not an empty reason."""

from __future__ import annotations

import pytest

from aisched.lifecycle.attempts import Stop
from aisched.model.states import JobState
from aisched.service.live import LiveJob
from aisched.service.recovery import _stop_message_after_restart
from aisched.testing.builders import job

EVENTS = [
    ("started", "attempt 1 started"),
    ("task-exited", "task w-0: exited with code 3"),  # an earlier attempt's
    ("started", "attempt 2 started"),
    ("task-exited", "task w-1 exited with code 0"),
    ("task-exited", "task w-0: killed by SIGKILL"),  # began the stop
    ("task-exited", "task w-2: exited with code 143"),  # stopped with the rest
    ("preempting", "preempted for 12: stopping its tasks"),
    ("cancelling", "cancel requested: stopping its tasks"),
]


@pytest.mark.parametrize(
    ("stop", "events", "says"),
    [
        (Stop.TIMEOUT, [], "exceeded its time limit of 60s"),
        (
            Stop.LOGS,
            [],
            "stopped: alice's running jobs' logs were over limits.user_max_running_log_bytes; "
            "not retried",
        ),
        (Stop.REQUEUE, [], "a requeue cut short by a scheduler restart"),
        (Stop.PREEMPT, EVENTS, "preempted for 12"),
        (Stop.PREEMPT, [], "preempted"),
        (Stop.CANCEL, EVENTS, "cancelled"),
        (Stop.CANCEL, [("cancelling", "scaled down: load 0.2")], "scaled down: load 0.2"),
        (Stop.FAILED, EVENTS, "task w-0 killed by SIGKILL"),
        (Stop.UNRUNNABLE, EVENTS[:5], "task w-0 killed by SIGKILL"),
    ],
)
def test_a_stop_finished_after_a_restart_says_why(
    stop: Stop, events: list[tuple[str, str]], says: str
) -> None:
    j = job("7").user("alice").time_limit(60).build()
    lj = LiveJob(j, JobState.RUNNING, 0.0, "", stopping=stop)
    rows = [{"kind": kind, "message": message} for kind, message in events]
    assert _stop_message_after_restart(lj, rows) == says

"""The job state machine and its allowed transitions.

PENDING → RUNNING → SUCCEEDED | FAILED; RUNNING → PREEMPTED → PENDING (requeued);
RUNNING → PENDING (failed attempt, retried per restart policy); any live state → CANCELLED.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.PREEMPTED,
            JobState.PENDING,
            JobState.CANCELLED,
        }
    ),
    JobState.PREEMPTED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: str, src: JobState, dst: JobState) -> None:
        super().__init__(f"job {job_id}: cannot go from {src.value} to {dst.value}")
        self.src, self.dst = src, dst


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]


def check_transition(job_id: str, src: JobState, dst: JobState) -> JobState:
    """Return `dst` if the move is allowed, else raise InvalidTransition."""
    if not can_transition(src, dst):
        raise InvalidTransition(job_id, src, dst)
    return dst

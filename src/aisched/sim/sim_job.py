"""One job's mutable state during a simulation run (`Job` and `TraceJob` stay frozen): its
attempts, the work its checkpoints kept, its counters and its record at the end. Its state
changes only through the lifecycle's transition table (`SimJob.move`)."""

from __future__ import annotations

from dataclasses import dataclass

from aisched.core.decisions import TaskBinding
from aisched.core.snapshot import PendingJob
from aisched.lifecycle.attempts import Stop
from aisched.lifecycle.states import move
from aisched.lifecycle.work import time_left_s
from aisched.model.states import JobState
from aisched.sim.results import Estimate, JobRecord, SimulationError
from aisched.sim.traces import TraceJob


@dataclass(frozen=True, slots=True)
class Stopping:
    """Why a running job's tasks were sent SIGTERM (preempted, shrunk to `keep`, requeued to
    grow), for the lifecycle's `after_attempt` once they have exited."""

    stop: Stop
    message: str
    keep: tuple[TaskBinding, ...] | None = None


class SimJob:
    """Mutable per-job state of a run; `Job` and `TraceJob` stay frozen."""

    __slots__ = (
        "tj",
        "job",
        "duration_s",
        "ckpt_s",
        "estimate_s",
        "upper_s",
        "saved_s",
        "attained_gpu_s",
        "preemptions",
        "shrinks",
        "grows",
        "restarts",
        "attempt",
        "first_start_s",
        "finish_s",
        "rejected",
        "tasks",
        "milli",
        "gpus",
        "start_s",
        "restore_s",
        "expected_end_s",
        "end_s",
        "first_estimate",
        "eta_s",
        "speed",
        "state",
        "failures",
        "quick_exits",
        "failing",
        "failed",
        "grew_from",
        "cancelled",
    )

    def __init__(self, tj: TraceJob, ckpt_s: float) -> None:
        self.tj = tj
        self.job = tj.job
        self.duration_s = tj.duration_s
        self.ckpt_s = ckpt_s
        self.estimate_s: float | None = None
        self.upper_s: float | None = None
        self.saved_s = 0.0  # work kept by checkpoints, in seconds of the job's runtime
        self.attained_gpu_s = 0.0  # GPU-seconds of finished attempts
        self.preemptions = 0
        self.shrinks = 0
        self.grows = 0
        self.restarts = 0
        self.attempt = 0
        self.first_start_s: float | None = None
        self.finish_s: float | None = None
        self.rejected: str | None = None
        self.tasks: tuple[TaskBinding, ...] = ()
        self.milli = 0  # milli-GPUs held by the current attempt
        self.gpus = 0.0  # the same in GPUs
        self.start_s = 0.0
        self.restore_s = 0.0  # restore time at the head of the current attempt
        self.expected_end_s: float | None = None
        self.end_s = 0.0  # when the current attempt ends by itself (its planned end)
        self.first_estimate: Estimate | None = None
        self.eta_s: float | None = None
        # Work done per second by the current attempt: the GPU model's speed, times the share
        # of its tasks an elastic job runs with.
        self.speed = 1.0
        self.state: JobState | None = None  # None until it arrives
        self.failures = 0
        self.quick_exits = 0  # quick clean exits under `always` in a row (lifecycle.attempts)
        self.failing = False  # the current attempt's planned end is a failure
        self.failed: str | None = None
        self.grew_from: int | None = None  # tasks held when last grown (see lifecycle.elastic)
        self.cancelled: str | None = None

    def move(self, dst: JobState) -> None:
        """Change state through the lifecycle's table (an arrival enters PENDING)."""
        if self.state is None:
            if dst != JobState.PENDING:
                raise SimulationError(f"job {self.job.id}: {dst.value} before it arrived")
            self.state = dst
            return
        self.state = move(self.job.id, self.state, dst)

    @property
    def interrupted(self) -> bool:
        """Stopped before (preempted, shrunk, grown or failed): its next attempt restores
        first."""
        return bool(self.preemptions or self.shrinks or self.grows or self.failures)

    def pending(self, restart_cost_s: float) -> PendingJob:
        restore = restart_cost_s if self.interrupted else 0.0
        saved = self.saved_s
        return PendingJob(
            self.job,
            self.attained_gpu_s,
            self.preemptions,
            time_left_s(self.estimate_s, saved, restore),
            time_left_s(self.upper_s, saved, restore),
        )

    def record(self, end_s: float) -> JobRecord:
        gpu_s = self.attained_gpu_s
        if self.tasks:  # still running at the end of the run
            gpu_s += self.gpus * (end_s - self.start_s)
        return JobRecord(
            job_id=self.job.id,
            queue=self.job.queue,
            user=self.job.user,
            priority=self.job.priority,
            submit_s=self.job.submit_time_s,
            duration_s=self.duration_s,
            gpus=self.job.num_gpus,
            first_start_s=self.first_start_s,
            finish_s=self.finish_s,
            preemptions=self.preemptions,
            restarts=self.restarts,
            gpu_s=gpu_s,
            rejected=self.rejected,
            estimate_s=None if self.first_estimate is None else self.first_estimate[0],
            estimate_upper_s=None if self.first_estimate is None else self.first_estimate[1],
            eta_s=self.eta_s,
            shrinks=self.shrinks,
            grows=self.grows,
            failures=self.failures,
            failed=self.failed,
            cancelled=self.cancelled,
        )

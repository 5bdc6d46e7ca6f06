"""Victim selectors for preempt and reclaim. Lower keys are evicted first."""

from __future__ import annotations

from dataclasses import dataclass

from aisched.core.snapshot import RunningJob


@dataclass(frozen=True, slots=True)
class LowestPriority:
    name: str = "lowest-priority"

    def key(self, running: RunningJob, now: float) -> float:
        return float(running.job.priority)


@dataclass(frozen=True, slots=True)
class LeastWorkLost:
    """GPU-seconds that would be lost: the time since the last checkpoint (or start), times
    the job's GPUs. Checkpoint-aware preemption evicts the job that loses least."""

    name: str = "least-work-lost"

    def key(self, running: RunningJob, now: float) -> float:
        since = (
            running.last_checkpoint_s
            if running.last_checkpoint_s is not None
            else (running.started_s)
        )
        return max(now - since, 0.0) * max(running.job.num_gpus, 1.0)


@dataclass(frozen=True, slots=True)
class Newest:
    name: str = "newest"

    def key(self, running: RunningJob, now: float) -> float:
        return -running.started_s

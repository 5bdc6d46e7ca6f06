"""Job-order plugins. Lower keys run first.

`qssf` is Helios' quasi-shortest-service-first: the predicted GPU-time (estimated runtime ×
GPUs) of a job, shortest first; with a remaining-time estimate (as the simulator's oracle gives
after a preemption) the same key is shortest-remaining-service first. Estimates arrive attached
to the pending job (`PendingJob.estimate_s`); for a running job, preemption passes the time to
its expected end.

`las` is Tiresias' discretised least-attained-service: a job's queue is the number of thresholds
its attained GPU-service has passed, so jobs move to a lower-priority queue as they consume
service and long jobs cannot block short ones; inside a queue the next plugin (fifo) decides.
`drf` is not a static key: its presence makes allocation interleave users of a queue by dominant
resource share (see the allocate action); its key here is constant.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from aisched.model.job import Job

INFINITE = float("inf")


@dataclass(frozen=True, slots=True)
class Fifo:
    name: str = "fifo"

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        return job.submit_time_s


@dataclass(frozen=True, slots=True)
class Priority:
    name: str = "priority"

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        return -float(job.priority)


@dataclass(frozen=True, slots=True)
class Las:
    """Discretised LAS. `thresholds_gpu_s` are the attained GPU-seconds at which a job drops
    to the next queue (Tiresias used two queues; the default here has three)."""

    thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0)
    name: str = "las"

    def __post_init__(self) -> None:
        if list(self.thresholds_gpu_s) != sorted(self.thresholds_gpu_s):
            raise ValueError("las: thresholds_gpu_s must be increasing")

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        return float(bisect.bisect_right(self.thresholds_gpu_s, attained_gpu_s))

    def next_change_gpu_s(self, attained_gpu_s: float) -> float | None:
        """The attained GPU-seconds at which the key next changes (the next threshold), or
        None in the last queue: a running job is demoted when it gets there."""
        i = bisect.bisect_right(self.thresholds_gpu_s, attained_gpu_s)
        return self.thresholds_gpu_s[i] if i < len(self.thresholds_gpu_s) else None


@dataclass(frozen=True, slots=True)
class ShortestFirst:
    """Shortest estimated job first. `by` is `time` (estimated runtime) or `gpu_time`
    (runtime × GPUs). Jobs without an estimate go last."""

    by: str = "time"
    name: str = "sjf"

    def __post_init__(self) -> None:
        if self.by not in ("time", "gpu_time"):
            raise ValueError(f"sjf: by must be 'time' or 'gpu_time', not {self.by!r}")

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        est = estimate_s if estimate_s is not None else job.estimate_s
        if est is None:
            return INFINITE
        return est * max(job.num_gpus, 1.0) if self.by == "gpu_time" else est


@dataclass(frozen=True, slots=True)
class PredictedGpuTime:
    """Predicted GPU-time first (Helios' QSSF). Jobs without an estimate go last.

    `aging` (GPU-seconds per second, default 0: none) adds `aging × submit time` to the key.
    Within one cycle that is the same order as subtracting `aging × time waited`, since every
    key shifts by the same `aging × now`, but the key stays fixed while the job waits (so it is
    memoised like every other). Two jobs then swap places only when their predicted GPU-times
    differ by more than `aging` times the gap between their submissions: on a workload whose
    GPU-times are much alike the order is nearly fifo, and a long job is passed only by jobs
    shorter than it by the age it has gained, so it cannot wait for ever."""

    aging: float = 0.0
    name: str = "qssf"

    def __post_init__(self) -> None:
        if not 0.0 <= self.aging < INFINITE:
            raise ValueError(f"qssf: aging must be 0 or more, got {self.aging}")

    def size_key(self, job: Job, estimate_s: float | None) -> float:
        """The predicted GPU-time alone, without the aging term."""
        est = estimate_s if estimate_s is not None else job.estimate_s
        if est is None:
            return INFINITE
        return est * max(job.num_gpus, 1.0)

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        size = self.size_key(job, estimate_s)
        if self.aging and size < INFINITE:
            return size + self.aging * job.submit_time_s
        return size


@dataclass(frozen=True, slots=True)
class DominantResourceFairness:
    name: str = "drf"

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        return 0.0


def thresholds(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)

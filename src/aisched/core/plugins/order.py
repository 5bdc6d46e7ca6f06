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
import math
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
        # Each is compared with a job's attained GPU-seconds in every cycle: anything but a
        # number there (a string, null) failed every cycle, and NaN compares as nothing.
        for t in self.thresholds_gpu_s:
            if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < INFINITE:
                raise ValueError(
                    f"las: thresholds_gpu_s: expected numbers of GPU-seconds, 0 or more, got {t!r}"
                )
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


_BAND = float(2**40)  # a band's width in qssf's `bucket` keys: past any submit time in s


@dataclass(frozen=True, slots=True)
class PredictedGpuTime:
    """Predicted GPU-time first (Helios' QSSF). Jobs without an estimate go last.

    Two forms of aging trade the average JCT against the tail; each adds a multiple of the
    submit time to the key, so within one cycle the order is the same as taking the time waited
    off every key (every key shifts by the same amount at `now`), yet a waiting job's key stays
    fixed (it is memoised like every other):

    - `aging` (GPU-seconds per second waited): the key is `GPU-time + aging × submit`. A job is
      passed by a younger one only if that one's predicted GPU-time is smaller by more than
      `aging` × the gap between their submissions: an absolute allowance, which holds back a
      job eight GPUs wide eight times as long as a one-GPU job of the same runtime.
    - `halve_after_s`: the key is `log2(GPU-time) + submit / halve_after_s`, so a job's
      predicted GPU-time counts half for every `halve_after_s` it has waited. A job is passed by
      a younger one only if that one is smaller by a factor 2^(gap / halve_after_s): a relative
      allowance, the same for every size, as the predictor's errors are (a factor, not an
      amount). On a workload whose GPU-times are alike the order is close to fifo; a long job
      is passed by a stream of jobs k times shorter for at most log2(k) × `halve_after_s`.

    - `bucket` (a factor above 1): jobs whose predicted GPU-times fall in the same power of
      `bucket` go in submission order; a job passes an older one only from a lower band, so a
      burst of alike jobs is not passed by everything a little shorter that arrives after it.
      A shorter tail for a worse average: on Philly the order among alike estimates is where
      much of qssf's average comes from (docs/policies.md, "Bands").

    All at 0 is pure shortest-predicted-first; at most one may be set. Preemption compares
    sizes (`key_of_size`) whatever the form: the bands and the age are no part of the gain."""

    aging: float = 0.0
    halve_after_s: float = 0.0
    bucket: float = 0.0
    name: str = "qssf"

    def __post_init__(self) -> None:
        if not 0.0 <= self.aging < INFINITE:
            raise ValueError(f"qssf: aging must be 0 or more, got {self.aging}")
        if not 0.0 <= self.halve_after_s < INFINITE:
            raise ValueError(f"qssf: halve_after_s must be 0 or more, got {self.halve_after_s}")
        if self.bucket and not 1.0 < self.bucket < INFINITE:
            raise ValueError(f"qssf: bucket must be 0 (off) or above 1, got {self.bucket}")
        if sum(1 for v in (self.aging, self.halve_after_s, self.bucket) if v) > 1:
            raise ValueError("qssf: set at most one of aging, halve_after_s and bucket")

    def size_key(self, job: Job, estimate_s: float | None) -> float:
        """The predicted GPU-time alone, without the aging term."""
        est = estimate_s if estimate_s is not None else job.estimate_s
        if est is None:
            return INFINITE
        return est * max(job.num_gpus, 1.0)

    def key_of_size(self, size_gpu_s: float, job: Job) -> float:
        """The key `job` would have with a predicted GPU-time of `size_gpu_s`: preemption
        compares sizes (a margin, the cost of stopping a job) before the aging applies."""
        if not size_gpu_s < INFINITE:
            return size_gpu_s
        if self.halve_after_s:
            # GPU-times under a second count as one: a log must not run off to minus infinity.
            return math.log2(max(size_gpu_s, 1.0)) + job.submit_time_s / self.halve_after_s
        if self.aging:
            return size_gpu_s + self.aging * job.submit_time_s
        return size_gpu_s

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        size = self.size_key(job, estimate_s)
        if self.bucket and size < INFINITE:
            # The band, then the submit time: exact in a float (bands < 2^12, submit < 2^40 s).
            band = math.floor(math.log(max(size, 1.0), self.bucket))
            return band * _BAND + job.submit_time_s
        return self.key_of_size(size, job)


@dataclass(frozen=True, slots=True)
class DominantResourceFairness:
    name: str = "drf"

    def key(self, job: Job, attained_gpu_s: float, estimate_s: float | None) -> float:
        return 0.0


# The orders whose key reads no runtime estimate (attached or the job's own).
BLIND_TO_ESTIMATES: tuple[type, ...] = (Fifo, Priority, Las, DominantResourceFairness)


def thresholds(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)

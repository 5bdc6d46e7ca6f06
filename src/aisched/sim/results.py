"""What a simulation is given and gives back: its config, the estimator protocol, the job
records, the decision log's shape and the result. Plain values; the engine fills them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from aisched.model.gpu_speed import GpuSpeeds
from aisched.model.job import Job
from aisched.model.queue import DEFAULT_QUEUE, Queue, QueueTree
from aisched.sim.traces import TraceJob

# (estimate_s, estimate_upper_s) of a job's whole runtime, for a job about to be pending.
Estimate = tuple[float | None, float | None]


class Estimator(Protocol):
    """Runtime estimates for the simulated scheduler. `estimate` is called whenever a job
    becomes pending (arrival, requeue) with the current time; `upper_at_start` when a job is
    about to start an attempt; `observe` when a job finishes, with its true runtime and the
    finish time. The engine calls them in time order."""

    def estimate(self, tj: TraceJob, now_s: float) -> Estimate: ...

    def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
        """The upper estimate of the job's whole runtime to run this attempt with, asked
        again now; None keeps the one it waited with."""
        ...

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None: ...


class _Plain:
    """A bare function `TraceJob -> Estimate` as an estimator that learns nothing."""

    def __init__(self, fn: Callable[[TraceJob], Estimate]) -> None:
        self._fn = fn

    def estimate(self, tj: TraceJob, now_s: float) -> Estimate:
        return self._fn(tj)

    def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
        return None

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
        return None


# (time_s, kind, job_id, detail). Kinds: "bind" (detail: the node of each task, in task order),
# "preempt" (detail: (for_job, reason)), "shrink" (detail: (for_job, reason, then the node of
# each task it keeps)), "grow" (detail: (how many tasks it had,)), "reserve" (detail: the
# nodes), "finish" (detail: ()),
# "reject" (detail: (reason,)), for a job that can never fit the cluster; for played failures
# (`TraceJob.fail_after_s`): "retry" (detail: (message,)), a failed attempt retried after its
# backoff, and "fail" (detail: (why,)), a job that failed for good; for pipelines
# (`Job.depends_on`): "cancel" (detail: (why,)), a job whose dependencies can never be met;
# "service" (detail: its replicas' ids), a service started with its minimum of replicas;
# "replace" (detail: (failed replica, new replica, the crash loop in words)), a replica that
# failed for good replaced, the new one pending once the crash loop's wait is over.
LogEntry = tuple[float, str, str, tuple[str, ...]]

# (time_s, allocated GPUs, running jobs, pending jobs), one sample at each instant where any of
# them changed; each value holds until the next sample.
Sample = tuple[float, float, int, int]

# (time_s, billed nodes, GPUs on present nodes, cost per hour of the billed nodes), one sample at
# each instant where any of them changed. Billed: present, or asked for and still provisioning.
NodeSample = tuple[float, int, float, float]


class SimulationError(RuntimeError):
    """The run cannot go on: a decision that cannot be applied, or a broken invariant."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How a run treats time and interruptions.

    `checkpoint_interval_s` applies to jobs without their own `checkpoint_interval_s`; `inf`
    means no checkpoints (a preempted job starts over). `cycle_interval_s` 0 runs a cycle at
    every instant where something changed; a positive value runs at most one cycle per period,
    on the period's boundary, batching the events in between (a scheduler's fixed period).
    `max_time_s` stops the run at that virtual time; what is unfinished stays unfinished.
    `gpu_speeds`, when given, makes runtimes depend on the GPU model: a trace's duration is
    the runtime at speed 1.0, and an attempt runs at the speed of the slowest GPU model among
    its tasks' nodes (CPU-only work is unaffected). `elastic_grow_after_s`: how long an elastic
    job runs short of tasks before it may be grown (the live service's `elastic_grow_after`).
    """

    checkpoint_interval_s: float = 3600.0
    restart_cost_s: float = 60.0
    cycle_interval_s: float = 0.0
    validate: bool = False
    max_time_s: float | None = None
    gpu_speeds: GpuSpeeds | None = None
    elastic_grow_after_s: float = 60.0
    # The longest a failed job waits before its retry (the live service's `max_backoff_s`).
    max_backoff_s: float = 300.0
    # How long a stopped job's tasks (preempted, shrunk, requeued to grow) take to exit after
    # SIGTERM (its grace period caps it: then it is killed); it holds its resources until
    # then, and the job it makes room for waits (`lifecycle.preemption`). 0: they stop at the
    # instant they are stopped, after the cycle that stopped them (the service sees an exit a
    # step after its signal).
    victim_stop_s: float = 0.0
    # The job waiting for victims gives up after their grace plus this (the live service's).
    victim_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.checkpoint_interval_s > 0:
            raise ValueError(
                f"checkpoint_interval_s must be positive, got {self.checkpoint_interval_s}"
            )
        if not 0 <= self.restart_cost_s < math.inf:
            raise ValueError(f"restart_cost_s must be finite and >= 0, got {self.restart_cost_s}")
        if not 0 <= self.cycle_interval_s < math.inf:
            raise ValueError(
                f"cycle_interval_s must be finite and >= 0, got {self.cycle_interval_s}"
            )
        if self.max_time_s is not None and not self.max_time_s >= 0:  # NaN too
            raise ValueError(
                f"max_time_s: {self.max_time_s:g} is not a virtual time (seconds, at least 0)"
            )
        for name in ("victim_stop_s", "victim_wait_s"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not 0 <= self.elastic_grow_after_s < math.inf:
            raise ValueError(
                f"elastic_grow_after_s must be finite and >= 0, got {self.elastic_grow_after_s}"
            )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job. Times are virtual seconds; None where it never happened.

    `gpus` is the job's GPU demand in whole-GPU equivalents (shares as fractions). `gpu_s` is the
    GPU-seconds it received over all attempts, up to the end of the run for unfinished work.
    `preemptions` counts the times it was stopped, `shrinks` the times it was restarted with
    fewer tasks and `grows` the times it was requeued to get more (an elastic job), `restarts`
    the times it started again after any of these.
    `estimate_s` / `estimate_upper_s` are the runtime estimate it had when its first attempt
    started (when it arrived, for a job that never started);
    `eta_s` is the start time its first cycle estimated, when it had to wait (None otherwise).
    """

    job_id: str
    queue: str
    user: str
    priority: int
    submit_s: float
    duration_s: float
    gpus: float
    first_start_s: float | None
    finish_s: float | None
    preemptions: int
    restarts: int
    gpu_s: float
    rejected: str | None = None
    estimate_s: float | None = None
    estimate_upper_s: float | None = None
    eta_s: float | None = None
    shrinks: int = 0
    grows: int = 0
    # Played failures: how many attempts failed, and why the job failed for good (None when
    # it did not; its `finish_s` is then None too).
    failures: int = 0
    failed: str | None = None
    # A pipeline's job whose dependencies can never be met: why it was cancelled.
    cancelled: str | None = None


@dataclass(frozen=True, slots=True)
class SimResult:
    """A run's outcome: one record per trace job (trace order), the decision log, the timeline.

    `capacity_gpus` counts the healthy GPUs (with autoscaling pools: every pool at its
    maximum). `end_s` is the virtual time the run stopped. `nodes_timeline` samples the billed
    nodes, present GPUs and cost rate; `priced` says whether any node has a cost.
    `wall_s` and `cycle_wall_s` (time inside `run_cycle`) are the only figures that differ
    between identical runs.
    """

    trace_name: str
    policy_name: str
    config: SimConfig
    capacity_gpus: float
    jobs: tuple[JobRecord, ...]
    log: tuple[LogEntry, ...]
    timeline: tuple[Sample, ...]
    end_s: float
    cycles: int
    wall_s: float
    cycle_wall_s: float
    stats: Mapping[str, float] = field(default_factory=dict)
    nodes_timeline: tuple[NodeSample, ...] = ()
    priced: bool = False


def own_estimate(tj: TraceJob) -> Estimate:
    """The default estimate: what the job itself declares (a user's guess), nothing more."""
    return tj.job.estimate_s, None


def queues_for(jobs: Iterable[Job]) -> QueueTree:
    """A flat queue tree with one equal-weight queue for every queue name the jobs use."""
    names = sorted({j.queue for j in jobs} | {DEFAULT_QUEUE})
    return QueueTree(tuple(Queue(n) for n in names))


def as_estimator(e: Estimator | Callable[[TraceJob], Estimate] | None) -> Estimator:
    if e is None:
        return _Plain(own_estimate)
    if isinstance(e, _Plain) or (hasattr(e, "estimate") and hasattr(e, "observe")):
        return cast(Estimator, e)
    return _Plain(e)

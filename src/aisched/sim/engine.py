"""The discrete-event simulator: replays a trace through the real scheduling cycle in virtual time.

One event heap and a virtual clock, in the shape of SimPy's core: events are popped in
`(time, kind, sequence)` order, so at one instant every completion is handled before every
arrival, and both before the scheduling cycle of that instant; equal kinds keep the order they
were scheduled in. Nothing here reads the wall clock except to report how long a run took, and
the same trace, cluster, policy and config always give the identical decision log.

What the engine keeps, and its invariants:

- `free` is updated incrementally (`take` on bind, `give` on finish and preemption) and is never
  rebuilt from the running set; validate mode checks it against the running tasks after every
  cycle (`validate_free`).
- A job is in at most one of `pending` and `running`. A completion event carries the attempt
  number it was scheduled for; a preempted attempt's completion is ignored when it pops.
- `PendingJob.estimate_s` comes from the job's own estimate (or an `Estimator`), never from the
  trace's true duration (an oracle estimator, for comparison, is the one exception): the
  scheduler must not see the future. An estimator gives the job's whole runtime; the engine
  hands the core the time the next attempt will take, `restart_cost_s` of restore (after a
  preemption) plus the estimate less the work kept by checkpoints (or, once the kept work
  exceeds the estimate, as much again as was kept), and a running attempt's expected end is its
  start plus that. An estimator learns only at finishes (`observe`, with
  the finish time), and is asked (`estimate`) at arrivals and requeues, at the current time.

Work and checkpoints: an attempt checkpoints every checkpoint interval after it starts. An
attempt after a preemption first spends `restart_cost_s` restoring (GPU time that makes no
progress), then continues from the saved work. A preempted attempt keeps only the work up to its
last checkpoint. GPU-seconds received (attained service) count every second on the GPUs,
restore time and lost work included. `RunningJob.last_checkpoint_s` is the attempt's latest
checkpoint, its start until the first one (the convention of the core's own binds).

When cycles run: only after something changed (an arrival or a finish) and only while some job
is pending, since every decision serves a pending job. A policy whose choices drift with time
alone (LAS) is therefore re-evaluated at the next event, not in between. Applying a cycle's own
decisions does not call for another cycle. A job whose first cycle says it can never fit the
cluster (`NEVER_FITS`) is rejected and leaves the pending set; it is logged and counted.

Elastic jobs: a `Shrink` is applied like a preemption that restarts at once: the attempt keeps
the work up to its last checkpoint, gives up the tasks it does not keep, and a new attempt starts
on the kept tasks at the same instant, paying `restart_cost_s` of restore first. The trace's
duration is the runtime with every task; with fewer, an elastic job runs proportionally slower
(linear scaling). Growth follows the live service's rule: an elastic job running short of
tasks for `elastic_grow_after_s`, when nothing is pending and idle capacity would take at
least one more of its tasks (`core.elastic.extra_tasks_fit`), is requeued from its checkpoint
(a "grow" in the log; no preemption counted) and the next cycle places it with as many tasks
as fit. It is checked when that time comes (a `_GROW` event) and again whenever a job finishes
with nothing pending.

Autoscaling node pools (`Cluster.node_pools`): after each cycle the jobs it left waiting for
capacity go to the core's `plan_scale_up`; the nodes it asks for are billed from then on and
join `provisioning_delay_s` later (a `_JOIN` event, before arrivals at its instant, so the cycle
of that instant sees them). A pool node with nothing running gets an `_IDLE` event at the end
of its idle time, and `plan_scale_down` says whether it goes (never below the pool's minimum);
idle checks come after the cycle of their instant, so work arriving then is placed first.
Membership changes are applied lazily: the node arrays are rebuilt, and every running binding
re-taken, before the next cycle (what the live service does when a cluster executor's nodes
come and go). A job that does not fit the present nodes but would fit the cluster with every
pool at its maximum is not rejected: it waits for nodes. The billed node count, present GPUs
and cost per hour are sampled at every change (`SimResult.nodes_timeline`), for node-hours and
cost; a fixed cluster has one sample. Events left after the last job ended (joins, idle checks)
are not played, so they do not stretch the run.

The engine never changes the snapshot it hands to `run_cycle` while the cycle runs, and never
applies a decision it cannot honour: a `Bind` of a job that is not pending, or whose victims are
still running, or a `Preempt` of a job that is not running, or a `Shrink` of one that is not
running or to tasks it does not hold, raises `SimulationError`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np

from aisched.core.cluster_autoscale import (
    IdleNode,
    NodeFree,
    PoolState,
    plan_scale_down,
    plan_scale_up,
)
from aisched.core.cycle import InvariantViolation, never_runs, run_cycle
from aisched.core.decisions import Bind, Preempt, Reserve, Shrink, TaskBinding
from aisched.core.dependencies import DependencyVerdict, check_dependencies
from aisched.core.policy import Policy
from aisched.core.snapshot import (
    FreeState,
    PendingJob,
    RunningJob,
    Snapshot,
    build_arrays,
)
from aisched.core.status import JobStatus, StatusCode
from aisched.lifecycle.attempts import AttemptEnd, Finish, Requeue, RestartOn, Stop, after_attempt
from aisched.lifecycle.elastic import grow_at, short_of_tasks, tasks_to_grow
from aisched.lifecycle.holdings import HoldingError, Holdings
from aisched.lifecycle.states import move
from aisched.lifecycle.work import (
    attempt_runtime_s,
    elastic_speed,
    fails,
    kept_work_s,
    planned_end_s,
    time_left_s,
)
from aisched.model.cluster import Cluster, Node, NodePool
from aisched.model.gpu_speed import GpuSpeeds
from aisched.model.job import Job
from aisched.model.queue import DEFAULT_QUEUE, Queue, QueueTree
from aisched.model.resources import GPU_MILLI_WHOLE
from aisched.model.states import JobState
from aisched.sim.traces import Trace, TraceJob

# Event kinds, in the order they are handled at one instant: capacity is released (and nodes
# join) before new work is seen, the cycle sees everything that happened at its instant, and an
# idle node is only removed after that cycle had its chance to use it.
_FINISH = 0
_JOIN = 1
_ARRIVE = 2
_RETRY = 3  # a failed job's backoff is over: pending again, in that instant's cycle
_CYCLE = 4
_IDLE = 5
_GROW = 6

# Statuses of a pending job that more nodes could help: it waits for capacity, not for its
# queue's share or its dependencies.
_WANTS_NODES = frozenset(
    {
        StatusCode.WAIT_RESOURCES,
        StatusCode.RESERVED,
        StatusCode.WAIT_RESERVATION,
        StatusCode.NOT_CONSIDERED,
        StatusCode.NEVER_FITS,
    }
)

# Calls to `progress` are spaced by this many events: a call per event would cost more than the
# event itself on a large trace.
_PROGRESS_EVERY = 2000

# (estimate_s, estimate_upper_s) of a job's whole runtime, for a job about to be pending.
Estimate = tuple[float | None, float | None]


class Estimator(Protocol):
    """Runtime estimates for the simulated scheduler. `estimate` is called whenever a job
    becomes pending (arrival, requeue) with the current time; `observe` when a job finishes,
    with its true runtime and the finish time. The engine calls them in time order."""

    def estimate(self, tj: TraceJob, now_s: float) -> Estimate: ...

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None: ...


class _Plain:
    """A bare function `TraceJob -> Estimate` as an estimator that learns nothing."""

    def __init__(self, fn: Callable[[TraceJob], Estimate]) -> None:
        self._fn = fn

    def estimate(self, tj: TraceJob, now_s: float) -> Estimate:
        return self._fn(tj)

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
        return None


# (time_s, kind, job_id, detail). Kinds: "bind" (detail: the node of each task, in task order),
# "preempt" (detail: (for_job, reason)), "shrink" (detail: (for_job, reason, then the node of
# each task it keeps)), "grow" (detail: (how many tasks it had,)), "reserve" (detail: the
# nodes), "finish" (detail: ()),
# "reject" (detail: (reason,)), for a job that can never fit the cluster; for played failures
# (`TraceJob.fail_after_s`): "retry" (detail: (message,)), a failed attempt retried after its
# backoff, and "fail" (detail: (why,)), a job that failed for good; for pipelines
# (`Job.depends_on`): "cancel" (detail: (why,)), a job whose dependencies can never be met.
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
        if self.max_time_s is not None and math.isnan(self.max_time_s):
            raise ValueError("max_time_s must be a number")
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
    `estimate_s` / `estimate_upper_s` are the runtime estimate it had when it arrived;
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


class _Job:
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
        "first_estimate",
        "eta_s",
        "speed",
        "state",
        "failures",
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
        self.first_estimate: Estimate | None = None
        self.eta_s: float | None = None
        # Work done per second by the current attempt: the GPU model's speed, times the share
        # of its tasks an elastic job runs with.
        self.speed = 1.0
        self.state: JobState | None = None  # None until it arrives
        self.failures = 0
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


class _Engine:
    def __init__(
        self,
        trace: Trace,
        cluster: Cluster,
        policy: Policy,
        config: SimConfig,
        progress: Callable[[int, int], None] | None,
        estimator: Estimator,
        queues: QueueTree | None,
    ) -> None:
        self.trace = trace
        self.policy = policy
        self.config = config
        self.progress = progress
        self.estimator = estimator
        self.arrays = build_arrays(cluster)
        self.index = self.arrays.index
        # Free capacity, usage and running views: the lifecycle's ledger.
        self.held = Holdings(self.arrays)
        self.queues = queues if queues is not None else queues_for(tj.job for tj in trace.jobs)
        self.jobs: dict[str, _Job] = {}
        for tj in trace.jobs:
            if tj.job.id in self.jobs:
                raise SimulationError(f"trace {trace.name}: job id {tj.job.id} repeats")
            own = tj.job.checkpoint_interval_s
            ckpt = own if own is not None else config.checkpoint_interval_s
            self.jobs[tj.job.id] = _Job(tj, ckpt)
        # Insertion-ordered, so the pending tuple handed to a cycle is in a deterministic order
        # (arrival, then requeue order) without sorting.
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, _Job] = {}
        # Failed jobs waiting out their backoff before they are pending again.
        self.backing_off: set[str] = set()
        # Pipelines: jobs that arrived and wait for their dependencies to end, and who waits
        # on whom (re-checked exactly when a dependency ends, as the live service does).
        self.blocked: set[str] = set()
        self.dependents: dict[str, set[str]] = {}
        # Jobs pending since before their first cycle: only these can turn out never to fit
        # (the cluster does not change, and a requeued job has fitted before).
        self.fresh: list[str] = []
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.cycle_at: float | None = None
        self.dirty = False
        self.alloc_milli = 0
        self.log: list[LogEntry] = []
        self.timeline: list[Sample] = []
        self.cycles = 0
        self.cycle_wall_s = 0.0
        self.preempt_count = 0
        self.shrink_count = 0
        # Jobs shrunk in the cycle being applied: running again, yet done with what they gave.
        self.shrunk_now: set[str] = set()
        self.grow_count = 0
        self.short_elastic: set[str] = set()  # running elastic jobs with fewer tasks than asked
        self.events = 0
        total_gpus = int(self.arrays.num_gpus[self.arrays.healthy].sum())
        self.capacity_gpus = float(total_gpus)
        finite = sum(1 for tj in trace.jobs if tj.duration_s != math.inf)
        # Progress counts arrivals, finishes and rejections: 2 per finite job, 1 per endless one.
        self.progress_total = len(trace.jobs) + finite
        self.progress_done = 0
        self.arrived = 0
        self.cluster = cluster
        self._init_pools(cluster)

    @property
    def free(self) -> FreeState:
        return self.held.free

    # --- the event loop ---------------------------------------------------------------------

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        self.heap = [
            (tj.job.submit_time_s, _ARRIVE, i, tj.job.id, 0) for i, tj in enumerate(self.trace.jobs)
        ]
        heapq.heapify(self.heap)
        self.seq = len(self.heap)
        max_t = self.config.max_time_s
        now = self.heap[0][0] if self.heap else 0.0
        self._start_pools(now)
        stopped_early = False
        heap = self.heap
        pop = heapq.heappop
        total = len(self.trace.jobs)
        while heap:
            t, kind, _, job_id, attempt = heap[0]
            if max_t is not None and t > max_t:
                stopped_early = True
                break
            if kind in (_JOIN, _IDLE, _GROW) and self._all_done(total):
                break  # only node events are left: the run is over
            pop(heap)
            now = t
            if kind == _FINISH:
                st = self.running.get(job_id)
                if st is not None and st.attempt == attempt:
                    if st.failing:
                        self._fail(st, now)
                    else:
                        self._finish(st, now)
            elif kind == _RETRY:
                self._retry(self.jobs[job_id], now)
            elif kind == _ARRIVE:
                self.arrived += 1
                self._arrive(self.jobs[job_id], now)
            elif kind == _CYCLE:
                self.cycle_at = None
                if self.dirty:
                    self._cycle(now)
            elif kind == _JOIN:
                self._join(job_id, now)
            elif kind == _IDLE:
                self._idle_check(job_id, attempt, now)
            else:
                self._grow_check(job_id, attempt, now)
            self._sample(now)
            self.events += 1
            if self.progress is not None and self.events % _PROGRESS_EVERY == 0:
                self.progress(self.progress_done, self.progress_total)
        end_s = max_t if stopped_early and max_t is not None else now
        if self.progress is not None:
            self.progress(self.progress_done, self.progress_total)
        records = tuple(self.jobs[tj.job.id].record(end_s) for tj in self.trace.jobs)
        wall = time.perf_counter() - wall0
        return SimResult(
            trace_name=self.trace.name,
            policy_name=self.policy.name,
            config=self.config,
            capacity_gpus=self.capacity_gpus,
            jobs=records,
            log=tuple(self.log),
            timeline=tuple(self.timeline),
            end_s=end_s,
            cycles=self.cycles,
            wall_s=wall,
            cycle_wall_s=self.cycle_wall_s,
            stats={
                "events": float(self.events),
                "preemptions": float(self.preempt_count),
                "shrinks": float(self.shrink_count),
                "grows": float(self.grow_count),
                "nodes_added": float(self.nodes_added),
                "nodes_removed": float(self.nodes_removed),
            },
            nodes_timeline=tuple(self.node_samples),
            priced=self.priced,
        )

    def _all_done(self, total: int) -> bool:
        return (
            self.arrived == total
            and not self.pending
            and not self.running
            and not self.backing_off
            and not self.blocked
        )

    def _push(self, t: float, kind: int, job_id: str, attempt: int) -> None:
        heapq.heappush(self.heap, (t, kind, self.seq, job_id, attempt))
        self.seq += 1

    def _changed(self, now: float) -> None:
        """Something a cycle could act on changed: make sure a cycle is coming."""
        self.dirty = True
        # With nothing pending a cycle has nothing to decide (every decision serves a pending
        # job), so none is scheduled; the next arrival or requeue schedules one.
        if self.cycle_at is not None or not self.pending:
            return
        period = self.config.cycle_interval_s
        at = now if period == 0 else max(now, math.ceil(now / period) * period)
        self.cycle_at = at
        self._push(at, _CYCLE, "", 0)

    def _sample(self, now: float) -> None:
        point = (now, self.alloc_milli / GPU_MILLI_WHOLE, len(self.running), len(self.pending))
        tl = self.timeline
        if tl and tl[-1][1:] == point[1:]:
            return
        if tl and tl[-1][0] == now:
            tl[-1] = point
        else:
            tl.append(point)

    # --- state changes ----------------------------------------------------------------------

    def _arrive(self, st: _Job, now: float) -> None:
        st.estimate_s, st.upper_s = self.estimator.estimate(st.tj, now)
        st.first_estimate = (st.estimate_s, st.upper_s)
        st.move(JobState.PENDING)
        self.progress_done += 1
        if st.job.depends_on and not self._dependencies_met(st, now):
            return
        self.pending[st.job.id] = st.pending(self.config.restart_cost_s)
        self.fresh.append(st.job.id)
        self._changed(now)

    # --- pipelines --------------------------------------------------------------------------

    def _state_of(self, job_id: str) -> JobState | None:
        st = self.jobs.get(job_id)
        if st is None:
            return None
        return st.state if st.state is not None else JobState.PENDING  # not arrived yet

    def _dependencies_met(self, st: _Job, now: float) -> bool:
        """Whether a pending job with dependencies may enter the cycle; one that waits is
        blocked, one whose dependencies can never be met is cancelled."""
        names = {
            d.job_id: self.jobs[d.job_id].job.name
            for d in st.job.depends_on
            if d.job_id in self.jobs
        }
        check = check_dependencies(st.job, self._state_of, names)
        job_id = st.job.id
        if check.verdict == DependencyVerdict.MET:
            self.blocked.discard(job_id)
            return True
        if check.verdict == DependencyVerdict.WAITING:
            self.blocked.add(job_id)
            for d in st.job.depends_on:
                self.dependents.setdefault(d.job_id, set()).add(job_id)
            return False
        self.blocked.discard(job_id)
        st.move(JobState.CANCELLED)
        st.cancelled = check.reason
        self.log.append((now, "cancel", job_id, (check.reason,)))
        if st.duration_s != math.inf:
            self.progress_done += 1  # stands in for the finish it won't have
        self._ended(job_id, now)
        return False

    def _ended(self, job_id: str, now: float) -> None:
        """A job ended for good: look again at the jobs that waited on it."""
        for waiting in sorted(self.dependents.pop(job_id, ()), key=lambda i: (len(i), i)):
            st = self.jobs[waiting]
            if waiting in self.blocked and self._dependencies_met(st, now):
                self.pending[waiting] = st.pending(self.config.restart_cost_s)
                self.fresh.append(waiting)
                self._changed(now)

    def _end(
        self,
        st: _Job,
        stop: Stop | None,
        message: str,
        now: float,
        keep: tuple[TaskBinding, ...] | None = None,
    ) -> AttemptEnd:
        """The lifecycle's word on what `st` becomes after its attempt; counters applied."""
        end = after_attempt(
            st.job,
            stop,
            message,
            failures=st.failures,
            preemptions=st.preemptions,
            now=now,
            max_backoff_s=self.config.max_backoff_s,
            keep=keep,
        )
        st.failures, st.preemptions = end.failures, end.preemptions
        return end

    def _finish(self, st: _Job, now: float) -> None:
        self._release(st, now)
        end = self._end(st, None, "", now)
        st.saved_s = st.duration_s
        self.estimator.observe(st.tj, st.duration_s, now)
        if isinstance(end.next, Finish):
            st.move(end.next.state)
            st.finish_s = now
            self.log.append((now, "finish", st.job.id, ()))
            self.progress_done += 1
            self._ended(st.job.id, now)
        else:  # restart policy `always`: it runs again, from the start
            st.saved_s = 0.0
            self._requeue(st, now)
        self._changed(now)
        if self.short_elastic and not self.pending:  # capacity freed and nothing waits
            after = self.config.elastic_grow_after_s
            for job_id in sorted(self.short_elastic):
                short = self.running[job_id]
                if now - short.start_s >= after:
                    self._push(now, _GROW, job_id, short.attempt)

    def _fail(self, st: _Job, now: float) -> None:
        """A played failure: the attempt keeps its checkpoints; retried after its backoff
        while retries are left (the lifecycle's rule), else the job fails."""
        self._keep_checkpointed(st, now)
        self._release(st, now)
        end = self._end(st, Stop.FAILED, "a task failed", now)
        nxt = end.next
        job_id = st.job.id
        if isinstance(nxt, Requeue):
            st.move(JobState.PENDING)
            self.backing_off.add(job_id)
            self.log.append((now, "retry", job_id, (nxt.message,)))
            self._push(nxt.not_before if nxt.not_before is not None else now, _RETRY, job_id, 0)
        elif isinstance(nxt, Finish):
            st.move(nxt.state)
            st.failed = nxt.why
            self.log.append((now, "fail", job_id, (nxt.why,)))
            self.progress_done += 1
            self._ended(job_id, now)
        self._changed(now)

    def _retry(self, st: _Job, now: float) -> None:
        self.backing_off.discard(st.job.id)
        st.estimate_s, st.upper_s = self.estimator.estimate(st.tj, now)
        self.pending[st.job.id] = st.pending(self.config.restart_cost_s)
        self._changed(now)

    def _requeue(self, st: _Job, now: float) -> None:
        st.move(JobState.PENDING)
        st.estimate_s, st.upper_s = self.estimator.estimate(st.tj, now)
        self.pending[st.job.id] = st.pending(self.config.restart_cost_s)

    def _release(self, st: _Job, now: float) -> None:
        del self.running[st.job.id]
        self.short_elastic.discard(st.job.id)
        self.held.give(st.job.id)
        if self.node_tasks:
            self._unbusy(st.tasks, now)
        st.attained_gpu_s += st.gpus * (now - st.start_s)
        self.alloc_milli -= st.milli
        st.tasks = ()
        st.milli = 0
        st.gpus = 0.0
        st.attempt += 1  # any completion still queued for this attempt is now void

    def _bind(self, d: Bind, now: float) -> None:
        pj = self.pending.pop(d.job_id, None)
        if pj is None:
            raise SimulationError(f"t={now}: bind of {d.job_id}, which is not pending")
        for victim in d.after:
            if victim in self.running and victim not in self.shrunk_now:
                raise SimulationError(
                    f"t={now}: bind of {d.job_id} after {victim}, which is still running"
                )
        if not d.tasks:
            raise SimulationError(f"t={now}: bind of {d.job_id} with no tasks")
        self._start(self.jobs[d.job_id], d.tasks, pj, now)
        self.log.append((now, "bind", d.job_id, tuple(t.node for t in d.tasks)))

    def _start(self, st: _Job, tasks: tuple[TaskBinding, ...], pj: PendingJob, now: float) -> None:
        """Start an attempt of `st` on `tasks`; `pj` is how the core saw it (its bound)."""
        job_id = st.job.id
        index = self.index
        milli = 0
        for t in tasks:
            if t.node not in index:
                raise SimulationError(f"t={now}: bind of {job_id} to unknown node {t.node}")
            milli += len(t.gpus) * t.gpu_milli
        st.move(JobState.RUNNING)
        if self.node_tasks:
            self._busy(tasks)
        st.tasks = tasks
        st.milli = milli
        st.gpus = milli / GPU_MILLI_WHOLE
        st.start_s = now
        restore = self.config.restart_cost_s if st.interrupted else 0.0
        st.restore_s = restore
        if st.interrupted:
            st.restarts += 1
        if st.first_start_s is None:
            st.first_start_s = now
        self.running[job_id] = st
        self.alloc_milli += milli
        st.speed = self._speed(tasks)
        if short_of_tasks(st.job, len(tasks)):
            # Linear scaling: the trace's duration is the runtime with every task.
            st.speed *= elastic_speed(len(tasks), st.job.num_tasks)
            self.short_elastic.add(job_id)
            at = grow_at(st.job, len(tasks), now, self.config.elastic_grow_after_s, st.grew_from)
            if at != math.inf:
                self._push(at, _GROW, job_id, st.attempt)
        runtime = attempt_runtime_s(st.duration_s, st.saved_s, restore, st.speed)
        st.failing = fails(runtime, st.tj.fail_after_s, st.failures)
        remaining = planned_end_s(runtime, st.tj.fail_after_s, st.failures)
        # The estimate, not the truth: what a real scheduler would believe about this attempt.
        # Same bound as the core uses for a job it binds (upper estimate, estimate, time limit);
        # attached estimates already count restore and saved work (`_Job.pending`).
        bound = pj.runtime_bound_s
        st.expected_end_s = None if bound is None else now + bound
        if remaining != math.inf:
            self._push(now + remaining, _FINISH, job_id, st.attempt)
        view = RunningJob(
            st.job,
            st.tasks,
            now,
            st.attained_gpu_s,
            st.expected_end_s,
            None,
            None if st.ckpt_s == math.inf else st.ckpt_s,
        )
        try:
            self.held.take(view)
        except HoldingError as e:
            raise SimulationError(f"t={now}: {e}") from e

    def _speed(self, tasks: tuple[TaskBinding, ...]) -> float:
        """The attempt's speed: that of the slowest GPU model it runs on (1.0 without a
        speed table or without GPUs)."""
        speeds = self.config.gpu_speeds
        if speeds is None:
            return 1.0
        nodes = self.arrays.nodes
        models = {nodes[self.index[t.node]].gpu_model for t in tasks if t.gpus}
        return min((speeds.speed(m) for m in models), default=1.0)

    def _preempt(self, d: Preempt, now: float) -> None:
        st = self.running.get(d.job_id)
        if st is None:
            raise SimulationError(f"t={now}: preempt of {d.job_id}, which is not running")
        self._keep_checkpointed(st, now)
        self._release(st, now)
        self._end(st, Stop.PREEMPT, d.reason, now)
        self.preempt_count += 1
        self._requeue(st, now)
        self.log.append((now, "preempt", d.job_id, (d.for_job, d.reason)))

    def _keep_checkpointed(self, st: _Job, now: float) -> None:
        """An attempt stops: the work up to its last checkpoint is kept, the rest is lost."""
        st.saved_s = kept_work_s(
            st.saved_s, now - st.start_s, st.ckpt_s, st.restore_s, st.speed, st.duration_s
        )

    def _shrink(self, d: Shrink, now: float) -> None:
        st = self.running.get(d.job_id)
        if st is None:
            raise SimulationError(f"t={now}: shrink of {d.job_id}, which is not running")
        if not d.keep or not set(d.keep) < set(st.tasks):
            raise SimulationError(f"t={now}: shrink of {d.job_id} to tasks it does not hold")
        self._keep_checkpointed(st, now)
        self._release(st, now)
        end = self._end(st, Stop.SHRINK, d.reason, now, keep=d.keep)
        assert isinstance(end.next, RestartOn)  # the kept tasks are known here
        st.shrinks += 1
        self.shrink_count += 1
        st.move(JobState.PENDING)
        st.estimate_s, st.upper_s = self.estimator.estimate(st.tj, now)
        self._start(st, end.next.keep, st.pending(self.config.restart_cost_s), now)
        self.shrunk_now.add(d.job_id)
        self.log.append((now, "shrink", d.job_id, (d.for_job, d.reason, *(t.node for t in d.keep))))

    def _grow_check(self, job_id: str, attempt: int, now: float) -> None:
        """Requeue an elastic job running short of tasks, to grow, when nothing is pending and
        idle capacity would take at least one more of its tasks (the live service's rule)."""
        st = self.running.get(job_id)
        if st is None or st.attempt != attempt or job_id not in self.short_elastic:
            return
        job = st.job
        had = len(st.tasks)
        after = self.config.elastic_grow_after_s
        if self.pending or now < grow_at(job, had, st.start_s, after, st.grew_from):
            return
        if self.membership_dirty:
            self._rebuild()
        if tasks_to_grow(job, had, self.arrays, self.free) < 1:
            return  # checked again when a job finishes with nothing pending
        self._keep_checkpointed(st, now)
        self._release(st, now)
        self._end(st, Stop.REQUEUE, "growing", now)
        st.grew_from = had
        st.grows += 1
        self.grow_count += 1
        self._requeue(st, now)
        self.log.append((now, "grow", job_id, (f"from {had} of {job.num_tasks} tasks",)))
        self._changed(now)

    def _reject(self, job_id: str, reason: str, now: float) -> None:
        del self.pending[job_id]
        st = self.jobs[job_id]
        st.move(JobState.FAILED)
        st.rejected = reason
        self.log.append((now, "reject", job_id, (reason,)))
        # Its arrival is counted already; the rejection stands in for the finish it won't have.
        if st.duration_s != math.inf:
            self.progress_done += 1
        self._ended(job_id, now)

    # --- the cycle --------------------------------------------------------------------------

    def _cycle(self, now: float) -> None:
        self.dirty = False
        if not self.pending:
            return
        if self.membership_dirty:
            self._rebuild()
        snapshot = self.held.snapshot(self.queues)
        pending = tuple(self.pending.values())
        before = self.free.copy() if self.config.validate else None
        t0 = time.perf_counter()
        try:
            result = run_cycle(snapshot, pending, self.policy, now, validate=self.config.validate)
        except InvariantViolation as e:  # the core's own validate mode caught a broken cycle
            raise SimulationError(f"t={now}: {e}") from e
        self.cycle_wall_s += time.perf_counter() - t0
        self.cycles += 1
        if before is not None:
            self._check_cycle(now, before, pending, result.diagnostics)
        self.shrunk_now.clear()
        for d in result.decisions:
            if isinstance(d, Preempt):
                self._preempt(d, now)
            elif isinstance(d, Shrink):
                self._shrink(d, now)
            elif isinstance(d, Bind):
                self._bind(d, now)
            elif isinstance(d, Reserve):
                self.log.append((now, "reserve", d.job_id, d.nodes))
        # Only a job's first cycle can say it never fits; checking just those keeps this
        # O(arrivals) instead of O(pending) per cycle.
        diagnostics = result.diagnostics
        for job_id in self.fresh:
            status = diagnostics.get(job_id)
            if status is None or job_id not in self.pending:
                continue
            if status.code == StatusCode.NEVER_FITS:
                reason = self._never_fits(job_id, status.reason)
                if reason is not None:
                    self._reject(job_id, reason, now)
            else:
                self.jobs[job_id].eta_s = status.eta_s
        self.fresh.clear()
        if self.config.validate:
            self._check_state(now)
        if self.pools:
            self._scale_up(now, diagnostics)
        # A requeued victim is pending again: if the cycle left it there, it waits for the next
        # change like any other job; it does not force a second cycle at the same instant.

    # --- autoscaling node pools -------------------------------------------------------------

    def _init_pools(self, cluster: Cluster) -> None:
        self.pools: dict[str, NodePool] = {p.name: p for p in cluster.node_pools}
        self.present: dict[str, Node] = {n.name: n for n in cluster.nodes}
        self.coming: dict[str, Node] = {}  # asked for, not joined yet
        self.pool_of: dict[str, str] = {}  # present or coming pool node -> its pool
        self.pool_present = dict.fromkeys(self.pools, 0)
        self.pool_coming = dict.fromkeys(self.pools, 0)
        self.next_index = dict.fromkeys(self.pools, 0)
        # Running tasks per present pool node (empty without pools: the hooks then cost nothing),
        # and since when each task-less one has been idle, with a stamp that voids old checks.
        self.node_tasks: dict[str, int] = {}
        self.idle_since: dict[str, float] = {}
        self.idle_stamp: dict[str, int] = {}
        self.membership_dirty = False
        self.nodes_added = 0
        self.nodes_removed = 0
        self.priced = any(p.cost_per_node_hour is not None for p in cluster.node_pools)
        self.node_samples: list[NodeSample] = []
        self.ceiling: Snapshot | None = None
        for n in cluster.nodes:
            pool = cluster.pool_of(n.name)
            if pool is None:
                continue
            self.pool_of[n.name] = pool.name
            self.pool_present[pool.name] += 1
            self.node_tasks[n.name] = 0
            index = int(n.name.rpartition("-")[2])
            self.next_index[pool.name] = max(self.next_index[pool.name], index + 1)
        if self.pools:
            # What "never fits" means with autoscaling: not even with every pool at its maximum.
            top = build_arrays(cluster.at_max())
            self.ceiling = Snapshot(top, FreeState.empty(top), (), self.queues)
            self.capacity_gpus = float(top.num_gpus[top.healthy].sum())

    def _start_pools(self, now: float) -> None:
        for name in self.node_tasks:
            self._mark_idle(name, now)
        self._bill(now)

    def _bill(self, now: float) -> None:
        """Sample the billed nodes, present GPUs and cost rate (after any change to them)."""
        cost = 0.0
        for pool_name in self.pool_of.values():
            cost += self.pools[pool_name].cost_per_node_hour or 0.0
        gpus = sum(len(n.gpus) for n in self.present.values() if n.healthy)
        point = (now, len(self.present) + len(self.coming), float(gpus), cost)
        samples = self.node_samples
        if samples and samples[-1][1:] == point[1:]:
            return
        if samples and samples[-1][0] == now:
            samples[-1] = point
        else:
            samples.append(point)

    def _never_fits(self, job_id: str, reason: str) -> str | None:
        """Why a job the present nodes can never hold is rejected; None when it would fit once
        the pools have grown, so it waits instead."""
        if self.ceiling is None:
            return reason
        return never_runs(self.ceiling, self.policy, self.jobs[job_id].job)

    def _pool_states(self, with_free: bool = False) -> list[PoolState]:
        free: dict[str, list[NodeFree]] = {name: [] for name in self.pools}
        if with_free and self.node_tasks:
            # What the present pool nodes have free (the arrays are current: a cycle just ran).
            # Only nodes with a free GPU share, or without GPUs: a full GPU node serves no gang.
            a, f = self.arrays, self.free
            names = list(self.node_tasks)
            rows = np.array([self.index[n] for n in names], dtype=np.int64)
            keep = np.flatnonzero((a.num_gpus[rows] == 0) | (f.gpu_total[rows] > 0)).tolist()
            cpu, mem = f.cpu[rows].tolist(), f.mem[rows].tolist()
            milli, gmem = f.gpu_milli[rows].tolist(), f.gpu_mem[rows].tolist()
            valid = a.gpu_valid[rows].tolist()
            for j in keep:
                v = valid[j]
                free[self.pool_of[names[j]]].append(
                    NodeFree(
                        cpu[j],
                        mem[j],
                        tuple(x for x, ok in zip(milli[j], v, strict=True) if ok),
                        tuple(x for x, ok in zip(gmem[j], v, strict=True) if ok),
                    )
                )
        return [
            PoolState(p, self.pool_present[name], self.pool_coming[name], tuple(free[name]))
            for name, p in self.pools.items()
        ]

    def _scale_up(self, now: float, diagnostics: Mapping[str, JobStatus]) -> None:
        if not self.pending:
            return
        states = self._pool_states()
        if not any(ps.headroom or ps.provisioning for ps in states):
            return  # every pool at its maximum with nothing on the way: nothing to plan
        waiting = []
        for pj in self.pending.values():
            status = diagnostics.get(pj.id)  # None: preempted by this cycle, wants room again
            if status is None or status.code in _WANTS_NODES:
                waiting.append(pj.job)
        if not waiting:
            return
        plan = plan_scale_up(waiting, self._pool_states(with_free=True))
        for up in plan.scale_ups:
            pool = self.pools[up.pool]
            names = []
            for _ in range(up.count):
                node = pool.node(self.next_index[up.pool])
                self.next_index[up.pool] += 1
                self.coming[node.name] = node
                self.pool_of[node.name] = up.pool
                self.pool_coming[up.pool] += 1
                self._push(now + pool.provisioning_delay_s, _JOIN, node.name, 0)
                names.append(node.name)
            self.nodes_added += up.count
            self.log.append((now, "scale-up", up.pool, tuple(names)))
        if plan.scale_ups:
            self._bill(now)

    def _join(self, name: str, now: float) -> None:
        node = self.coming.pop(name)
        pool = self.pool_of[name]
        self.pool_coming[pool] -= 1
        self.pool_present[pool] += 1
        self.present[name] = node
        self.node_tasks[name] = 0
        self.membership_dirty = True
        self._mark_idle(name, now)
        self.log.append((now, "join", name, ()))
        self._bill(now)
        self._changed(now)

    def _mark_idle(self, name: str, now: float) -> None:
        self.idle_since[name] = now
        stamp = self.idle_stamp.get(name, 0) + 1
        self.idle_stamp[name] = stamp
        self._push(now + self.pools[self.pool_of[name]].scale_down_idle_s, _IDLE, name, stamp)

    def _busy(self, tasks: tuple[TaskBinding, ...]) -> None:
        counts = self.node_tasks
        for t in tasks:
            c = counts.get(t.node)
            if c is None:
                continue  # not a pool node
            if c == 0:
                del self.idle_since[t.node]
            counts[t.node] = c + 1

    def _unbusy(self, tasks: tuple[TaskBinding, ...], now: float) -> None:
        counts = self.node_tasks
        for t in tasks:
            c = counts.get(t.node)
            if c is None:
                continue
            counts[t.node] = c - 1
            if c == 1:
                self._mark_idle(t.node, now)

    def _idle_check(self, name: str, stamp: int, now: float) -> None:
        if name not in self.idle_since or self.idle_stamp.get(name) != stamp:
            return  # busy again, or idle again since: a later check stands
        idle = [IdleNode(n, self.pool_of[n], since) for n, since in self.idle_since.items()]
        gone = plan_scale_down(idle, self._pool_states(), now)
        for n in gone:
            pool = self.pool_of.pop(n)
            del self.present[n], self.node_tasks[n], self.idle_since[n]
            self.pool_present[pool] -= 1
            self.nodes_removed += 1
            self.membership_dirty = True
            self.log.append((now, "remove", n, ()))
        if gone:
            self._bill(now)

    def _rebuild(self) -> None:
        """New node arrays for the present nodes; every running binding taken again."""
        arrays = build_arrays(Cluster(tuple(self.present.values()), self.cluster.links))
        self.held.rebuild(arrays)
        self.arrays, self.index = arrays, arrays.index
        self.membership_dirty = False

    # --- validate mode ----------------------------------------------------------------------

    def _check_cycle(
        self,
        now: float,
        before: FreeState,
        pending: Sequence[PendingJob],
        diagnostics: Mapping[str, object],
    ) -> None:
        problems: list[str] = []
        if not self.free.equals(before):
            problems.append("run_cycle changed the free state it was given")
        missing = [p.id for p in pending if p.id not in diagnostics]
        if missing:
            problems.append(f"no status for pending job(s) {', '.join(missing[:5])}")
        if problems:
            raise SimulationError(f"t={now}: " + "; ".join(problems))

    def _check_state(self, now: float) -> None:
        if self.membership_dirty:
            self._rebuild()
        problems = self.held.problems()
        both = self.pending.keys() & self.running.keys()
        if both:
            problems.append(f"both pending and running: {', '.join(sorted(both)[:5])}")
        held = sum(len(t.gpus) * t.gpu_milli for st in self.running.values() for t in st.tasks)
        if held != self.alloc_milli:
            problems.append(f"allocated GPU count drifted: {self.alloc_milli} vs {held}")
        if problems:
            raise SimulationError(f"t={now}: " + "; ".join(problems))


def simulate(
    trace: Trace,
    cluster: Cluster,
    policy: Policy,
    config: SimConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    estimator: Estimator | Callable[[TraceJob], Estimate] | None = None,
    queues: QueueTree | None = None,
) -> SimResult:
    """Replay `trace` on `cluster` under `policy` and return what happened.

    `progress(done, total)` is called now and then, counting arrivals, finishes and rejections.
    `estimator` fills each pending job's runtime estimate (default: the job's own `estimate_s`)
    and learns from finished jobs; a bare function of the trace job also does, learning nothing.
    `queues` defaults to one flat queue per queue name the jobs use.
    """
    engine = _Engine(
        trace,
        cluster,
        policy,
        config if config is not None else SimConfig(),
        progress,
        _as_estimator(estimator),
        queues,
    )
    return engine.run()


def _as_estimator(e: Estimator | Callable[[TraceJob], Estimate] | None) -> Estimator:
    if e is None:
        return _Plain(own_estimate)
    if isinstance(e, _Plain) or (hasattr(e, "estimate") and hasattr(e, "observe")):
        return cast(Estimator, e)
    return _Plain(e)

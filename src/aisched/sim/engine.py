"""The discrete-event simulator: replays a trace through the real scheduling cycle in virtual time.

One event heap and a virtual clock, in the shape of SimPy's core: events are popped in
`(time, kind, sequence)` order, so at one instant every completion is handled before every
arrival, and both before the scheduling cycle of that instant; equal kinds keep the order they
were scheduled in. Nothing here reads the wall clock except to report how long a run took, and
the same trace, cluster, policy and config always give the identical decision log.

Every rule about a job between decisions (its states, what an attempt's end makes of it,
retries and backoff, checkpoints and restore, growth, the resources it holds) is the
lifecycle's (`aisched.lifecycle`), the very rules the live service applies; the engine plays
task ends and keeps the event queue and the metrics. Its parts: `results` (config, records,
the log's shape), `sim_job` (one job's run state), `pools` (autoscaling node pools), `events`.
This module is longer than the house's ~600 lines: over a hundred of them are this description
of the semantics, and the event loop with its state changes reads best in one piece.

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
alone is re-evaluated when they do: under 2D-LAS a running job's rank drops the instant its
attained service crosses a threshold (`core.demotion`), and a `_DEMOTE` event runs a cycle
then, so a waiting job may preempt it at that instant. Applying a cycle's own decisions does
not call for another cycle. A cycle that could decide nothing is skipped (coalesced with the
next): under a policy that may settle (`core.cycle.may_settle`: it only places, or also
preempts by rank), when the free state is within what the last cycle left free (capacity
given back and taken again, as a preemption's victims and the job that waited for them do,
counts as none given; with a governed queue, any release or preemption makes the next cycle
run) or, under a policy that preempts, no shape waiting could fit it
(`core.placement.may_fit`: what a job's end gave back is too little for anyone), every job
new to it is of a shape that failed since, in a queue no limit governs, and, when the policy
preempts, no running job ranks above any pending job's bar at its time (`_settled`); its
decisions would be none, so the log is the same. A job that can never fit the cluster at its
largest is rejected when it arrives (`lifecycle.admission`, the live service's refusal at
submission); it is logged and counted.

Preemption (`lifecycle.preemption`): a victim's tasks exit `victim_stop_s` after it is
preempted (or when its grace period runs out, if sooner), and with `victim_stop_s` 0 at that
instant, yet after the cycle that preempted it, as the live service sees an exit only in a step
after the one that signalled it: its stop is an event like a finish. Until then it holds its
resources and the core sees it as terminating, and the job bound after it waits out of the
cycle (keeping what its first victims free while others still stop); once its victims
have stopped it starts where the core bound it, or, when that no longer fits, is pending again
and a cycle places it afresh.

Elastic jobs: a `Shrink` stops the attempt like a preemption (`victim_stop_s`, capped by its
grace), then restarts it at once on the tasks it keeps: it keeps the work up to its last
checkpoint, and the new attempt pays `restart_cost_s` of restore first; a grow's requeue takes
the same stop (every stop is one path, `_stop` then `_stopped`, as in the service). The trace's
duration is the runtime with every task; with fewer, an elastic job runs proportionally slower
(linear scaling). Growth follows the live service's rule (`lifecycle.elastic`): an elastic job
running short of tasks for `elastic_grow_after_s`, when idle capacity is owed to nobody and
would take at least one more of its tasks, is requeued from its checkpoint (a "grow" in the
log; no preemption counted) and the next cycle places it with as many tasks as fit; one job at
a time. It is looked at when a job's time comes (a `_GROW` event), whenever capacity is given
back with nothing pending, and after a cycle that left nothing pending.

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
still running (and not stopping), or a `Preempt` of a job that is not running (or already
stopping), or a `Shrink` of one that is not running or to tasks it does not hold, raises
`SimulationError`.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from itertools import chain, islice
from operator import itemgetter

from aisched.core.cycle import (
    InvariantViolation,
    evicts_nobody,
    may_settle,
    only_places,
    run_cycle,
)
from aisched.core.decisions import Bind, Preempt, Reserve, Shrink, TaskBinding
from aisched.core.demotion import demotion_at
from aisched.core.dependencies import Awaited, DependencyVerdict, check_dependencies
from aisched.core.pending import PendingQueue
from aisched.core.placement import may_fit
from aisched.core.policy import Policy
from aisched.core.snapshot import FreeState, PendingJob, RunningJob, Snapshot, build_arrays
from aisched.core.status import StatusCode
from aisched.lifecycle.admission import Admission
from aisched.lifecycle.attempts import AttemptEnd, Finish, Requeue, RestartOn, Stop, after_attempt
from aisched.lifecycle.elastic import (
    Running,
    capacity_is_idle,
    grew_from_after_start,
    grow_at,
    grow_message,
    next_to_grow,
    queue_takes_back,
    short_of_tasks,
)
from aisched.lifecycle.holdings import HoldingError, Holdings
from aisched.lifecycle.preemption import (
    VictimWait,
    after_victims,
    blockers,
    keep_freed,
    played_stop_s,
    release_kept,
    resume_order,
    resumed_tasks,
    wait_for,
)
from aisched.lifecycle.services import CrashLoop, replica_failed, replica_job, replica_name
from aisched.lifecycle.work import (
    attempt_runtime_s,
    checkpoint_interval_s,
    core_interval,
    elastic_speed,
    fails,
    kept_work_s,
    planned_end_s,
    time_left_s,
)
from aisched.model.cluster import Cluster
from aisched.model.job import JobKind
from aisched.model.numerals import is_decimal
from aisched.model.queue import QueueTree
from aisched.model.resources import GPU_MILLI_WHOLE
from aisched.model.states import JobState
from aisched.sim.events import ARRIVE, CYCLE, DEMOTE, FINISH, GROW, IDLE, JOIN, RETRY
from aisched.sim.pools import NodePools
from aisched.sim.results import (
    Estimate,
    Estimator,
    JobRecord,
    LogEntry,
    NodeSample,
    Sample,
    SimConfig,
    SimResult,
    SimulationError,
    as_estimator,
    own_estimate,
    queues_for,
)
from aisched.sim.sim_job import SimJob, Stopping
from aisched.sim.traces import Trace, TraceJob

__all__ = [
    "Estimate",
    "Estimator",
    "JobRecord",
    "LogEntry",
    "NodeSample",
    "Sample",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "own_estimate",
    "queues_for",
    "simulate",
]

# Calls to `progress` are spaced by this many events: a call per event would cost more than the
# event itself on a large trace.
_PROGRESS_EVERY = 2000
# Cycles at one instant past which the run is stuck: decisions that undo each other with no
# time passing (a policy bug) would otherwise loop for ever. Stopping at once (victim_stop_s
# 0) lets one instant legitimately hold a chain of preempt, stop, requeue and place again,
# about a cycle per job moved; this is far beyond any such chain.
_MAX_CYCLES_AT_ONE_INSTANT = 10_000
_JOB = itemgetter(1)  # the job of a (count, job) entry of `PendingQueue.shapes`


class _Engine(NodePools):
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
        self.jobs: dict[str, SimJob] = {}
        for tj in trace.jobs:
            if tj.job.id in self.jobs:
                raise SimulationError(f"trace {trace.name}: job id {tj.job.id} repeats")
            ckpt = checkpoint_interval_s(tj.job, config.checkpoint_interval_s)
            self.jobs[tj.job.id] = SimJob(tj, ckpt)
        # Insertion-ordered, so the pending tuple handed to a cycle is in a deterministic order
        # (arrival, then requeue order) without sorting.
        self.pending = PendingQueue()
        self.running: dict[str, SimJob] = {}
        # Failed jobs waiting out their backoff before they are pending again.
        self.backing_off: set[str] = set()
        # Pipelines: jobs that arrived and wait for their dependencies to end, and who waits
        # on whom (re-checked exactly when a dependency ends, and incrementally, as the live
        # service does).
        self.blocked: set[str] = set()
        self.awaited = Awaited()
        # Services' replicas, in the order they were made; their ids continue the trace's.
        self.replicas: list[str] = []
        # Services whose replicas failed for good one after another (`lifecycle.services`):
        # a replacement waits until the run's `until`, as the live service's does.
        self.crash_loops: dict[str, CrashLoop] = {}
        numeric = [int(tj.job.id) for tj in trace.jobs if is_decimal(tj.job.id)]
        self.next_id = max(numeric, default=0) + 1
        # Jobs pending since before their first cycle: only these can turn out never to fit
        # (the cluster does not change, and a requeued job has fitted before).
        self.fresh: list[str] = []
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.cycle_at: float | None = None
        self.dirty = False
        # Cycle coalescing (`_settled`): under a policy that may settle (it only places, or
        # also preempts by rank), the shapes known not to fit `settled_free` (what the last
        # cycle left free), nor so any free state within it, and how many jobs were pending
        # after the last cycle (pending only grows between cycles, so the jobs new to the next
        # one are the last ones in `pending`). None: the next cycle runs.
        self.coalesce = may_settle(policy) and not cluster.node_pools
        self.preempts = not only_places(policy)  # then a skip also needs nobody to evict
        self.settled: frozenset[Hashable] | None = None
        self.settled_free: FreeState | None = None
        # Whether the free state is still `settled_free` less binds (nothing given back since
        # a cycle that preempted nothing): then it is within it with no need to compare.
        self.only_taken = False
        # With every queue ungoverned, only room decides whether a job that did not start
        # could: capacity given back and taken again (a preemption's victims, then the job
        # that waited for them) leaves the failures standing while the free state is within
        # `settled_free`. A governed queue's limit reads usage, which such moves change, so
        # then any release or preemption makes the next cycle run.
        self.release_safe = all(tj.job.queue in self.queues.ungoverned for tj in trace.jobs)
        self.room_memo: dict[object, object] = {}  # fit counts on `free` for `may_fit`
        self.may_fit_hint = -1  # the last shape found that may fit (-1: none yet)
        self.pending_after_cycle = 0
        self.alloc_milli = 0
        self.log: list[LogEntry] = []
        self.timeline: list[Sample] = []
        self.cycles = 0
        self.instant = (math.nan, 0)  # (time, cycles run at it): the guard against a livelock
        self.cycle_wall_s = 0.0
        self.preempt_count = 0
        self.shrink_count = 0
        # Jobs whose tasks are stopping (preempted, shrunk, requeued to grow; they take
        # `SimConfig.victim_stop_s`): they hold their resources until then; and the jobs
        # waiting out of the cycle for them to stop, with the pending view they re-enter with
        # (`lifecycle.preemption`).
        self.stopping: dict[str, Stopping] = {}
        self.waiting: dict[str, tuple[VictimWait, PendingJob]] = {}
        # Jobs stopped at this instant and what each gave back: the waits are looked at, and
        # what is kept for them handed out, after its last exit (`_resume`).
        self.freed_now: list[tuple[str, tuple[TaskBinding, ...]]] = []
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
        # What arrivals are judged against (`lifecycle.admission`): the cluster at its largest.
        largest = self.ceiling or Snapshot(
            self.arrays, FreeState.empty(self.arrays), (), self.queues
        )
        self.admission = Admission(largest, policy)

    # --- the event loop ---------------------------------------------------------------------

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        self.heap = [
            (tj.job.submit_time_s, ARRIVE, i, tj.job.id, 0) for i, tj in enumerate(self.trace.jobs)
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
            if kind in (JOIN, IDLE, GROW) and self._all_done(total):
                break  # only node events are left: the run is over
            pop(heap)
            now = t
            if kind == FINISH:
                st = self.running.get(job_id)
                if st is not None and st.attempt == attempt:
                    if st.failing:
                        self._fail(st, now)
                    else:
                        self._finish(st, now)
                if self.freed_now and not (heap and heap[0][:2] == (now, FINISH)):
                    self._resume(now)  # every exit of this instant is in
            elif kind == RETRY:
                self._retry(self.jobs[job_id], now)
            elif kind == ARRIVE:
                self.arrived += 1
                self._arrive(self.jobs[job_id], now)
            elif kind == CYCLE:
                self.cycle_at = None
                if self.dirty:
                    self._cycle(now)
            elif kind == DEMOTE:
                self._demote(job_id, attempt, now)
            elif kind == JOIN:
                self._join(job_id, now)
            elif kind == IDLE:
                self._idle_check(job_id, attempt, now)
            else:
                self._grow_look(now)
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
        self._push(at, CYCLE, "", 0)

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

    def _arrive(self, st: SimJob, now: float) -> None:
        st.estimate_s, st.upper_s = self._estimate(st, now)
        st.first_estimate = (st.estimate_s, st.upper_s)
        st.move(JobState.PENDING)
        self.progress_done += 1
        why = self.admission.refusal(st.job)
        if why is not None:
            self._reject(st.job.id, why, now)
            return
        if st.job.depends_on and not self._dependencies_met(st, now):
            return
        if st.job.kind == JobKind.SERVICE:
            self._start_service(st, now)
            return
        self.pending[st.job.id] = st.pending(self.config.restart_cost_s)
        self.fresh.append(st.job.id)
        self._changed(now)

    def _estimate(self, st: SimJob, now: float) -> Estimate:
        """The estimator's (median, upper) runtime of `st`; none for a service's replica,
        which serves until it is scaled down (a prediction from finished batch jobs would say
        it ends in seconds, and it would look overdue for ever)."""
        if st.job.serves_until_scaled_down:
            return None, None
        return self.estimator.estimate(st.tj, now)

    # --- services --------------------------------------------------------------------------

    def _start_service(self, svc: SimJob, now: float) -> None:
        """A service starts holding nothing, with its minimum of replicas (the lifecycle's
        `replica_job`), which arrive at once; they hold their resources to the end of the run.
        Replica ids continue after the largest numeric id seen, as the live service's do.
        Each replica plays the service's failures (`TraceJob.fail_after_s`)."""
        svc.move(JobState.RUNNING)
        svc.first_start_s = now
        spec = svc.job.service
        count = spec.min_replicas if spec is not None else 0
        names = []
        for _ in range(count):
            replica = self._new_replica(svc, svc.tj.fail_after_s, now)
            names.append(replica.job.id)
            self.pending[replica.job.id] = replica.pending(self.config.restart_cost_s)
            self.fresh.append(replica.job.id)
        self.log.append((now, "service", svc.job.id, tuple(names)))
        self._changed(now)

    def _new_replica(self, svc: SimJob, fail_after_s: tuple[float, ...], now: float) -> SimJob:
        """A replica of `svc` made at `now` (PENDING, not yet queued), which plays
        `fail_after_s`."""
        job_id = str(self.next_id)
        self.next_id += 1
        job = replace(
            replica_job(svc.job, replica_name(svc.job, job_id), 0),
            id=job_id,
            submit_time_s=now,
        )
        replica = SimJob(TraceJob(job, math.inf, fail_after_s=fail_after_s), svc.ckpt_s)
        self.jobs[job_id] = replica
        self.replicas.append(job_id)
        replica.estimate_s, replica.upper_s = self._estimate(replica, now)
        replica.first_estimate = (replica.estimate_s, replica.upper_s)
        replica.move(JobState.PENDING)
        return replica

    def _replace_replica(self, failed: SimJob, why: str, now: float) -> None:
        """A replica failed for good: the service (still running) gets a new one in its place
        once its crash loop's wait is over (`lifecycle.services.replica_failed`), as the live
        service's autoscaler keeps its minimum. The new one plays the failures its
        predecessor did not reach, so a finite list ends the loop."""
        svc = self.jobs.get(failed.job.replica_of or "")
        if svc is None or svc.job.service is None or svc.state != JobState.RUNNING:
            return
        run = replica_failed(
            self.crash_loops.get(svc.job.id),
            svc.job,
            failed.job.id,
            why,
            now,
            self.config.max_backoff_s,
        )
        self.crash_loops[svc.job.id] = run
        replica = self._new_replica(svc, failed.tj.fail_after_s[failed.failures :], now)
        self.log.append((now, "replace", svc.job.id, (failed.job.id, replica.job.id, run.note())))
        self.backing_off.add(replica.job.id)
        self._push(run.until, RETRY, replica.job.id, 0)

    # --- pipelines --------------------------------------------------------------------------

    def _state_of(self, job_id: str) -> JobState | None:
        st = self.jobs.get(job_id)
        if st is None:
            return None
        return st.state if st.state is not None else JobState.PENDING  # not arrived yet

    def _dependencies_met(self, st: SimJob, now: float) -> bool:
        """Whether a pending job with dependencies may enter the cycle; one that waits is
        blocked, one whose dependencies can never be met is cancelled."""
        job_id = st.job.id
        if self.awaited.still_awaited(job_id) is not None:
            return False  # it awaits others still: nothing to look at
        names = {
            d.job_id: self.jobs[d.job_id].job.name
            for d in st.job.depends_on
            if d.job_id in self.jobs
        }
        check = check_dependencies(st.job, self._state_of, names)
        if check.verdict == DependencyVerdict.MET:
            self.blocked.discard(job_id)
            self.awaited.forget(job_id)
            return True
        if check.verdict == DependencyVerdict.WAITING:
            self.blocked.add(job_id)
            self.awaited.hold(st.job, self._state_of)
            return False
        self.blocked.discard(job_id)
        self.awaited.forget(job_id)
        st.move(JobState.CANCELLED)
        st.cancelled = check.reason
        self.log.append((now, "cancel", job_id, (check.reason,)))
        if st.duration_s != math.inf:
            self.progress_done += 1  # stands in for the finish it won't have
        self._ended(job_id, now)
        return False

    def _ended(self, job_id: str, now: float) -> None:
        """A job ended for good (its state says how): look again at the jobs that waited on
        it."""
        state = self.jobs[job_id].state
        assert state is not None, "each caller moves the job to its final state first"
        self.awaited.forget(job_id)
        for waiting in self.awaited.ended(job_id, state):
            st = self.jobs[waiting]
            if waiting in self.blocked and self._dependencies_met(st, now):
                if st.job.kind == JobKind.SERVICE:
                    self._start_service(st, now)
                    continue
                self.pending[waiting] = st.pending(self.config.restart_cost_s)
                self.fresh.append(waiting)
                self._changed(now)

    def _end(
        self,
        st: SimJob,
        stop: Stop | None,
        message: str,
        now: float,
        keep: tuple[TaskBinding, ...] | None = None,
        started: int | None = None,
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
            started=started,
            ran_s=now - st.start_s,
            quick_exits=st.quick_exits,
        )
        st.failures, st.preemptions = end.failures, end.preemptions
        st.quick_exits = end.quick_exits
        return end

    def _finish(self, st: SimJob, now: float) -> None:
        if st.job.id in self.stopping:
            self._stopped(st, now)
            return
        started = len(st.tasks)
        self._release(st, now)
        end = self._end(st, None, "", now, started=started)
        st.saved_s = st.duration_s
        self.estimator.observe(st.tj, st.duration_s, now)
        if isinstance(end.next, Finish):
            st.move(end.next.state)
            st.finish_s = now
            self.log.append((now, "finish", st.job.id, ()))
            self.progress_done += 1
            self._ended(st.job.id, now)
        else:  # restart policy `always`: it runs again, from the start, after its wait
            st.saved_s = 0.0
            until = end.next.not_before if isinstance(end.next, Requeue) else None
            if until is not None and until > now:
                st.move(JobState.PENDING)
                self.backing_off.add(st.job.id)
                self._push(until, RETRY, st.job.id, 0)
            else:
                self._requeue(st, now)
        self._changed(now)
        self._grow_if_idle(now)

    def _grow_if_idle(self, now: float) -> None:
        """Capacity was freed (a finish, a failure, a stop) or a cycle placed the last pending
        job: with nothing pending, look at once at the elastic jobs running short that may
        grow (the live loop looks at every step with nothing pending)."""
        if self.short_elastic and not self.pending:
            after = self.config.elastic_grow_after_s
            if any(now - self.running[j].start_s >= after for j in self.short_elastic):
                self._push(now, GROW, "", 0)

    def _fail(self, st: SimJob, now: float) -> None:
        """A played failure: the attempt keeps its checkpoints; retried after its backoff
        while retries are left (the lifecycle's rule), else the job fails."""
        if st.job.id in self.stopping:
            self._stopped(st, now)
            return
        self._keep_checkpointed(st, now)
        self._release(st, now)
        end = self._end(st, Stop.FAILED, "a task failed", now)
        nxt = end.next
        job_id = st.job.id
        if isinstance(nxt, Requeue):
            st.move(JobState.PENDING)
            self.backing_off.add(job_id)
            self.log.append((now, "retry", job_id, (nxt.message,)))
            self._push(nxt.not_before if nxt.not_before is not None else now, RETRY, job_id, 0)
        elif isinstance(nxt, Finish):
            st.move(nxt.state)
            st.failed = nxt.why
            self.log.append((now, "fail", job_id, (nxt.why,)))
            if st.duration_s != math.inf:
                self.progress_done += 1  # an endless job's progress is its arrival alone
            self._ended(job_id, now)
            if st.job.replica_of is not None:
                self._replace_replica(st, nxt.why, now)
        self._changed(now)
        self._grow_if_idle(now)

    def _retry(self, st: SimJob, now: float) -> None:
        self.backing_off.discard(st.job.id)
        st.estimate_s, st.upper_s = self._estimate(st, now)
        self.pending[st.job.id] = st.pending(self.config.restart_cost_s)
        self._changed(now)

    def _requeue(self, st: SimJob, now: float) -> None:
        st.move(JobState.PENDING)
        st.estimate_s, st.upper_s = self._estimate(st, now)
        self.pending[st.job.id] = st.pending(self.config.restart_cost_s)

    def _release(self, st: SimJob, now: float) -> None:
        self.only_taken = False
        if not (self.release_safe and self.preempts):
            # Usage moved (a job a queue's limit held may start now); or, under a policy that
            # only places, this is a job's end, and checking whether what it gave back fits a
            # shape waiting (`_nothing_fits`) costs more than the cycles it saves: a job that
            # ends usually leaves room for one.
            self.settled = None
        del self.running[st.job.id]
        self.stopping.pop(st.job.id, None)
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
        stopping = self.stopping.__contains__
        # Jobs still stopping hold what they were evicted for: a bind into it waits for them.
        others = blockers(d.tasks, self.held, stopping) if self.stopping else ()
        wait = wait_for((*d.after, *others), stopping, now, d.tasks)
        if wait is not None:  # out of the cycle until its victims have stopped
            self.waiting[d.job_id] = (wait, pj)
            return
        for victim in d.after:
            if victim in self.running:
                raise SimulationError(
                    f"t={now}: bind of {d.job_id} after {victim}, which is still running"
                )
        if not d.tasks:
            raise SimulationError(f"t={now}: bind of {d.job_id} with no tasks")
        self._start(self.jobs[d.job_id], d.tasks, pj, now)
        self.log.append((now, "bind", d.job_id, tuple(t.node for t in d.tasks)))

    def _start(
        self, st: SimJob, tasks: tuple[TaskBinding, ...], pj: PendingJob, now: float
    ) -> None:
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
        st.grew_from = grew_from_after_start(st.grew_from, len(tasks))
        st.milli = milli
        st.gpus = milli / GPU_MILLI_WHOLE
        st.start_s = now
        restore = self.config.restart_cost_s if st.interrupted else 0.0
        st.restore_s = restore
        if st.interrupted:
            st.restarts += 1
        upper = self.estimator.upper_at_start(st.tj, now)
        waited = None  # the bound it waited with, kept when a new one replaces it
        if upper is not None:
            st.upper_s = upper
            waited = pj.runtime_bound_s
            pj = replace(pj, estimate_upper_s=time_left_s(upper, st.saved_s, restore))
        if st.first_start_s is None:
            st.first_start_s = now
            st.first_estimate = (st.estimate_s, st.upper_s)
        self.running[job_id] = st
        self.alloc_milli += milli
        st.speed = self._speed(tasks)
        if short_of_tasks(st.job, len(tasks)):
            # Linear scaling: the trace's duration is the runtime with every task.
            st.speed *= elastic_speed(len(tasks), st.job.num_tasks)
            self.short_elastic.add(job_id)
            at = grow_at(st.job, len(tasks), now, self.config.elastic_grow_after_s, st.grew_from)
            if at != math.inf:
                self._push(at, GROW, job_id, st.attempt)
        runtime = attempt_runtime_s(st.duration_s, st.saved_s, restore, st.speed)
        st.failing = fails(runtime, st.tj.fail_after_s, st.failures)
        remaining = planned_end_s(runtime, st.tj.fail_after_s, st.failures)
        st.end_s = now + remaining
        # The estimate, not the truth: what a real scheduler would believe about this attempt.
        # Same bound as the core uses for a job it binds (upper estimate, estimate, time limit);
        # attached estimates already count restore and saved work (`SimJob.pending`).
        bound = pj.runtime_bound_s
        st.expected_end_s = None if bound is None else now + bound
        if remaining != math.inf:
            self._push(now + remaining, FINISH, job_id, st.attempt)
        view = RunningJob(
            st.job,
            st.tasks,
            now,
            st.attained_gpu_s,
            st.expected_end_s,
            None,
            core_interval(st.ckpt_s),
            waited_end_s=None if waited is None else now + waited,
        )
        try:
            self.held.take(view)
        except HoldingError as e:
            raise SimulationError(f"t={now}: {e}") from e
        demoted = demotion_at(self.policy, view, now)
        if demoted is not None:
            self._push(demoted, DEMOTE, job_id, st.attempt)

    def _demote(self, job_id: str, attempt: int, now: float) -> None:
        """A running job's rank dropped (its attained service crossed a threshold): the jobs
        waiting may now preempt it, so a cycle re-ranks them at this instant; and the next
        threshold gets its own timer."""
        st = self.running.get(job_id)
        if st is None or st.attempt != attempt:
            return  # that attempt has ended
        self._changed(now)
        view = self.held.views[job_id]
        demoted = demotion_at(self.policy, view, now)
        if demoted is not None:
            self._push(demoted, DEMOTE, job_id, attempt)

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
        if st is None or d.job_id in self.stopping:
            raise SimulationError(f"t={now}: preempt of {d.job_id}, which is not running")
        self._stop(st, Stopping(Stop.PREEMPT, d.reason), now)
        self.preempt_count += 1
        self.log.append((now, "preempt", d.job_id, (d.for_job, d.reason)))

    def _stop(self, st: SimJob, why: Stopping, now: float) -> None:
        """SIGTERM to the attempt's tasks: it holds its resources, seen as terminating, until
        they exit `victim_stop_s` later (its grace caps it), after this cycle even when that
        is at once (the service sees an exit only in a step after the one that signalled it);
        the binds into what it frees wait for it. Then `_stopped`."""
        job_id = st.job.id
        self.stopping[job_id] = why
        self.held.update(replace(self.held.views[job_id], terminating=True))
        stop_s = played_stop_s(st.job.grace_period_s, self.config.victim_stop_s)
        self._push(now + stop_s, FINISH, job_id, st.attempt)

    def _stopped(self, st: SimJob, now: float) -> None:
        """A stopped job's tasks have exited (at the end of its stop, or by themselves during
        it): requeued, or restarted on a shrink's kept tasks (the lifecycle's rule), and the
        jobs waiting for it looked at."""
        job_id = st.job.id
        why = self.stopping[job_id]
        if now >= st.end_s and not st.failing:
            st.saved_s = st.duration_s  # its work was done before it stopped
        else:
            self._keep_checkpointed(st, now)
        kept = set(why.keep or ())
        freed = tuple(t for t in st.tasks if t not in kept)
        self._release(st, now)
        nxt = self._end(st, why.stop, why.message, now, keep=why.keep).next
        if isinstance(nxt, RestartOn):  # shrunk: at once on the tasks it keeps
            st.move(JobState.PENDING)
            st.estimate_s, st.upper_s = self._estimate(st, now)
            self._start(st, nxt.keep, st.pending(self.config.restart_cost_s), now)
        else:
            self._requeue(st, now)
        self.freed_now.append((job_id, freed))
        self._changed(now)

    def _wait_now(self, wait: VictimWait, now: float) -> VictimWait | None:
        return after_victims(
            wait,
            self.stopping.__contains__,
            lambda v: self.jobs[v].job.grace_period_s,
            now,
            self.config.victim_wait_s,
        )

    def _resume(self, now: float) -> None:
        """Jobs stopped at this instant, and every exit of it taken in (as the service takes
        in a step's exits before it looks at the waits): what they gave back is kept for the
        jobs whose waits go on, and the waits that are over end, each job started where the
        core bound it or pending to be placed afresh (`lifecycle.preemption`, rules 3 and 4),
        whatever order the exits came in."""
        going_on: dict[str, VictimWait] = {}  # as they stood before this instant
        ended: dict[str, VictimWait] = {}
        for waiting, (wait, pj) in list(self.waiting.items()):
            still = self._wait_now(wait, now)
            if still is None:
                ended[waiting] = wait
            else:
                going_on[waiting] = wait
                self.waiting[waiting] = (still, pj)
        freed_now, self.freed_now = self.freed_now, []
        for victim, freed in freed_now:
            keep_freed(self.held, victim, freed, going_on, lambda j: self.jobs[j].job, now)
        for waiting in resume_order(ended):
            _, pj = self.waiting.pop(waiting)
            release_kept(self.held, waiting)
            tasks = resumed_tasks(ended[waiting], self.held)
            if tasks is None:  # placed afresh by the next cycle
                self.pending[waiting] = pj
            else:  # where the core bound it
                self._start(self.jobs[waiting], tasks, pj, now)
                self.log.append((now, "bind", waiting, tuple(t.node for t in tasks)))
        self._changed(now)
        self._grow_if_idle(now)

    def _keep_checkpointed(self, st: SimJob, now: float) -> None:
        """An attempt stops: the work up to its last checkpoint is kept, the rest is lost."""
        st.saved_s = kept_work_s(
            st.saved_s, now - st.start_s, st.ckpt_s, st.restore_s, st.speed, st.duration_s
        )

    def _shrink(self, d: Shrink, now: float) -> None:
        st = self.running.get(d.job_id)
        if st is None or d.job_id in self.stopping:
            raise SimulationError(f"t={now}: shrink of {d.job_id}, which is not running")
        if not d.keep or not set(d.keep) < set(st.tasks):
            raise SimulationError(f"t={now}: shrink of {d.job_id} to tasks it does not hold")
        self._stop(st, Stopping(Stop.SHRINK, d.reason, d.keep), now)
        st.shrinks += 1
        self.shrink_count += 1
        self.log.append((now, "shrink", d.job_id, (d.for_job, d.reason, *(t.node for t in d.keep))))

    def _grow_look(self, now: float) -> None:
        """Requeue the one elastic job running short of tasks that may grow now, when idle
        capacity is owed to nobody (`lifecycle.elastic`, the live service's rule); the next is
        looked at once it has been placed again (`_grow_if_idle` after the cycle)."""
        requeuing = any(s.stop == Stop.REQUEUE for s in self.stopping.values())
        if not capacity_is_idle(
            pending=bool(self.pending), waiting_for_victims=bool(self.waiting), requeuing=requeuing
        ):
            return
        if self.membership_dirty:
            self._rebuild()
        running = (
            Running(st.job, len(st.tasks), st.start_s, st.grew_from)
            for st in (self.running[j] for j in self.short_elastic if j not in self.stopping)
        )
        after = self.config.elastic_grow_after_s
        room = functools.partial(queue_takes_back, self.queues, self.held)
        found = next_to_grow(running, now, after, self.arrays, self.free, room)
        if found is None:
            return  # looked at again when capacity is given back with nothing pending
        job, extra = found
        st = self.running[job.id]
        had = len(st.tasks)
        self._stop(st, Stopping(Stop.REQUEUE, grow_message(had, extra)), now)
        st.grew_from = had
        st.grows += 1
        self.grow_count += 1
        self.log.append((now, "grow", job.id, (f"from {had} of {job.num_tasks} tasks",)))

    def _reject(self, job_id: str, reason: str, now: float) -> None:
        self.pending.pop(job_id, None)  # pending when a cycle rejects it; not at its arrival
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
        if self._settled(now):
            self.pending_after_cycle = len(self.pending)
            return
        if self.membership_dirty:
            self._rebuild()
        snapshot = self.held.snapshot(self.queues)
        pending = self.pending.jobs()
        before = self.free.copy() if self.config.validate else None
        t0 = time.perf_counter()
        try:
            # The kept queue, not a copy: the cycle reads what changed from its log.
            result = run_cycle(
                snapshot, self.pending, self.policy, now, validate=self.config.validate
            )
        except InvariantViolation as e:  # the core's own validate mode caught a broken cycle
            raise SimulationError(f"t={now}: {e}") from e
        self.cycle_wall_s += time.perf_counter() - t0
        self.cycles += 1
        self._guard_livelock(now, result.decisions)
        if before is not None:
            self._check_cycle(now, before, pending, result.diagnostics)
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
        self._grow_if_idle(now)  # the cycle placed every job: idle capacity may grow one
        if self.coalesce and result.free_after is not None:
            # Shapes failed before still fail if what this cycle left is within what they
            # failed at: known without comparing when capacity was only taken since, in the
            # engine and in the cycle (one that preempts gives its victims' back); else only
            # this cycle's failures hold.
            stats = result.stats
            only_taken = not (stats.preempted or stats.shrunk)
            after, before, settled = result.free_after, self.settled_free, self.settled
            if not only_taken and not self.release_safe:
                settled = None  # its victims' usage moves when they stop
            elif settled is None or before is None:
                settled = result.failed_shapes
            elif (self.only_taken and only_taken) or after.within(before):
                settled = settled | result.failed_shapes
            else:
                settled = result.failed_shapes
            self.settled, self.settled_free = settled, after
            # After a preemption its victims still hold what the core counted free.
            self.only_taken = only_taken
            self.pending_after_cycle = len(self.pending)

    def _guard_livelock(self, now: float, decisions: Sequence[object]) -> None:
        at, count = self.instant
        count = count + 1 if at == now else 1
        self.instant = (now, count)
        if count > _MAX_CYCLES_AT_ONE_INSTANT:
            last = ", ".join(map(str, decisions[:4])) or "none"
            raise SimulationError(
                f"t={now}: {count} cycles at this instant without time moving on; the policy "
                f"keeps undoing its own decisions (the last cycle's: {last})"
            )

    def _settled(self, now: float) -> bool:
        """Whether the coming cycle would decide nothing, so it is skipped (coalesced with
        the next): every job new to it is of a shape that failed since, in a queue no limit
        governs (so it is admitted and its queue lets it start; only room could stop it); the
        free state is within what the last cycle left free, or else no shape waiting could
        fit it (`core.placement.may_fit`: capacity came back, too little for anyone); and,
        under a policy that preempts by rank, no running job ranks above any pending job's
        bar at `now` (`core.cycle.evicts_nobody`). Jobs it skips stay `fresh` for the next
        cycle that runs."""
        settled = self.settled
        if settled is None or self.settled_free is None:
            return False
        new = len(self.pending) - self.pending_after_cycle
        if new < 0:
            return False
        ungoverned = self.queues.ungoverned
        for pj in islice(self.pending.newest_first(), new):
            job = pj.job
            if job.shape_id not in settled or job.queue not in ungoverned:
                return False
        # Capacity given back since, beyond what the last cycle left free: a shape may fit.
        refreshed = not self.only_taken and not self.free.within(self.settled_free)
        if refreshed and not self._nothing_fits(settled):
            return False
        if self.preempts:
            snapshot = self.held.snapshot(self.queues)
            if not evicts_nobody(snapshot, self.pending, self.policy, now):
                return False
        if refreshed:
            # Every shape waiting fails here too: this state is the one they are settled on.
            self.settled = frozenset(job.shape_id for _, job in self.pending.shapes())
            self.settled_free, self.only_taken = self.free.copy(), True
        return True

    def _nothing_fits(self, settled: frozenset[Hashable]) -> bool:
        """Whether every shape pending failed since the last cycle and none could fit the
        free state now, by its room alone (`may_fit`): true, the cycle would place nobody."""
        arrays, free, memo = self.arrays, self.free, self.room_memo
        # A job of the shape that may have fitted last time is asked first: it usually still may,
        # and then the other shapes need no asking.
        hint = self.pending.of_shape(self.may_fit_hint)
        for job in chain(() if hint is None else (hint,), map(_JOB, self.pending.shapes())):
            if job.shape_id not in settled or may_fit(memo, arrays, free, job):
                self.may_fit_hint = job.shape_id
                return False
        return True

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
        waiting = self.waiting.keys() & (self.pending.keys() | self.running.keys())
        if waiting:
            problems.append(f"waiting for victims yet pending or running: {sorted(waiting)[:5]}")
        if not self.stopping.keys() <= self.running.keys():
            problems.append("a stopping job is not running")
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
        as_estimator(estimator),
        queues,
    )
    return engine.run()

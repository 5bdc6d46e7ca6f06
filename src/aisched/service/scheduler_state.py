"""The scheduler's live state and what every part of the loop uses of it.

`SchedulerState` owns the live jobs, the lifecycle's ledger (`Holdings`: free capacity, usage,
running views), the commands queue, the pipelines' bookkeeping and the counters; it builds the
pending and running views the core sees (`_make_pending`, `_take`, `_give`), follows the
executor's nodes (`_sync_nodes`), writes statuses and asks tasks to stop. The loop's other
parts are subclasses, one responsibility each, stacked in the order they use each other:
`launches` → `exits` → `intents` → `commands` → `recovery` → `loop.Scheduler`. A part that
calls one above it does so through a method declared here (`_on_exit`, `_apply_bind`,
`_check_dependencies`), so each module reads on its own.

Owned by the loop thread alone (see `loop`); `lock` guards what other threads read (the
nodes, the free capacity) while the nodes change.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace

from aisched.core.cycle import CycleResult
from aisched.core.decisions import Bind, TaskBinding
from aisched.core.policy import Policy
from aisched.core.snapshot import (
    ClusterArrays,
    FreeState,
    PendingJob,
    RunningJob,
    Snapshot,
    Usage,
    build_arrays,
)
from aisched.core.status import JobStatus, StatusCode
from aisched.executors.base import Executor, TaskExited
from aisched.lifecycle.attempts import Stop, time_limit_at
from aisched.lifecycle.elastic import grow_at
from aisched.lifecycle.holdings import Holdings
from aisched.lifecycle.preemption import VictimWait, waiting_reason
from aisched.lifecycle.work import checkpoint_interval_s, core_interval
from aisched.model.cluster import Cluster, Node
from aisched.model.job import Job, JobKind
from aisched.model.queue import QueueTree
from aisched.model.states import JobState
from aisched.predict.features import JobFeatures
from aisched.predict.runtime import RuntimePredictor
from aisched.service.live import Batch, LiveJob, Requests, TaskPhase
from aisched.service.loop_types import Command, LoopConfig, LoopStats
from aisched.service.membership import bindings_by_node, merge_nodes
from aisched.service.pipelines import Pipelines
from aisched.service.retention import Retention
from aisched.service.running_logs import RunningLogs
from aisched.service.step_errors import StepErrors, classify
from aisched.service.timers import Timer, Timers
from aisched.store.codec import (
    job_from_dict,
    job_to_dict,
    node_from_dict,
    node_to_dict,
    victim_wait_to_dict,
)
from aisched.store.db import Row, Store

log = logging.getLogger("aisched.loop")


def without_eta(policy: Policy) -> Policy:
    """`policy` without its `eta` action (itself when it has none): the same decisions."""
    if "eta" not in policy.action_names():
        return policy
    return replace(policy, actions=tuple(a for a in policy.actions if a.name != "eta"))


def _within_limit(job: Job, runtime_s: float) -> float:
    """A predicted runtime of `job`, no longer than its time limit (it cannot run longer)."""
    return runtime_s if job.time_limit_s is None else min(runtime_s, job.time_limit_s)


# The meta table's key for the nodes offered and those that left (`_keep_nodes`).
NODES_KEY = "nodes"


class SchedulerState:
    """Live state and the helpers every part uses (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        policy: Policy,
        queues: QueueTree,
        config: LoopConfig,
        *,
        clock: Callable[[], float] = time.time,
        on_cycle: Callable[[float, CycleResult], None] | None = None,
        predictor: RuntimePredictor | None = None,
    ) -> None:
        # How to make this state again, as new (`forget_recovery`).
        self._remake: Callable[[], None] = lambda: SchedulerState.__init__(
            self,
            store,
            executor,
            policy,
            queues,
            config,
            clock=clock,
            on_cycle=on_cycle,
            predictor=predictor,
        )
        self.store = store
        self.executor = executor
        self.policy = policy
        # The policy for the cycles between two that work out estimated starts: without the
        # `eta` action, which only writes statuses (`Intents._cycle`).
        self.policy_without_eta = without_eta(policy)
        self.queues = queues
        self.config = config
        self.clock = clock
        self.on_cycle = on_cycle
        # Learned runtimes for pending jobs (qssf order, backfill, reservations, ETAs); fed
        # with every job that succeeds, warmed from the store's history at start.
        self.predictor = predictor
        # The warm-up's fit is due, for the loop's first step to start (`warm_up`).
        self.fit_after_warm_up = False
        self.offered_nodes = tuple(executor.nodes())
        self.nodes = self.offered_nodes
        # Free capacity, usage and running views: the lifecycle's ledger (see `lifecycle`).
        self.held = Holdings(build_arrays(Cluster(self.nodes)))
        self.jobs: dict[str, LiveJob] = {}
        # How many jobs each account's live jobs may come to (`limits.user_max_jobs`,
        # `jobs_counted`), kept by `_add_live` and `_finish`, where a live job comes and goes;
        # by `Job.account`, so that a deleted account's jobs are not its name's next holder's.
        self.live_per_user: Counter[str] = Counter()
        # And the bytes of their documents (`limits.user_max_job_bytes`, `bytes_counted`).
        self.live_bytes_per_user: Counter[str] = Counter()
        # The jobs with a pending view (waiting to be placed, maybe held back for now), so a
        # step asks "does anything wait?" without walking every live job.
        self.queued: set[str] = set()
        # Time limits, backoffs and growth, by when they fall due (`_arm_timers`).
        self.timers = Timers()
        # Who waits on whom: a victim's id -> the jobs whose bind waits for it to stop (the
        # reverse of `LiveJob.waiting_for`, kept by `_set_waiting`), so a job's end looks up
        # its waiters instead of scanning every live job.
        self.waiters: dict[str, set[str]] = {}
        # What victims that jobs wait for gave back in this step, kept for the jobs whose
        # waits go on once every exit of the step is in (`intents._timers`).
        self.freed_now: list[tuple[str, tuple[TaskBinding, ...]]] = []
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        # Exits taken from the executor and not handled yet: `poll` hands each over once, so
        # the ones behind an exit whose handling raised wait here for the next step rather
        # than being lost with the failed one (their jobs would run for ever in the books).
        self.exits_due: deque[TaskExited] = deque()
        # Jobs held back until the jobs they depend on have ended (pipelines), and whether
        # their re-checks are being worked through (`Exits._recheck_dependents`).
        self.pipelines = Pipelines(store)
        self.rechecking = False
        # Jobs whose task exit, timers or dependency re-check raised (a bug met on that job
        # alone) → until when they are left alone (`Intents._hold_for_bug`): not every step
        # again, which would stop every other job's exits, timers, re-checks and cycles too.
        self.bug_held: dict[str, float] = {}
        # And the task exits of such jobs, handled when their hold is over.
        self.exits_held: dict[str, list[TaskExited]] = {}
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.next_seq = 1
        self.last_submit_s = 0.0
        self.dirty = True
        self.last_cycle_at = -math.inf
        self.next_cycle_not_before = -math.inf  # perf_counter time (see cycle_gap_factor)
        # Jobs submitted since the last cycle, and the (shape, queue) of the jobs that cycle
        # left waiting: a new job that could start now runs a cycle without waiting out the
        # gap (`Intents._fresh_could_start`).
        self.fresh: list[Job] = []
        self.waiting_shapes: set[tuple[int, str]] = set()
        # When the cycle last worked out every waiting job's estimated start (`eta_interval_s`).
        self.last_eta_at = -math.inf
        self.terminal_counts: dict[str, int] = {}
        # Nodes that left the cluster, by name, with when (`_sync_nodes`), kept for
        # `lost_node_grace_s`: what a waiting job is judged against meanwhile (`_with_lost`).
        self.left: dict[str, tuple[Node, float]] = {}
        # Nodes offered again after a restart under the same name but smaller (`_recall_nodes`:
        # the service restarted with fewer --gpus, say), by name, as they were before and since
        # when, kept for `lost_node_grace_s` like those that left. Only the jobs admitted
        # before are judged against their former size: a new one is refused as never fitting.
        self.shrank: dict[str, tuple[Node, float]] = {}
        # `_with_lost`'s last answer, with and without the shrunk nodes: a cycle and the
        # submissions between two cycles each ask for one, and neither rebuilds the other's.
        self._with_lost_cache: dict[bool, tuple[object, Snapshot]] = {}
        self.retention = Retention(
            config.data_dir,
            config.keep_ended_s,
            config.user_max_ended_bytes,
            keep_attempts=config.keep_attempts,
            keep_audit_s=config.keep_audit_s,
        )
        self.running_logs = RunningLogs(config.data_dir / "logs", config.user_max_running_log_bytes)
        self.stats = LoopStats()
        self.last_observed_s = -math.inf
        self.lock = threading.Lock()  # guards what readers of `view()` see
        # Attempts started outside a cycle (a shrunk elastic job restarted on its kept tasks,
        # a job whose victims have stopped started where the core bound it), launched once the
        # batch that wrote their task rows has committed.
        self.restarts: list[tuple[LiveJob, Requests]] = []
        # The one write batch of the loop. A flush that fails (a full disk, a wedged store)
        # keeps its writes and callbacks here, and the next flush retries them with what came
        # since: what was acted on in memory reaches the store in order, and nothing is acted
        # on (launched, signalled, answered) before it is stored.
        self.batch = Batch()
        self.step_errors = StepErrors()
        # Idempotency keys admitted but not yet stored ((user, key) -> rows), so a retry that
        # arrives in the same step finds them; the store answers for the rest.
        self.unstored_keys: dict[tuple[str, str], list[Row]] = {}
        self._empty_snapshot = Snapshot(self.arrays, FreeState.empty(self.arrays), (), queues)
        executor.set_wakeup(self.wake.set)

    def forget_recovery(self) -> None:
        """Back to the state of a scheduler just made, before `recover`: a recovery that the
        database's connection cut short is run again, whole, at the next election (adopting a
        task again is harmless: the executor keeps watching it once). What others hold on to
        stays: the queue of commands the API threads wait on, the loop's events and lock, its
        failures (readiness reads them)."""
        kept = {
            name: getattr(self, name)
            for name in ("commands", "wake", "stopping", "lock", "step_errors")
        }
        self._remake()
        self.__dict__.update(kept)
        self.executor.set_wakeup(self.wake.set)

    @property
    def arrays(self) -> ClusterArrays:
        return self.held.arrays

    @property
    def free(self) -> FreeState:
        return self.held.free

    @property
    def usage(self) -> dict[tuple[str, str], Usage]:
        return self.held.usage

    def _sync_nodes(self, extra: list[TaskBinding] | None = None) -> None:
        """Follow a cluster executor's nodes joining and leaving (see `membership`): rebuild the
        arrays and re-take every running binding when the node list changed. `extra`: bindings
        about to be taken (recovery) whose nodes must exist."""
        offered = tuple(self.executor.nodes())
        missing = extra and any(b.node not in self.arrays.index for b in extra)
        leftovers = len(self.nodes) != len(offered)  # gone nodes kept while bound: re-check
        if offered == self.offered_nodes and not missing and not leftovers:
            return
        if offered != self.offered_nodes:
            self._note_left(offered)
        running = [t for view in self.held.running() for t in view.tasks]
        nodes = merge_nodes(offered, self.nodes, bindings_by_node([*running, *(extra or [])]))
        self.offered_nodes = offered
        if nodes == self.nodes:
            return
        arrays = build_arrays(Cluster(nodes))
        with self.lock:
            self.nodes = nodes
            self.held.rebuild(arrays)
        self._empty_snapshot = Snapshot(arrays, FreeState.empty(arrays), (), self.queues)
        self.dirty = True
        log.info("nodes: %s", ", ".join(n.name + ("" if n.healthy else " (gone)") for n in nodes))

    def _note_left(self, offered: tuple[Node, ...]) -> None:
        """Remember the nodes offered before and not now; forget those offered again."""
        now, names = self.clock(), {n.name for n in offered}
        for n in self.offered_nodes:
            if n.name not in names:
                self.left[n.name] = (n, now)
        for name in names:
            self.left.pop(name, None)
        for n in offered:  # a shrunk node offered as large as before again
            if n.name in self.shrank and not _smaller(n, self.shrank[n.name][0]):
                del self.shrank[n.name]
        self._keep_nodes(offered)

    def _keep_nodes(self, offered: tuple[Node, ...]) -> None:
        """Store the nodes offered and those that left, for `_recall_nodes` after a restart."""
        doc = {
            "offered": [node_to_dict(n) for n in offered],
            "left": [[node_to_dict(n), at] for n, at in self.left.values()],
            "shrank": [[node_to_dict(n), at] for n, at in self.shrank.values()],
        }
        with self.store.tx() as tx:
            tx.set_meta(NODES_KEY, doc)

    def _recall_nodes(self) -> None:
        """After a restart: the nodes that had left, and those offered before and not now
        (left while the service was down, or not back yet), count as left, so a waiting job
        that fits only with them waits `lost_node_grace_s` for them as it did before, rather
        than failing at once as never fitting. Those not known to have left before are taken
        to have left now. Likewise a node offered now smaller than before (or than before an
        earlier restart, within the grace) counts as shrunk: a job admitted before that fits
        only its former size waits for it as for a node that left."""
        with self.store.read() as tx:
            doc = tx.get_meta(NODES_KEY)
        now = self.clock()
        here = {n.name: n for n in self.offered_nodes}
        try:
            offered = [node_from_dict(d) for d in (doc or {}).get("offered", ())]
            before = [(n, now) for n in offered]
            before += [(node_from_dict(d), float(at)) for d, at in (doc or {}).get("left", ())]
            shrank = [(node_from_dict(d), float(at)) for d, at in (doc or {}).get("shrank", ())]
        except (KeyError, TypeError, ValueError) as e:  # no version of aisched wrote it
            log.warning("the stored node list cannot be read (%s): it is written anew", e)
            before, offered, shrank = [], [], []
        for node, at in before:  # the nodes known to have left last: their time stands
            if node.name not in here:
                self.left[node.name] = (node, at)
        # The size known before an earlier restart first: its time stands, as a left node's.
        for node, at in [*shrank, *((n, now) for n in offered)]:
            known = node.name in self.shrank
            if node.name in here and not known and _smaller(here[node.name], node):
                self.shrank[node.name] = (node, at)
        self._keep_nodes(self.offered_nodes)

    def _with_lost(
        self, now: float, shrunk: bool = True
    ) -> tuple[Snapshot | None, list[str], list[str]]:
        """The empty cluster with the nodes that left within `lost_node_grace_s` back and,
        with `shrunk`, those that shrank at a restart within it as large as they were; with
        the names of either. (None, [], []) when there are none."""
        grace = self.config.lost_node_grace_s
        for gone in (self.left, self.shrank):
            for name, (_, at) in list(gone.items()):
                if now - at > grace:
                    del gone[name]
        shrank = self.shrank if shrunk else {}
        if not self.left and not shrank:
            return None, [], []
        key = (tuple(sorted(self.left)), tuple(sorted(shrank)), self.nodes)
        cached = self._with_lost_cache.get(shrunk)
        if cached is None or cached[0] != key:
            by_name = {n.name: n for n in self.nodes}
            for name, (node, _) in self.left.items():
                by_name.setdefault(name, node)
            for name, (node, _) in shrank.items():
                by_name[name] = node
            nodes = tuple(replace(n, healthy=True) for n in by_name.values())
            arrays = build_arrays(Cluster(nodes))
            snap = Snapshot(arrays, FreeState.empty(arrays), (), self.queues)
            cached = self._with_lost_cache[shrunk] = (key, snap)
        return cached[1], sorted(self.left), sorted(shrank)

    def _admitting_against(self, now: float) -> Snapshot:
        """What a submission is judged against: the empty cluster, with the nodes that left
        lately back (a job for them waits for them, as one already admitted does). Not the
        nodes that shrank at a restart: the operator chose their new size, and a job too
        large for it is refused."""
        return self._with_lost(now, shrunk=False)[0] or self._empty_snapshot

    def _add_live(self, lj: LiveJob) -> None:
        self.jobs[lj.id] = lj
        counted = jobs_counted(lj.job)
        self.live_per_user[lj.job.account] += counted
        lj.doc_bytes = doc_bytes(lj.job)
        lj.counted_bytes = counted * lj.doc_bytes
        self.live_bytes_per_user[lj.job.account] += lj.counted_bytes

    def _make_pending(self, lj: LiveJob, batch: Batch) -> None:
        lj.running_view = None
        estimate, upper = self._predict(lj)
        if estimate is not None:
            batch.job(lj.id, predicted_s=estimate, predicted_upper_s=upper)
        lj.pending_view = PendingJob(lj.job, lj.attained_gpu_s, lj.attempt, estimate, upper)
        self.queued.add(lj.id)

    def _unqueue(self, lj: LiveJob) -> PendingJob | None:
        """Take `lj` out of the waiting jobs (bound, started as a service, or ended); returns
        the view it waited with."""
        view, lj.pending_view = lj.pending_view, None
        self.queued.discard(lj.id)
        return view

    def _arm_timers(self, lj: LiveJob) -> None:
        """Arm the timers of `lj`'s current state; called wherever that state gains one (an
        attempt bound or recovered, a backoff set). Old entries are left to go stale."""
        if lj.state == JobState.RUNNING:
            self.timers.add(time_limit_at(lj.job, lj.attempt_started_at), Timer.LIMIT, lj.id)
            self.timers.add(self._grow_at(lj), Timer.GROW, lj.id)
        elif lj.not_before is not None:
            self.timers.add(lj.not_before, Timer.BACKOFF, lj.id)

    def _timer_stands(self, kind: Timer, job_id: str, due: float) -> bool:
        """Whether a timer armed for `due` is still what the job's state says is due."""
        lj = self.jobs.get(job_id)
        if lj is None:
            return False
        if kind == Timer.BACKOFF:
            return lj.state == JobState.PENDING and lj.not_before == due
        if lj.state != JobState.RUNNING or lj.stopping is not None:
            return False
        if kind == Timer.LIMIT:
            return time_limit_at(lj.job, lj.attempt_started_at) == due
        return self._grow_at(lj) == due

    def _grow_at(self, lj: LiveJob) -> float:
        return grow_at(
            lj.job,
            len(lj.tasks),
            lj.attempt_started_at,
            self.config.elastic_grow_after_s,
            lj.grew_from,
        )

    def _predict(self, lj: LiveJob) -> tuple[float | None, float | None]:
        """The predictor's (median, upper) runtime of `lj`, capped by its time limit; (None,
        None) without a predictor, and for a service's replica (`serves_until_scaled_down`)."""
        if self.predictor is None or lj.job.serves_until_scaled_down:
            return None, None
        p = self.predictor.predict(JobFeatures.from_job(lj.job, self._predictor_now()))
        return _within_limit(lj.job, p.median_s), _within_limit(lj.job, p.upper_s)

    def _refreshed_upper(self, lj: LiveJob) -> float | None:
        """`lj`'s upper runtime calibrated again as it starts, from the jobs finished by now
        (`RuntimePredictor.refresh`), capped by its time limit; None when the predictor keeps
        the bound it waited with (no predictor, refresh off, its own estimate, too few
        residuals)."""
        if self.predictor is None:
            return None
        upper = self.predictor.refresh(lj.id, self._predictor_now())
        return None if upper is None else _within_limit(lj.job, upper)

    def _predictor_now(self) -> float:
        """The time to ask the predictor at: never before a finish it has been told of (a
        clock step back is no leak)."""
        return max(self.clock(), self.last_observed_s)

    def _take(self, lj: LiveJob, pending: PendingJob | None = None) -> None:
        """Hold `lj`'s tasks' resources and build its running view. Its expected end uses the
        same bound the core used to bind it (`pending`, the view it was pending with): the
        predicted upper runtime first, then the user's estimate, then the time limit, so a
        preemptive policy (`qssf`) does not treat an unestimated running job as endless. The
        predicted upper runtime is calibrated again as the job starts (`_refreshed_upper`), as
        the simulator does; the bound it waited with is kept beside it (`waited_end_s`)."""
        start = lj.attempt_started_at or self.clock()
        waited_end = None  # the end the bound it waited with gives, when a new one replaces it
        if pending is None:  # recovered after a restart: predict again
            estimate, upper = self._predict(lj)
            pending = PendingJob(lj.job, lj.attained_gpu_s, lj.attempt, estimate, upper)
        else:
            upper = self._refreshed_upper(lj)
            if upper is not None:
                waited = pending.runtime_bound_s
                waited_end = None if waited is None else start + waited
                pending = replace(pending, estimate_upper_s=upper)
        bound = pending.runtime_bound_s
        view = RunningJob(
            lj.job,
            tuple(t.binding for t in lj.tasks),
            start,
            lj.attained_gpu_s,
            expected_end_s=None if bound is None else start + bound,
            checkpoint_interval_s=core_interval(
                checkpoint_interval_s(lj.job, self.config.checkpoint_interval_s)
            ),
            terminating=lj.stopping is not None,
            waited_end_s=waited_end,
        )
        self.held.take(view)
        lj.running_view = view

    def _give(self, lj: LiveJob, now: float) -> None:
        if lj.running_view is None:
            return
        view = self.held.give(lj.id)
        lj.attained_gpu_s = view.attained_at(now)
        lj.running_view = None

    def _wait_for_victims(self, lj: LiveJob, wait: VictimWait | None, batch: Batch) -> None:
        """Make `lj` wait for `wait`'s victims to stop (None: it waits no more). Stored with
        the job: a restart that forgot the wait made it an ordinary pending job, and the next
        cycle preempted another victim for it while the first one was still stopping. Its
        reason names the victims still stopping: written once when the wait began, it named
        the victims that had stopped since for as long as the others took."""
        victims = frozenset() if wait is None else wait.victims
        if victims != lj.waiting_for:
            batch.job(lj.id, waiting_for=None if wait is None else victim_wait_to_dict(wait))
        self._set_waiting(lj, victims)
        lj.waiting_since = None if wait is None else wait.since
        lj.waiting_tasks = () if wait is None else wait.tasks
        if victims:
            # Named by why each stops: not every job a wait is for was preempted.
            why = waiting_reason({v: _stop_of(self.jobs.get(v)) for v in victims})
            self._write_status(lj, JobStatus(StatusCode.PREEMPTING, why), batch)

    def _set_waiting(self, lj: LiveJob, victims: frozenset[str]) -> None:
        """Make `lj` wait for `victims` (none: it waits no more), keeping `waiters` exact."""
        for v in lj.waiting_for - victims:
            mine = self.waiters.get(v)
            if mine is not None:
                mine.discard(lj.id)
                if not mine:
                    del self.waiters[v]
        for v in victims - lj.waiting_for:
            self.waiters.setdefault(v, set()).add(lj.id)
        lj.waiting_for = victims

    def _hold_until(self, lj: LiveJob, status: JobStatus, batch: Batch) -> None:
        """Keep `lj` out of cycles until `status.eta_s`: its `not_before` (stored, so a
        restart keeps it) and the backoff timer that lets it back in, with `status` saying
        why."""
        until = status.eta_s
        assert until is not None
        lj.not_before = until
        batch.job(lj.id, not_before=until)
        self.timers.add(until, Timer.BACKOFF, lj.id)
        self._write_status(lj, status, batch)

    def _write_status(
        self, lj: LiveJob, status: JobStatus, batch: Batch, keep_eta: bool = False
    ) -> None:
        """Store `lj`'s status if it changed. `keep_eta`: the cycle worked out no estimated
        starts (`eta_interval_s`), so a waiting job keeps the one last written for it."""
        eta = status.eta_s if status.eta_s is not None and math.isfinite(status.eta_s) else None
        if (
            eta is None
            and keep_eta
            and lj.written_status is not None
            and not status.code.is_placed
            and status.code != StatusCode.NEVER_FITS
        ):
            eta = lj.written_status[2]
        got = (status.code.value, status.reason, eta)
        if got != lj.written_status:
            lj.written_status = got
            batch.job(lj.id, reason_code=got[0], reason=got[1], eta=eta)

    def _stop_tasks(self, lj: LiveJob, batch: Batch) -> None:
        """Ask every live task of the job to stop, once the batch has committed."""
        keys = [lj.key(t) for t in lj.live_tasks() if t.phase == TaskPhase.RUNNING]
        grace = lj.job.grace_period_s

        def act() -> None:
            for k in keys:
                self.executor.stop(k, grace)

        batch.after.append(act)

    def _observe(self, job: Job, started_s: float, finished_s: float, fit: bool = True) -> None:
        """Teach the predictor a runtime (of the attempt that succeeded: earlier attempts'
        work was either lost or is what the checkpoint saved it); `fit=False`: see `warm_up`."""
        if self.predictor is None or finished_s <= started_s:
            return
        finished_s = max(finished_s, self.last_observed_s)  # a clock step back is no leak
        self.predictor.observe(
            JobFeatures.from_job(job, job.submit_time_s),
            finished_s - started_s,
            finished_s,
            fit=fit and not self.fit_after_warm_up,  # until the first step: see `warm_up`
        )
        self.last_observed_s = finished_s

    def warm_up(self) -> int:
        """Feed the predictor the store's finished jobs, oldest finish first; returns how many.
        Nothing is fitted here, on the start path: the loop's first step starts the one fit
        due on all of them (`fit_after_warm_up`), and the jobs recovered meanwhile get the
        history's answers."""
        if self.predictor is None:
            return 0
        with self.store.read() as tx:
            rows = tx.succeeded_jobs(self.predictor.config.window)
        for row in rows:
            self._observe(
                job_from_dict(row["spec"]), row["attempt_started_at"], row["finished_at"], fit=False
            )
        self.fit_after_warm_up = True
        return len(rows)

    # Declared here, defined by the part that owns them (see the module docstring).

    def _on_exit(self, ev: TaskExited, batch: Batch, now: float) -> None:
        raise NotImplementedError  # exits.Exits

    def _apply_bind(self, d: Bind, batch: Batch, now: float) -> tuple[LiveJob, Requests] | None:
        raise NotImplementedError  # intents.Intents

    def _check_dependencies(self, lj: LiveJob, batch: Batch, now: float) -> None:
        raise NotImplementedError  # commands.Commands

    def _scale_to(
        self,
        svc: LiveJob,
        n: int,
        reason: str,
        batch: Batch,
        now: float,
        ready: frozenset[str] | None = None,
    ) -> None:
        raise NotImplementedError  # commands.Commands

    def _hold_for_bug(self, lj: LiveJob, error: Exception, what: str, now: float) -> None:
        raise NotImplementedError  # intents.Intents

    def _holds_for(self, error: Exception) -> bool:
        """Whether `error`, met handling one job's exit, timers or re-check, holds that job
        (`_hold_for_bug`) rather than failing the step: a bug does, outside validate mode
        (tests want the bug); a store's or a disk's failure fails the step, which is retried."""
        return not self.config.validate and classify(error) == "bug"


def jobs_counted(job: Job) -> int:
    """What a live job counts for against `limits.user_max_jobs`: a service, itself and every
    replica it may scale to (its replicas are admitted as it scales, unchecked), so they count
    nothing of their own; any other job, one."""
    if job.replica_of is not None:
        return 0
    if job.kind == JobKind.SERVICE and job.service is not None:
        return 1 + job.service.max_replicas
    return 1


def bytes_counted(job: Job) -> int:
    """What a live job counts for against `limits.user_max_job_bytes`: the size of its document
    as the store keeps it, once for each job it counts as (`jobs_counted`)."""
    counted = jobs_counted(job)
    return counted * doc_bytes(job) if counted else 0


def doc_bytes(job: Job) -> int:
    """The size of a job's document as the store keeps it."""
    return len(json.dumps(job_to_dict(job)))


def clock(t: float, now: float | None = None) -> str:
    """`t` (seconds since the epoch) as stored reasons name a time: the server's local time
    with its zone ("07:11:51 JST"), and the date when that is not the day of `now` (the
    present by default) there ("2026-12-08 07:11:51 JST"). A reason is read later, and by
    people in other zones (the dashboard shows its ETA in the browser's)."""
    at = time.localtime(t)
    today = time.localtime(time.time() if now is None else now)
    same_day = (at.tm_year, at.tm_yday) == (today.tm_year, today.tm_yday)
    return time.strftime("%H:%M:%S %Z" if same_day else "%Y-%m-%d %H:%M:%S %Z", at)


def _smaller(now: Node, before: Node) -> bool:
    """Whether `now` lacks some of what the same node had `before` (CPUs, memory, GPUs, GPU
    memory, RDMA devices)."""
    return not before.capacity.fits_in(now.capacity)


def _stop_of(lj: LiveJob | None) -> Stop | None:
    return None if lj is None else lj.stopping

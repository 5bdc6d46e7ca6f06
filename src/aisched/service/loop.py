"""The scheduler's control loop: read state → run the core → write intent → act → observe.

One thread owns all live state (`LiveJob`s, the free capacity, the running views) and is the
only writer of the store. Other threads talk to it through `submit` / `cancel`, which queue a
command and return a Future, and read finished facts from the store.

A step of the loop:

1. Take the queued commands (submissions, cancellations) and the executor's task exits, and
   the timers that fell due (time limits, retry backoff, victims that take too long).
2. Flush those changes in one transaction; only then reply to callers and signal tasks.
3. When something changed (or `cycle_interval_s` passed with work waiting), run one cycle of
   the pure core on a snapshot of the live state.
4. Write every decision's intent (the job RUNNING, its task rows `launching`; the victims'
   `stopping`), commit, then act: stop victims, launch tasks, record their handles.

An elastic job shrunk for another (a `Shrink` decision) is stopped like a victim (SIGTERM, so
it checkpoints) and, once every task has exited, restarted at once on the tasks it keeps, as a
new attempt with the smaller world size; the job it shrank for waits for that, like for a
victim, and then takes the freed capacity in the next cycle.

Invariants: a job is in at most one of pending and running; resources are taken from `free`
when an attempt is bound and given back only when every task of it has exited; a task row is
written before its process may exist; a preemption's beneficiary waits (out of the cycle) until
its victims have stopped, so it never runs beside them. After a crash, `recover` rebuilds all of
this from the store and the executor's `adopt`, before the first cycle.
"""

from __future__ import annotations

import logging
import math
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from aisched.core.cycle import CycleResult, never_runs, run_cycle
from aisched.core.decisions import Bind, Preempt, Shrink, TaskBinding
from aisched.core.dependencies import DependencyVerdict
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
from aisched.executors.base import (
    AdoptState,
    Executor,
    ExitKind,
    LaunchError,
    TaskExited,
    TaskHandle,
    TaskLaunch,
    TaskPlace,
    contract_env,
    master_addr_for,
    task_name,
)
from aisched.lifecycle.attempts import (
    Requeue,
    RestartOn,
    after_attempt,
    time_limit_at,
    time_limit_message,
)
from aisched.lifecycle.elastic import grow_at, grow_message, tasks_to_grow
from aisched.lifecycle.holdings import Holdings
from aisched.lifecycle.states import move
from aisched.model.cluster import Cluster
from aisched.model.job import Job, JobKind
from aisched.model.queue import QueueTree
from aisched.model.states import JobState
from aisched.predict.features import JobFeatures
from aisched.predict.runtime import RuntimePredictor
from aisched.service.live import Batch, LiveJob, LiveTask, Stop, TaskPhase
from aisched.service.membership import bindings_by_node, merge_nodes
from aisched.service.pipelines import DependencyError, Pipelines
from aisched.service.replicas import HOST_ENV, replica_job
from aisched.store.codec import job_from_dict, job_to_dict
from aisched.store.db import Row, Store

log = logging.getLogger("aisched.loop")


@dataclass(frozen=True, slots=True)
class LoopConfig:
    data_dir: Path
    cycle_interval_s: float = 5.0
    max_backoff_s: float = 300.0
    # The longest the loop sleeps without being woken (a safety net for missed wake-ups).
    tick_s: float = 1.0
    # A preemption's beneficiary gives up waiting for its victims after their grace period plus
    # this, and is scheduled afresh (a victim that never stops must not block it forever).
    victim_wait_s: float = 30.0
    master_addr: str = "127.0.0.1"
    # Variables every task starts with, under its own and the contract's (PATH, HOME, ...).
    base_env: tuple[tuple[str, str], ...] = ()
    # After a cycle that took t seconds, the next waits at least t x this: under a stream of
    # submissions the queue grows and so does a cycle; this keeps three quarters of the time
    # for taking submissions in, while an idle scheduler (fast cycles) still answers at once.
    cycle_gap_factor: float = 3.0
    # An elastic job missing tasks is grown (restarted larger from its checkpoint) once it has
    # run this long in its attempt, idle capacity fits more of its tasks and nothing waits.
    elastic_grow_after_s: float = 60.0


class Rejected(Exception):
    """A command refused: `status` is the HTTP status the API answers with."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class _Submit:
    job: Job
    fmt: str
    warnings: tuple[str, ...]
    received_at: float
    future: Future[Row]


@dataclass(frozen=True, slots=True)
class _SubmitAll:
    """Jobs submitted together (a pipeline): all are stored, or none."""

    items: tuple[tuple[Job, str, tuple[str, ...]], ...]  # (job, format, warnings)
    received_at: float
    future: Future[list[Row]]


@dataclass(frozen=True, slots=True)
class _Scale:
    """Keep `replicas` live replicas of service `service_id` (the autoscaler's command)."""

    service_id: str
    replicas: int
    reason: str
    future: Future[int]


@dataclass(frozen=True, slots=True)
class _Cancel:
    job_id: str
    future: Future[str]


_Command = _Submit | _SubmitAll | _Scale | _Cancel


@dataclass(slots=True)
class LoopStats:
    """Counters the metrics endpoint reads (written by the loop thread only)."""

    cycles: int = 0
    last_cycle_s: float = 0.0
    cycle_durations: list[float] | None = None


class Scheduler:
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
        self.store = store
        self.executor = executor
        self.policy = policy
        self.queues = queues
        self.config = config
        self.clock = clock
        self.on_cycle = on_cycle
        # Learned runtimes for pending jobs (qssf order, backfill, reservations, ETAs); fed
        # with every job that succeeds, warmed from the store's history at start.
        self.predictor = predictor
        self.offered_nodes = tuple(executor.nodes())
        self.nodes = self.offered_nodes
        # Free capacity, usage and running views: the lifecycle's ledger (see `lifecycle`).
        self.held = Holdings(build_arrays(Cluster(self.nodes)))
        self.jobs: dict[str, LiveJob] = {}
        self.commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        # Jobs held back until the jobs they depend on have ended (pipelines).
        self.pipelines = Pipelines(store)
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.next_seq = 1
        self.last_submit_s = 0.0
        self.dirty = True
        self.last_cycle_at = -math.inf
        self.next_cycle_not_before = -math.inf  # perf_counter time (see cycle_gap_factor)
        self.terminal_counts: dict[str, int] = {}
        self.stats = LoopStats()
        self.last_observed_s = -math.inf
        self.lock = threading.Lock()  # guards what readers of `view()` see
        # Shrunk elastic jobs restarted on their kept tasks, launched once the batch that wrote
        # their task rows has committed.
        self.restarts: list[tuple[LiveJob, list[TaskLaunch]]] = []
        self._empty_snapshot = Snapshot(self.arrays, FreeState.empty(self.arrays), (), queues)
        executor.set_wakeup(self.wake.set)

    @property
    def arrays(self) -> ClusterArrays:
        return self.held.arrays

    @property
    def free(self) -> FreeState:
        return self.held.free

    @property
    def usage(self) -> dict[tuple[str, str], Usage]:
        return self.held.usage

    # --- the public face (any thread) -------------------------------------------------------

    def submit(self, job: Job, fmt: str = "native", warnings: tuple[str, ...] = ()) -> Future[Row]:
        """Queue a job (its id is set by the loop; its submit time is now); the Future gives
        the job's row as stored once it is durable, or raises Rejected (e.g. it can never fit
        this machine)."""
        fut: Future[Row] = Future()
        self.commands.put(_Submit(job, fmt, warnings, self.clock(), fut))
        self.wake.set()
        return fut

    def submit_all(self, items: tuple[tuple[Job, str, tuple[str, ...]], ...]) -> Future[list[Row]]:
        """Queue jobs submitted together, each (job, format, warnings); their `depends_on`
        name jobs of `items` by name, or earlier jobs by id. The Future gives every job's row,
        in order, or raises Rejected and stores none of them."""
        fut: Future[list[Row]] = Future()
        self.commands.put(_SubmitAll(items, self.clock(), fut))
        self.wake.set()
        return fut

    def scale(self, service_id: str, replicas: int, reason: str) -> Future[int]:
        """Ask for `replicas` live replicas of a service: new ones are submitted, surplus ones
        cancelled (pending ones first, then the newest). The Future gives the number asked
        for, or raises Rejected(404/409) for an unknown or ended service."""
        fut: Future[int] = Future()
        self.commands.put(_Scale(service_id, replicas, reason, fut))
        self.wake.set()
        return fut

    def cancel(self, job_id: str) -> Future[str]:
        """Cancel a job: at once if pending, after its tasks stopped if running. The Future
        gives the job's state after the command; Rejected(404/409) if unknown or finished."""
        fut: Future[str] = Future()
        self.commands.put(_Cancel(job_id, fut))
        self.wake.set()
        return fut

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="aisched-loop", daemon=True)
        self.thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; running tasks keep running and are adopted at the next start."""
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout_s)
        self.executor.close()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                delay = self.step()
            except Exception:  # a bug must not kill the service; it is logged loudly
                log.exception("scheduler step failed")
                delay = self.config.tick_s
            self.wake.wait(delay)
            self.wake.clear()

    # --- recovery ---------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Rebuild live state from the store; adopt or account for every task that may be
        running. Returns a line per notable finding (for the service log)."""
        notes: list[str] = []
        learned = self.warm_up()
        if learned:
            notes.append(f"runtime predictor learned from {learned} finished jobs")
        now = self.clock()
        batch = Batch()
        with self.store.read() as tx:
            self.next_seq = tx.max_seq() + 1
            rows = tx.live_jobs()
            task_rows = {(r["job_id"], r["attempt"], r["name"]): r for r in tx.running_tasks()}
            counts = tx.count_by_state()
        self.terminal_counts = {s: counts.get(s, 0) for s in ("succeeded", "failed", "cancelled")}
        for row in rows:
            lj = self._live_from_row(row)
            self.jobs[lj.id] = lj
            if row["submitted_at"] > self.last_submit_s:
                self.last_submit_s = row["submitted_at"]
            if lj.state != JobState.RUNNING:
                if lj.job.kind != JobKind.SERVICE:  # a pending service waits on dependencies
                    self._make_pending(lj, batch)
                continue
            if lj.job.kind == JobKind.SERVICE:  # its work is its replicas, jobs of their own
                continue
            with self.store.read() as tx:
                trows = tx.tasks_of(lj.id, lj.attempt)
            lj.tasks = [self._task_from_row(r) for r in trows]
            if not lj.tasks:  # running with no task written: the bind never got that far
                lj.state = move(lj.id, lj.state, JobState.PENDING)
                batch.job(lj.id, state=JobState.PENDING.value, stopping=None)
                batch.event(now, lj.id, "requeued", "requeued: no task was started")
                self._make_pending(lj, batch)
                continue
            self._sync_nodes([t.binding for t in lj.tasks])
            self._take(lj)
            exits: list[TaskExited] = []
            for t in lj.tasks:
                if t.phase == TaskPhase.EXITED:
                    continue
                key = lj.key(t)
                handle = t.handle or TaskHandle(key, t.binding.node, {})
                state, exited = self.executor.adopt(handle)
                if state == AdoptState.RUNNING:
                    t.phase = TaskPhase.RUNNING
                    batch.event(now, lj.id, "adopted", f"task {t.name} still running: adopted")
                    notes.append(f"job {lj.id}: adopted task {t.name}")
                elif state == AdoptState.EXITED and exited is not None:
                    exits.append(exited)
                else:
                    never_started = key in task_rows and task_rows[key]["state"] == "launching"
                    if never_started and lj.stopping is None:
                        lj.stopping = Stop.REQUEUE
                        lj.stop_message = "its launch was interrupted by a scheduler restart"
                    exits.append(
                        exited
                        or TaskExited(
                            key,
                            ExitKind.LOST,
                            None,
                            "lost: the task's process was gone when the scheduler restarted",
                            now,
                        )
                    )
                    notes.append(f"job {lj.id}: task {t.name} lost")
            if lj.stopping is not None:  # a stop was under way: finish it
                for t in lj.live_tasks():
                    if t.phase == TaskPhase.RUNNING:
                        self.executor.stop(lj.key(t), lj.job.grace_period_s)
            for ev in exits:
                self._on_exit(ev, batch, now)
        for lj in list(self.jobs.values()):
            if lj.job.depends_on and lj.state == JobState.PENDING:
                self._check_dependencies(lj, batch, now)
        batch.flush(self.store)
        self._launch_restarts(now)
        self.dirty = True
        return notes

    def _live_from_row(self, row: Row) -> LiveJob:
        job = job_from_dict(row["spec"])
        return LiveJob(
            job=job,
            state=JobState(row["state"]),
            submitted_at=row["submitted_at"],
            checkpoint_dir=row["checkpoint_dir"],
            attempt=row["attempt"],
            failures=row["failures"],
            preemptions=row["preemptions"],
            started_at=row["started_at"],
            attempt_started_at=row["attempt_started_at"],
            not_before=row["not_before"],
            stopping=Stop(row["stopping"]) if row["stopping"] else None,
            attained_gpu_s=row["attained_gpu_s"],
            exit_code=row["exit_code"],
            written_status=(row["reason_code"] or "", row["reason"] or "", row["eta"]),
        )

    def _task_from_row(self, r: Row) -> LiveTask:
        binding = TaskBinding(
            group=r["grp"],
            index=r["idx"],
            node=r["node"],
            gpus=tuple(r["gpus"]),
            gpu_milli=r["gpu_milli"],
            milli_cpu=r["milli_cpu"],
            mem_mib=r["mem_mib"],
            gpu_mem_mib=r["gpu_mem_mib"],
        )
        handle = None
        if r["handle"] is not None:
            handle = TaskHandle((r["job_id"], r["attempt"], r["name"]), r["node"], r["handle"])
        phase = TaskPhase(r["state"])
        exited = None
        if phase == TaskPhase.EXITED:
            exited = TaskExited(
                (r["job_id"], r["attempt"], r["name"]),
                ExitKind(r["exit_kind"]),
                r["exit_code"],
                r["message"] or "",
                r["finished_at"] or 0.0,
            )
        return LiveTask(r["name"], r["rank"], binding, r["log_path"], phase, handle, exited)

    # --- one step ---------------------------------------------------------------------------

    def step(self) -> float:
        """Run one step; returns how long the loop may sleep before the next one."""
        self._sync_nodes()
        now = self.clock()
        batch = Batch()
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Submit):
                self._on_submit(cmd, batch, now)
            elif isinstance(cmd, _SubmitAll):
                self._on_submit_all(cmd, batch, now)
            elif isinstance(cmd, _Scale):
                self._on_scale(cmd, batch, now)
            else:
                self._on_cancel(cmd, batch, now)
        for ev in self.executor.poll():
            self._on_exit(ev, batch, now)
        self._timers(batch, now)
        batch.flush(self.store)
        self._launch_restarts(now)
        pending = [
            lj.pending_view
            for lj in self.jobs.values()
            if lj.pending_view is not None
            and not lj.waiting_for
            and (lj.not_before is None or lj.not_before <= now)
            and lj.id not in self.pipelines.blocked
        ]
        due = now - self.last_cycle_at >= self.config.cycle_interval_s
        if pending and (self.dirty or due):
            if time.perf_counter() < self.next_cycle_not_before:
                return max(self.next_cycle_not_before - time.perf_counter(), 0.0)
            self._cycle(now, pending)
        elif not pending:
            self.dirty = False
            # Capacity freed by preemption or shrinking is owed to the job waiting for it.
            if not any(lj.waiting_for for lj in self.jobs.values()):
                self._grow_elastic(now)
        return self._sleep_for(now)

    def _grow_elastic(self, now: float) -> None:
        """Nothing waits: restart elastic jobs that idle capacity could make larger. The stop
        is a requeue (SIGTERM first, so they checkpoint; no failure counted); the next cycle
        places each with as many tasks as fit."""
        batch = Batch()
        for lj in list(self.jobs.values()):
            if lj.state != JobState.RUNNING or lj.stopping is not None:
                continue
            held = len(lj.tasks)
            after = self.config.elastic_grow_after_s
            if now < grow_at(lj.job, held, lj.attempt_started_at, after, lj.grew_from):
                continue
            extra = tasks_to_grow(lj.job, held, self.arrays, self.free)
            if extra < 1:
                continue
            lj.stopping = Stop.REQUEUE
            lj.grew_from = held
            lj.stop_message = grow_message(held, extra)
            batch.job(lj.id, stopping=Stop.REQUEUE.value)
            batch.event(now, lj.id, "growing", lj.stop_message)
            self._stop_tasks(lj, batch)
        batch.flush(self.store)

    def _sleep_for(self, now: float) -> float:
        delay = self.config.tick_s
        waiting = False
        for lj in self.jobs.values():
            if lj.not_before is not None and lj.state == JobState.PENDING:
                delay = min(delay, max(lj.not_before - now, 0.0))
            if lj.state == JobState.RUNNING and lj.stopping is None:
                ends = time_limit_at(lj.job, lj.attempt_started_at)
                delay = min(delay, max(ends - now, 0.0))
                # An elastic job short of tasks is looked at when it may first grow; after
                # that, whenever something changes (a step runs then anyway).
                grows = grow_at(
                    lj.job,
                    len(lj.tasks),
                    lj.attempt_started_at,
                    self.config.elastic_grow_after_s,
                    lj.grew_from,
                )
                if grows > now:
                    delay = min(delay, grows - now)
            waiting = waiting or (
                lj.pending_view is not None and lj.id not in self.pipelines.blocked
            )
        if waiting:
            delay = min(delay, max(self.last_cycle_at + self.config.cycle_interval_s - now, 0.0))
        return max(delay, 0.0)

    # --- commands ---------------------------------------------------------------------------

    def _on_submit(self, cmd: _Submit, batch: Batch, now: float) -> None:
        refusal = never_runs(self._empty_snapshot, self.policy, replace(cmd.job, id="?"))
        if refusal is not None:
            cmd.future.set_exception(Rejected(refusal))
            return
        row = self._admit(cmd.job, cmd.fmt, cmd.warnings, cmd.received_at, batch)
        batch.after.append(lambda: cmd.future.set_result(row))

    def _on_submit_all(self, cmd: _SubmitAll, batch: Batch, now: float) -> None:
        # 1. Refuse the whole submission if any job of it can never run or depend as asked.
        for job, _fmt, _warnings in cmd.items:
            refusal = never_runs(self._empty_snapshot, self.policy, replace(job, id="?"))
            if refusal is not None:
                cmd.future.set_exception(Rejected(f"job {job.name!r}: {refusal}"))
                return
        ids = [str(self.next_seq + i) for i in range(len(cmd.items))]
        try:
            jobs = self.pipelines.resolve([j for j, _, _ in cmd.items], ids, self.jobs)
        except DependencyError as e:
            cmd.future.set_exception(Rejected(str(e)))
            return
        # 2. Store them all in this step's one transaction, then hold back what must wait.
        #    Services start (and make replicas, taking ids) only once every job of the file has
        #    the id its siblings were resolved against.
        rows = [
            self._admit(job, fmt, warnings, cmd.received_at, batch, start_service=False)
            for job, (_, fmt, warnings) in zip(jobs, cmd.items, strict=True)
        ]
        for row in rows:
            lj = self.jobs.get(row["id"])
            if lj is None:
                continue
            if lj.job.depends_on:
                self._check_dependencies(lj, batch, now)
            elif lj.job.kind == JobKind.SERVICE:
                self._start_service(lj, batch, now, row)
        batch.after.append(lambda: cmd.future.set_result(rows))

    def _check_dependencies(self, lj: LiveJob, batch: Batch, now: float) -> None:
        """Hold a pending job back while its dependencies are awaited; cancel it, naming the
        dependency, once one can never be met."""
        verdict = self.pipelines.check(lj, self.jobs)
        if verdict.verdict == DependencyVerdict.BROKEN:
            self._finish(lj, JobState.CANCELLED, batch, now, verdict.reason)
            return
        if verdict.verdict == DependencyVerdict.WAITING:
            self._write_status(lj, JobStatus(StatusCode.WAIT_DEPENDENCIES, verdict.reason), batch)
        elif lj.job.kind == JobKind.SERVICE:
            self._start_service(lj, batch, now)
        else:
            self._write_status(
                lj,
                JobStatus(
                    StatusCode.NOT_CONSIDERED, "dependencies met; waiting for the next cycle"
                ),
                batch,
            )
        self.dirty = True

    def _admit(
        self,
        job: Job,
        fmt: str,
        warnings: tuple[str, ...],
        received_at: float,
        batch: Batch,
        *,
        start_service: bool = True,
    ) -> Row:
        """Give an accepted job its id and submit time and make it pending; returns its row
        (written with the batch)."""
        seq = self.next_seq
        self.next_seq += 1
        job_id = str(seq)
        # Strictly increasing submit times keep FIFO order equal to submission order.
        submitted = max(received_at, self.last_submit_s + 1e-6)
        self.last_submit_s = submitted
        job = replace(job, id=job_id, submit_time_s=submitted)
        ckpt = str(self.config.data_dir / "checkpoints" / job_id)
        lj = LiveJob(job=job, state=JobState.PENDING, submitted_at=submitted, checkpoint_dir=ckpt)
        self.jobs[job_id] = lj
        service = job.kind == JobKind.SERVICE
        if not service:
            self._make_pending(lj, batch)
        row: Row = {
            "seq": seq,
            "id": job_id,
            "name": job.name,
            "user": job.user,
            "queue": job.queue,
            "priority": job.priority,
            "kind": job.kind.value,
            "format": fmt,
            "spec": job_to_dict(job),
            "state": JobState.PENDING.value,
            "submitted_at": submitted,
            "attempt": 0,
            "failures": 0,
            "preemptions": 0,
            "attained_gpu_s": 0.0,
            "checkpoint_dir": ckpt,
            "warnings": list(warnings),
            "reason_code": StatusCode.NOT_CONSIDERED.value,
            "reason": "waiting for the next scheduling cycle",
        }
        batch.new_jobs.append(row)
        lj.written_status = (StatusCode.NOT_CONSIDERED.value, "", None)
        batch.event(submitted, job_id, "submitted", f"submitted to queue {job.queue}")
        self.dirty = True
        if service and start_service and not job.depends_on:  # else its dependencies start it
            self._start_service(lj, batch, submitted, row)
        return row

    # --- services ---------------------------------------------------------------------------

    def _start_service(self, lj: LiveJob, batch: Batch, now: float, row: Row | None = None) -> None:
        """A service runs from its start (its submission, or once its dependencies are met)
        until cancelled; its replicas are the work. It never enters the cycle itself."""
        assert lj.job.service is not None
        lj.state = move(lj.id, lj.state, JobState.RUNNING)
        lj.pending_view = None
        lj.started_at = lj.attempt_started_at = now
        if row is not None:
            # Only keys every inserted row has (one batch insert takes rows of one shape).
            row.update(state=JobState.RUNNING.value, reason_code=None, reason=None)
        batch.job(
            lj.id,
            state=JobState.RUNNING.value,
            started_at=now,
            attempt_started_at=now,
            reason_code=None,
            reason=None,
        )
        batch.event(now, lj.id, "started", "service started")
        lj.written_status = None
        self._scale_to(lj, lj.job.service.min_replicas, "its minimum", batch, now)

    def _on_scale(self, cmd: _Scale, batch: Batch, now: float) -> None:
        lj = self.jobs.get(cmd.service_id)
        if lj is None or lj.job.kind != JobKind.SERVICE or lj.job.service is None:
            cmd.future.set_exception(Rejected(f"no live service {cmd.service_id}", 404))
            return
        spec = lj.job.service
        n = min(max(cmd.replicas, spec.min_replicas), spec.max_replicas)
        self._scale_to(lj, n, cmd.reason, batch, now)
        batch.after.append(lambda: cmd.future.set_result(n))

    def replicas_of(self, service_id: str) -> list[LiveJob]:
        """Live replicas of a service not being stopped for good, oldest first."""
        out = [
            r
            for r in list(self.jobs.values())
            if r.job.replica_of == service_id and r.stopping != Stop.CANCEL
        ]
        return sorted(out, key=lambda r: (len(r.id), r.id))

    def _scale_to(self, svc: LiveJob, n: int, reason: str, batch: Batch, now: float) -> None:
        live = self.replicas_of(svc.id)
        if len(live) == n:
            return
        batch.event(now, svc.id, "scaling", f"{len(live)} -> {n} replicas: {reason}")
        for _ in range(n - len(live)):
            name = f"{svc.job.name}-r{self.next_seq}"
            replica = replica_job(svc.job, name, _free_port(self.config.master_addr))
            self._admit(replica, "native", (), now, batch)
        # Surplus: pending replicas first (they hold nothing), then the newest running ones.
        surplus = sorted(live, key=lambda r: (r.state == JobState.RUNNING, -int(r.id)))
        for r in surplus[: max(len(live) - n, 0)]:
            if r.state == JobState.RUNNING:
                r.stopping = Stop.CANCEL
                r.stop_message = "scaled down"
                batch.job(r.id, stopping=Stop.CANCEL.value)
                batch.event(now, r.id, "cancelling", f"scaled down: {reason}")
                self._stop_tasks(r, batch)
            else:
                self._finish(r, JobState.CANCELLED, batch, now, f"scaled down: {reason}")

    def _on_cancel(self, cmd: _Cancel, batch: Batch, now: float) -> None:
        lj = self.jobs.get(cmd.job_id)
        if lj is None:
            with self.store.read() as tx:
                row = tx.get_job(cmd.job_id)
            if row is None:
                cmd.future.set_exception(Rejected(f"no job {cmd.job_id}", 404))
            else:
                cmd.future.set_exception(
                    Rejected(f"job {cmd.job_id} has already ended ({row['state']})", 409)
                )
            return
        if lj.job.kind == JobKind.SERVICE:
            self._scale_to(lj, 0, "the service is cancelled", batch, now)
            self._finish(lj, JobState.CANCELLED, batch, now, "cancelled; its replicas are stopping")
            batch.after.append(lambda: cmd.future.set_result(JobState.CANCELLED.value))
            return
        if lj.state == JobState.RUNNING:
            if lj.stopping != Stop.CANCEL:
                lj.stopping = Stop.CANCEL
                lj.stop_message = "cancelled"
                batch.job(lj.id, stopping=Stop.CANCEL.value)
                batch.event(now, lj.id, "cancelling", "cancel requested: stopping its tasks")
                self._stop_tasks(lj, batch)
            batch.after.append(lambda: cmd.future.set_result(JobState.RUNNING.value))
            return
        self._finish(lj, JobState.CANCELLED, batch, now, "cancelled while pending")
        batch.after.append(lambda: cmd.future.set_result(JobState.CANCELLED.value))

    # --- timers -----------------------------------------------------------------------------

    def _timers(self, batch: Batch, now: float) -> None:
        for lj in list(self.jobs.values()):
            if (
                lj.state == JobState.RUNNING
                and lj.stopping is None
                and now >= time_limit_at(lj.job, lj.attempt_started_at)
            ):
                lj.stopping = Stop.TIMEOUT
                lj.stop_message = time_limit_message(lj.job)
                batch.job(lj.id, stopping=Stop.TIMEOUT.value)
                batch.event(now, lj.id, "timeout", lj.stop_message)
                self._stop_tasks(lj, batch)
            if lj.not_before is not None and lj.not_before <= now:
                lj.not_before = None
                batch.job(lj.id, not_before=None)
                self.dirty = True
            if lj.waiting_for:
                # A victim is done once it is no longer running; a shrunk job once it has
                # stopped and restarted smaller (running again, no longer stopping).
                still = frozenset(
                    v
                    for v in lj.waiting_for
                    if v in self.jobs
                    and self.jobs[v].state == JobState.RUNNING
                    and self.jobs[v].stopping is not None
                )
                limit = (
                    max((self.jobs[v].job.grace_period_s for v in still), default=0.0)
                    + self.config.victim_wait_s
                )
                if not still or (lj.waiting_since is not None and now - lj.waiting_since > limit):
                    lj.waiting_for = frozenset()
                    lj.waiting_since = None
                    self.dirty = True
                else:
                    lj.waiting_for = still

    # --- task exits -------------------------------------------------------------------------

    def _on_exit(self, ev: TaskExited, batch: Batch, now: float) -> None:
        job_id, attempt, name = ev.key
        lj = self.jobs.get(job_id)
        if lj is None or lj.attempt != attempt or lj.state != JobState.RUNNING:
            log.warning("exit of unknown task %s (ignored)", ev.key)
            return
        task = next((t for t in lj.tasks if t.name == name), None)
        if task is None or task.phase == TaskPhase.EXITED:
            return
        task.phase = TaskPhase.EXITED
        task.exit = ev
        finished = ev.time_s or now
        batch.task(
            ev.key,
            state=TaskPhase.EXITED.value,
            exit_kind=ev.kind.value,
            exit_code=ev.exit_code,
            message=ev.message,
            finished_at=finished,
        )
        ok = ev.kind == ExitKind.EXITED and ev.exit_code == 0
        if ok:
            batch.event(now, job_id, "task-exited", f"task {name} exited with code 0")
        else:
            batch.event(now, job_id, "task-exited", f"task {name}: {_describe_exit(ev)}")
        if not ok and lj.stopping is None:
            lj.stopping = Stop.FAILED
            lj.stop_message = f"task {name} {_describe_exit(ev)}"
            lj.exit_code = ev.exit_code
            batch.job(lj.id, stopping=Stop.FAILED.value, exit_code=ev.exit_code)
            self._stop_tasks(lj, batch)
        if not lj.live_tasks():
            self._end_attempt(lj, batch, now)

    def _stop_tasks(self, lj: LiveJob, batch: Batch) -> None:
        """Ask every live task of the job to stop, once the batch has committed."""
        keys = [lj.key(t) for t in lj.live_tasks() if t.phase == TaskPhase.RUNNING]
        grace = lj.job.grace_period_s

        def act() -> None:
            for k in keys:
                self.executor.stop(k, grace)

        batch.after.append(act)

    def _end_attempt(self, lj: LiveJob, batch: Batch, now: float) -> None:
        """Every task of the running attempt has exited: release, then decide what is next."""
        self._give(lj, now)
        self.dirty = True  # capacity came back
        reason, message = lj.stopping, lj.stop_message
        lj.stopping, lj.stop_message = None, ""
        batch.job(lj.id, stopping=None, attained_gpu_s=lj.attained_gpu_s)
        end = after_attempt(
            lj.job,
            reason,
            message,
            failures=lj.failures,
            preemptions=lj.preemptions,
            now=now,
            max_backoff_s=self.config.max_backoff_s,
            keep=lj.shrink_to if reason == Stop.SHRINK else None,
        )
        lj.shrink_to = None
        if end.failures != lj.failures:
            lj.failures = end.failures
            batch.job(lj.id, failures=lj.failures)
        if end.preemptions != lj.preemptions:
            lj.preemptions = end.preemptions
            batch.job(lj.id, preemptions=lj.preemptions)
        nxt = end.next
        if isinstance(nxt, RestartOn):
            batch.event(now, lj.id, "shrunk", nxt.message)
            lj.state = move(lj.id, lj.state, JobState.PENDING)
            planned = self._apply_bind(Bind(lj.id, nxt.keep), batch, now)
            if planned is not None:
                self.restarts.append(planned)
        elif isinstance(nxt, Requeue):
            if nxt.not_before is not None:
                lj.not_before = nxt.not_before
                batch.job(lj.id, not_before=lj.not_before)
                job = lj.job
                self._write_status(
                    lj,
                    JobStatus(
                        StatusCode.WAIT_RESOURCES,
                        f"retry {lj.failures} of {job.max_retries} after a failure, "
                        f"not before {time.strftime('%H:%M:%S', time.localtime(lj.not_before))}",
                        lj.not_before,
                    ),
                    batch,
                )
            batch.event(now, lj.id, nxt.event, nxt.message)
            self._requeue(lj, batch, now)
        else:
            if end.succeeded:
                lj.exit_code = 0
                batch.job(lj.id, exit_code=0)
                self._observe(lj.job, (lj.attempt_started_at or now), now)
            self._finish(lj, nxt.state, batch, now, nxt.why)

    def _observe(self, job: Job, started_s: float, finished_s: float) -> None:
        """Teach the predictor a runtime (of the attempt that succeeded: earlier attempts'
        work was either lost or is what the checkpoint saved it)."""
        if self.predictor is None or finished_s <= started_s:
            return
        finished_s = max(finished_s, self.last_observed_s)  # a clock step back is no leak
        self.predictor.observe(
            JobFeatures.from_job(job, job.submit_time_s), finished_s - started_s, finished_s
        )
        self.last_observed_s = finished_s

    def warm_up(self) -> int:
        """Feed the predictor the store's finished jobs, oldest finish first; returns how many."""
        if self.predictor is None:
            return 0
        with self.store.read() as tx:
            rows = tx.succeeded_jobs(self.predictor.config.window)
        for row in rows:
            self._observe(job_from_dict(row["spec"]), row["attempt_started_at"], row["finished_at"])
        return len(rows)

    def _requeue(self, lj: LiveJob, batch: Batch, now: float) -> None:
        lj.state = move(lj.id, lj.state, JobState.PENDING)
        lj.tasks = []
        batch.job(lj.id, state=JobState.PENDING.value)
        self._make_pending(lj, batch)
        self.dirty = True

    def _finish(self, lj: LiveJob, state: JobState, batch: Batch, now: float, why: str) -> None:
        if self.predictor is not None and state != JobState.SUCCEEDED:
            self.predictor.forget(lj.id)
        lj.state = move(lj.id, lj.state, state)
        lj.pending_view = None
        del self.jobs[lj.id]
        self.terminal_counts[state.value] = self.terminal_counts.get(state.value, 0) + 1
        batch.job(
            lj.id,
            state=state.value,
            finished_at=now,
            message=why,
            reason_code=None,
            reason=None,
            eta=None,
            not_before=None,
        )
        batch.event(now, lj.id, state.value, why)
        for other in self.jobs.values():
            if lj.id in other.waiting_for:
                self.dirty = True
        for dependent in self.pipelines.on_end(lj.id, state, lj.job.name):
            waiting = self.jobs.get(dependent)
            if waiting is not None and waiting.state == JobState.PENDING:
                self._check_dependencies(waiting, batch, now)

    # --- resources --------------------------------------------------------------------------

    def _sync_nodes(self, extra: list[TaskBinding] | None = None) -> None:
        """Follow a cluster executor's nodes joining and leaving (see `membership`): rebuild the
        arrays and re-take every running binding when the node list changed. `extra`: bindings
        about to be taken (recovery) whose nodes must exist."""
        offered = tuple(self.executor.nodes())
        missing = extra and any(b.node not in self.arrays.index for b in extra)
        leftovers = len(self.nodes) != len(offered)  # gone nodes kept while bound: re-check
        if offered == self.offered_nodes and not missing and not leftovers:
            return
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

    def _make_pending(self, lj: LiveJob, batch: Batch) -> None:
        lj.running_view = None
        estimate, upper = self._predict(lj)
        if estimate is not None:
            batch.job(lj.id, predicted_s=estimate, predicted_upper_s=upper)
        lj.pending_view = PendingJob(lj.job, lj.attained_gpu_s, lj.attempt, estimate, upper)

    def _predict(self, lj: LiveJob) -> tuple[float | None, float | None]:
        """The predictor's (median, upper) runtime of `lj`, capped by its time limit; (None,
        None) without a predictor."""
        if self.predictor is None:
            return None, None
        now = max(self.clock(), self.last_observed_s)
        p = self.predictor.predict(JobFeatures.from_job(lj.job, now))
        estimate, upper = p.median_s, p.upper_s
        if lj.job.time_limit_s is not None:  # it cannot run longer than its limit
            estimate = min(estimate, lj.job.time_limit_s)
            upper = min(upper, lj.job.time_limit_s)
        return estimate, upper

    def _take(self, lj: LiveJob, pending: PendingJob | None = None) -> None:
        """Hold `lj`'s tasks' resources and build its running view. Its expected end uses the
        same bound the core used to bind it (`pending`, the view it was pending with): the
        predicted upper runtime first, then the user's estimate, then the time limit, so a
        preemptive policy (`qssf`) does not treat an unestimated running job as endless."""
        start = lj.attempt_started_at or self.clock()
        if pending is None:  # recovered after a restart: predict again
            estimate, upper = self._predict(lj)
            pending = PendingJob(lj.job, lj.attained_gpu_s, lj.attempt, estimate, upper)
        bound = pending.runtime_bound_s
        view = RunningJob(
            lj.job,
            tuple(t.binding for t in lj.tasks),
            start,
            lj.attained_gpu_s,
            expected_end_s=None if bound is None else start + bound,
            checkpoint_interval_s=lj.job.checkpoint_interval_s,
            terminating=lj.stopping is not None,
        )
        self.held.take(view)
        lj.running_view = view

    def _give(self, lj: LiveJob, now: float) -> None:
        if lj.running_view is None:
            return
        view = self.held.give(lj.id)
        lj.attained_gpu_s = view.attained_at(now)
        lj.running_view = None

    # --- the cycle --------------------------------------------------------------------------

    def _cycle(self, now: float, pending: list[PendingJob]) -> None:
        for lj in self.jobs.values():
            view = lj.running_view
            if view is not None and lj.stopping is not None and not view.terminating:
                view = lj.running_view = replace(view, terminating=True)
                self.held.update(view)
        snapshot = self.held.snapshot(self.queues)
        t0 = time.perf_counter()
        result = run_cycle(snapshot, pending, self.policy, now)
        took = time.perf_counter() - t0
        self.next_cycle_not_before = t0 + took * (1 + self.config.cycle_gap_factor)
        self.stats.cycles += 1
        self.stats.last_cycle_s = took
        self.last_cycle_at = now
        self.dirty = False
        if self.on_cycle is not None:
            self.on_cycle(took, result)
        batch = Batch()
        launches: list[tuple[LiveJob, list[TaskLaunch]]] = []
        for d in result.decisions:
            if isinstance(d, Preempt):
                self._apply_preempt(d, batch, now)
            elif isinstance(d, Shrink):
                self._apply_shrink(d, batch, now)
            elif isinstance(d, Bind):
                planned = self._apply_bind(d, batch, now)
                if planned is not None:
                    launches.append(planned)
        for job_id, status in result.diagnostics.items():
            waiting = self.jobs.get(job_id)
            if waiting is None or waiting.state != JobState.PENDING or waiting.waiting_for:
                continue
            if status.code == StatusCode.NEVER_FITS:
                self._finish(waiting, JobState.FAILED, batch, now, status.reason)
                continue
            self._write_status(waiting, status, batch)
        batch.flush(self.store)
        self._launch_all(launches, now)

    def _write_status(self, lj: LiveJob, status: JobStatus, batch: Batch) -> None:
        eta = status.eta_s if status.eta_s is not None and math.isfinite(status.eta_s) else None
        got = (status.code.value, status.reason, eta)
        if got != lj.written_status:
            lj.written_status = got
            batch.job(lj.id, reason_code=got[0], reason=got[1], eta=eta)

    def _apply_preempt(self, d: Preempt, batch: Batch, now: float) -> None:
        lj = self.jobs.get(d.job_id)
        if lj is None or lj.state != JobState.RUNNING or lj.stopping is not None:
            return
        lj.stopping = Stop.PREEMPT
        lj.stop_message = d.reason
        batch.job(lj.id, stopping=Stop.PREEMPT.value)
        batch.event(now, lj.id, "preempting", f"{d.reason}: stopping its tasks")
        self._stop_tasks(lj, batch)

    def _apply_shrink(self, d: Shrink, batch: Batch, now: float) -> None:
        lj = self.jobs.get(d.job_id)
        if lj is None or lj.state != JobState.RUNNING or lj.stopping is not None:
            return
        lj.stopping = Stop.SHRINK
        lj.shrink_to = d.keep
        lj.stop_message = f"{d.reason}: from {len(lj.tasks)} to {len(d.keep)} tasks"
        batch.job(lj.id, stopping=Stop.SHRINK.value)
        batch.event(now, lj.id, "shrinking", f"{lj.stop_message}: stopping its tasks")
        self._stop_tasks(lj, batch)

    def _launch_restarts(self, now: float) -> None:
        if self.restarts:
            restarts, self.restarts = self.restarts, []
            self._launch_all(restarts, now)

    def _apply_bind(
        self, d: Bind, batch: Batch, now: float
    ) -> tuple[LiveJob, list[TaskLaunch]] | None:
        lj = self.jobs.get(d.job_id)
        if lj is None or lj.state != JobState.PENDING:
            return None
        if d.after:
            lj.waiting_for = frozenset(d.after)
            lj.waiting_since = now
            victims = ", ".join(sorted(d.after))
            self._write_status(
                lj,
                JobStatus(StatusCode.PREEMPTING, f"waiting for preempted job(s) {victims} to stop"),
                batch,
            )
            return None
        lj.state = move(lj.id, lj.state, JobState.RUNNING)
        lj.attempt += 1
        lj.attempt_started_at = now
        if lj.started_at is None:
            lj.started_at = now
        pending, lj.pending_view = lj.pending_view, None
        logs = self.config.data_dir / "logs" / lj.id / str(lj.attempt)
        ordered = sorted(d.tasks, key=lambda t: (_group_index(lj.job, t.group), t.index))
        lj.tasks = [
            LiveTask(
                task_name(b.group, b.index),
                rank,
                b,
                str(logs / f"{task_name(b.group, b.index)}.log"),
            )
            for rank, b in enumerate(ordered)
        ]
        self._take(lj, pending)
        batch.job(
            lj.id,
            state=JobState.RUNNING.value,
            attempt=lj.attempt,
            started_at=lj.started_at,
            attempt_started_at=now,
            not_before=None,
            reason_code=None,
            reason=None,
            eta=None,
        )
        lj.written_status = None
        for t in lj.tasks:
            b = t.binding
            batch.new_tasks.append(
                {
                    "job_id": lj.id,
                    "attempt": lj.attempt,
                    "name": t.name,
                    "rank": t.rank,
                    "grp": b.group,
                    "idx": b.index,
                    "node": b.node,
                    "gpus": list(b.gpus),
                    "gpu_milli": b.gpu_milli,
                    "milli_cpu": b.milli_cpu,
                    "mem_mib": b.mem_mib,
                    "gpu_mem_mib": b.gpu_mem_mib,
                    "state": TaskPhase.LAUNCHING.value,
                    "log_path": t.log_path,
                }
            )
        where = ", ".join(
            f"{t.name} on {t.binding.node}"
            + (f" GPU {','.join(map(str, t.binding.gpus))}" if t.binding.gpus else "")
            for t in lj.tasks
        )
        batch.event(now, lj.id, "started", f"attempt {lj.attempt}: {where}")
        return lj, self._launch_requests(lj)

    def node_address(self, node: str) -> str:
        """Where `node` is reached from here: its own address on a cluster of machines, else
        the loop's `master_addr` (loopback)."""
        return master_addr_for(self.executor, node, self.config.master_addr)

    def _launch_requests(self, lj: LiveJob) -> list[TaskLaunch]:
        places = [
            TaskPlace(t.name, t.binding.node, t.binding.gpus, t.binding.milli_cpu, t.binding.index)
            for t in lj.tasks
        ]
        port = _free_port(self.config.master_addr)
        master_addr = self.node_address(places[0].node)
        out = []
        for t in lj.tasks:
            group = next(g for g in lj.job.groups if g.name == t.binding.group)
            env = dict(self.config.base_env)
            env.update(group.env)
            if lj.job.replica_of is not None:  # where to listen: its node's address
                env[HOST_ENV] = self.node_address(t.binding.node)
            env.update(
                contract_env(
                    job_id=lj.id,
                    places=places,
                    rank=t.rank,
                    restart_count=lj.attempt - 1,
                    checkpoint_dir=lj.checkpoint_dir,
                    master_addr=master_addr,
                    master_port=port,
                )
            )
            out.append(
                TaskLaunch(
                    job_id=lj.id,
                    attempt=lj.attempt,
                    task=t.name,
                    node=t.binding.node,
                    command=group.command,
                    env=env,
                    workdir=group.workdir,
                    milli_cpu=t.binding.milli_cpu,
                    mem_limit_mib=t.binding.mem_mib,
                    gpus=t.binding.gpus,
                    log_path=t.log_path,
                    grace_period_s=lj.job.grace_period_s,
                    gpu_mem_mib=t.binding.gpu_mem_mib,
                    gpu_milli=t.binding.gpu_milli,
                )
            )
        return out

    def _launch_all(self, launches: list[tuple[LiveJob, list[TaskLaunch]]], now: float) -> None:
        batch = Batch()
        for lj, reqs in launches:
            Path(lj.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            for req, task in zip(reqs, lj.tasks, strict=True):
                if lj.stopping is not None:  # an earlier task failed to launch: roll back
                    self._on_exit(
                        TaskExited(req.key, ExitKind.STOPPED, None, "not started", now),
                        batch,
                        now,
                    )
                    continue
                try:
                    Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
                    handle = self.executor.launch(req)
                except (LaunchError, OSError) as e:
                    self._on_exit(
                        TaskExited(req.key, ExitKind.LOST, None, f"could not start: {e}", now),
                        batch,
                        now,
                    )
                    continue
                task.handle = handle
                task.phase = TaskPhase.RUNNING
                batch.task(
                    req.key,
                    state=TaskPhase.RUNNING.value,
                    handle=handle.data,
                    started_at=self.clock(),
                )
        batch.flush(self.store)

    # --- what readers see -------------------------------------------------------------------

    def allocation(self) -> dict[str, tuple[float, float]]:
        """(allocated, total) per resource over healthy nodes, for metrics and `nodes`."""
        a, f = self.arrays, self.free
        h = a.healthy
        return {
            "cpu": (float((a.cap_cpu - f.cpu)[h].sum()) / 1000, float(a.cap_cpu[h].sum()) / 1000),
            "memory_bytes": (
                float((a.cap_mem - f.mem)[h].sum()) * 2**20,
                float(a.cap_mem[h].sum()) * 2**20,
            ),
            "gpu": (
                float(a.num_gpus[h].sum()) - float(f.gpu_total[h].sum()) / 1000,
                float(a.num_gpus[h].sum()),
            ),
        }

    def live_summary(self) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
        """Live jobs by state, and (pending, running) per queue."""
        states: dict[str, int] = {}
        per_queue: dict[str, tuple[int, int]] = {}
        for lj in list(self.jobs.values()):
            states[lj.state.value] = states.get(lj.state.value, 0) + 1
            p, r = per_queue.get(lj.job.queue, (0, 0))
            if lj.state == JobState.RUNNING:
                r += 1
            else:
                p += 1
            per_queue[lj.job.queue] = (p, r)
        return states, per_queue

    def gpu_owners(self) -> dict[tuple[str, int], list[tuple[str, str, int]]]:
        """(node, GPU index) → [(job id, task, milli-GPU)] for every running task."""
        out: dict[tuple[str, int], list[tuple[str, str, int]]] = {}
        for lj in list(self.jobs.values()):
            if lj.state != JobState.RUNNING:
                continue
            for t in list(lj.tasks):
                for g in t.binding.gpus:
                    out.setdefault((t.binding.node, g), []).append(
                        (lj.id, t.name, t.binding.gpu_milli)
                    )
        return out


def _group_index(job: Job, group: str) -> int:
    for i, g in enumerate(job.groups):
        if g.name == group:
            return i
    return len(job.groups)


def _describe_exit(ev: TaskExited) -> str:
    """How a task ended, in words: the executor's own, else from the exit code."""
    if ev.message:
        return ev.message
    if ev.kind == ExitKind.OOM:
        return "was killed for exceeding its memory limit"
    if ev.kind == ExitKind.LOST:
        return "was lost"
    if ev.exit_code is not None and ev.exit_code < 0:
        return f"was killed by signal {-ev.exit_code}"
    return f"exited with code {ev.exit_code}"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

"""Recovery: after a restart of the scheduler, live state is rebuilt from the store, and every
task that may still run is adopted through the executor or accounted for (exited, lost, or a
launch cut short), before the first cycle."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aisched.core.decisions import TaskBinding
from aisched.executors.base import AdoptState, ExitKind, TaskExited, TaskHandle
from aisched.lifecycle.attempts import time_limit_message
from aisched.lifecycle.preemption import VictimWait, keep_free_of_bound
from aisched.lifecycle.services import crash_loop_of
from aisched.lifecycle.states import move
from aisched.model.job import JobKind
from aisched.model.states import JobState
from aisched.service.commands import Commands
from aisched.service.launches import started_message
from aisched.service.live import Batch, LiveJob, LiveTask, Stop, TaskPhase
from aisched.service.paths import highest_job_folder
from aisched.store.codec import job_from_dict, victim_wait_from_dict
from aisched.store.db import Row
from aisched.store.errors import StoreError

log = logging.getLogger("aisched.loop")
# A service's last failed replicas read to derive its crash loop: a run longer than this has
# long reached the wait's cap.
CRASH_LOOP_ENDS = 64
_MEND = "restore the database from a backup, or mend or delete that row, then start again"


class NodeChanged(RuntimeError):
    """A running task holds what its node, as this start offers it, lacks: the service
    cannot start beside it (it would place other work on what the task holds)."""


class Recovery(Commands):
    def recover(self) -> list[str]:
        """Rebuild live state from the store; adopt or account for every task that may be
        running. Returns a line per notable finding (for the service log). A damaged row
        (one no version of aisched wrote) is a StoreError that says so."""
        try:
            return self._recover()
        except json.JSONDecodeError as exc:  # a JSON column, decoded as the store reads it
            raise StoreError(
                f"the state database holds a damaged job or task row ({exc}); {_MEND}"
            ) from None

    def _check_nodes(self, task_rows: Iterable[Row]) -> None:
        """NodeChanged when running tasks hold GPUs their node is now offered without
        (`--gpus` lowered, a GPU gone from NVML), or, on this machine alone (the local
        executor), sit on a node of another name (`node.name` or the host name changed): the
        same GPUs under a new name would be given out again. Every such job is named, and the
        GPUs they need all of."""
        offered = {n.name: n for n in self.executor.nodes()}
        alone = self.executor.info().name == "local" and len(offered) == 1
        held: dict[str, list[Row]] = {}
        for r in task_rows:
            held.setdefault(r["node"], []).append(r)
        for node_name, rows in sorted(held.items()):
            node = offered.get(node_name)
            if node is None and not alone:
                continue  # a cluster's node that left: kept as gone while its tasks run
            have = set() if node is None else {g.index for g in node.gpus}
            short = [r for r in rows if node is None or set(r["gpus"]) - have]
            if not short:
                continue
            ids = sorted({r["job_id"] for r in short}, key=int)
            one, it = (True, "it") if len(ids) == 1 else (False, "them")
            jobs = f"job {ids[0]} runs" if one else f"jobs {', '.join(ids)} run"
            until = (
                f"until {'it ends' if one else 'they end'}, or stop {it} first (start as "
                f"before, then aisched cancel); or let {it} end"
            )
            if node is None:
                raise NodeChanged(
                    f"{jobs} on node {node_name}, and this machine's node is now named "
                    f"{next(iter(offered))}: start with the node named {node_name} (node.name "
                    f"in the config file) {until}"
                )
            lost = sorted({g for r in short for g in r["gpus"]} - have)
            gpus = f"GPU {lost[0]}" if len(lost) == 1 else f"GPUs {', '.join(map(str, lost))}"
            raise NodeChanged(
                f"{jobs} on {gpus} of node {node_name}, which now has {len(have)} GPU(s): "
                f"start with at least {lost[-1] + 1} (--gpus) {until}"
            )

    def _recover(self) -> list[str]:
        notes: list[str] = []
        learned = self.warm_up()
        if learned:
            notes.append(f"runtime predictor learned from {learned} finished jobs")
        now = self.clock()
        batch = Batch()
        with self.store.read() as tx:
            stored = tx.max_seq()
            self.next_seq = stored + 1
            rows = tx.live_jobs()
            task_rows = {(r["job_id"], r["attempt"], r["name"]): r for r in tx.running_tasks()}
            counts = tx.count_by_state()
        self._check_nodes(task_rows.values())
        self._recall_nodes()
        self.terminal_counts = {s: counts.get(s, 0) for s in ("succeeded", "failed", "cancelled")}
        if (left := highest_job_folder(self.config.data_dir)) > stored:
            self.next_seq = left + 1
            # A warning, not a note: unless a damaged database was moved aside on purpose, the
            # database has lost those jobs (its WAL file deleted under a running service, the
            # file truncated or replaced), and the operator should hear of it.
            log.warning(
                "the data directory holds files of jobs up to %d that the state database does "
                "not know: unless it was moved aside on purpose, the database has lost them (a "
                "deleted state.db-wal, a truncated or replaced state.db): stop aisched and "
                "restore the database from a backup; new jobs start at %d",
                left,
                left + 1,
            )
        self.retention.recover(self.store)  # before a job ends here, so it counts
        waits: list[tuple[LiveJob, Any]] = []  # pending jobs that waited for victims
        for row in rows:
            lj = _readable(row, self._live_from_row)
            self._add_live(lj)
            if row["submitted_at"] > self.last_submit_s:
                self.last_submit_s = row["submitted_at"]
            if lj.state != JobState.RUNNING:
                if lj.job.kind != JobKind.SERVICE:  # a pending service waits on dependencies
                    self._make_pending(lj, batch)
                if row["waiting_for"]:
                    waits.append((lj, row["waiting_for"]))
                continue
            if lj.job.kind == JobKind.SERVICE:  # its work is its replicas, jobs of their own
                self._derive_crash_loop(lj, row["seq"])
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
            # A task stored `launching` means the batch of the launch never landed, so nor
            # did its `started`: written here if every task was in fact made.
            unrecorded = any(t.phase == TaskPhase.LAUNCHING for t in lj.tasks)
            exits: list[TaskExited] = []
            adopted: list[str] = []
            for t in lj.tasks:
                if t.phase == TaskPhase.EXITED:
                    continue
                key = lj.key(t)
                # Without a stored handle (the scheduler died before it could write it), the log
                # path still tells an executor where the task would have recorded its end.
                handle = t.handle or TaskHandle(key, t.binding.node, {"log_path": t.log_path})
                state, exited = self.executor.adopt(handle)
                if state == AdoptState.RUNNING:
                    if t.phase != TaskPhase.RUNNING:  # started, but stored as `launching`
                        batch.task(key, state=TaskPhase.RUNNING.value)
                    t.phase = TaskPhase.RUNNING
                    adopted.append(t.name)
                    notes.append(f"job {lj.id}: adopted task {t.name}")
                elif state == AdoptState.EXITED and exited is not None:
                    exits.append(exited)
                else:
                    never_started = key in task_rows and task_rows[key]["state"] == "launching"
                    if never_started and lj.stopping is None:
                        # Stored, so that a start after another crash, finding the gang's
                        # other tasks stopping, still requeues it instead of failing it.
                        lj.stopping = Stop.REQUEUE
                        lj.stop_message = "its launch was interrupted by a scheduler restart"
                        batch.job(lj.id, stopping=Stop.REQUEUE.value)
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
                    unrecorded = False  # not every task was made: the attempt never started
            if unrecorded:
                batch.event(now, lj.id, "started", started_message(lj.attempt))
            for name in adopted:
                batch.event(now, lj.id, "adopted", f"task {name} still running: adopted")
            if lj.stopping is not None and not lj.stop_message:  # the message is not stored
                with self.store.read() as tx:
                    said = tx.events_of(lj.id)
                lj.stop_message = _stop_message_after_restart(lj, said)
            if lj.stopping is not None:  # a stop was under way: finish it
                for t in lj.live_tasks():
                    if t.phase == TaskPhase.RUNNING:
                        self.executor.stop(lj.key(t), lj.job.grace_period_s)
            for ev in exits:
                self._on_exit(ev, batch, now)
        for lj, stored in waits:  # once every victim's stop is resumed, or its end taken
            self._resume_wait(lj, stored, batch)
        for lj in list(self.jobs.values()):
            if lj.job.kind == JobKind.SERVICE:  # cancelled, its replicas gone meanwhile
                self._service_stopped(lj.id, batch, now)
        for lj in list(self.jobs.values()):
            if lj.job.depends_on and lj.state == JobState.PENDING:
                self._check_dependencies(lj, batch, now)
        for lj in self.jobs.values():
            self._arm_timers(lj)
        batch.flush(self.store)
        self._launch_restarts(now)
        self.dirty = True
        return notes

    def _resume_wait(self, lj: LiveJob, stored: Any, batch: Batch) -> None:
        """A job that waited for victims to stop before the restart waits on for those still
        stopping (their stops were resumed), else it waits no more and a cycle places it."""
        try:
            wait = victim_wait_from_dict(stored)
        except (KeyError, TypeError, ValueError):  # no version of aisched wrote it
            wait = VictimWait(frozenset(), 0.0)
        still = frozenset(v for v in wait.victims if self._still_stopping(v))
        if lj.state == JobState.PENDING and still:
            resumed = VictimWait(still, wait.since, wait.tasks)
            self._wait_for_victims(lj, resumed, batch)
            keep_free_of_bound(self.held, lj.job, resumed, self.clock())
        else:
            batch.job(lj.id, waiting_for=None)

    def _derive_crash_loop(self, svc: LiveJob, seq: int) -> None:
        """A running service's crash loop, from its replicas that failed before the restart
        (their own exits found now are counted as they are handled, after this)."""
        with self.store.read() as tx:
            ends = tx.failed_replicas(svc.id, svc.job.user, seq, CRASH_LOOP_ENDS)
        svc.crash_loop = crash_loop_of(svc.job, ends, self.config.max_backoff_s)

    def _live_from_row(self, row: Row) -> LiveJob:
        """The live job a stored row describes; a damaged row raises (see `_readable`)."""
        job = job_from_dict(row["spec"])
        return LiveJob(
            job=job,
            state=JobState(row["state"]),
            submitted_at=row["submitted_at"],
            checkpoint_dir=row["checkpoint_dir"],
            attempt=row["attempt"],
            failures=row["failures"],
            preemptions=row["preemptions"],
            quick_exits=row["quick_exits"],
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


def _readable(row: Row, read: Callable[[Row], LiveJob]) -> LiveJob:
    """`read(row)`, or a StoreError naming the job when the row is damaged (a state or spec
    no version of aisched wrote): starting without that job would leave its tasks, which may
    be running, unwatched, so the operator is told which row to mend."""
    try:
        return read(row)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(
            f"the state database's job {row.get('id')!r} cannot be read "
            f"({exc.__class__.__name__}: {str(exc)[:200]}); {_MEND}"
        ) from None


def _stop_message_after_restart(lj: LiveJob, events: list[Row]) -> str:
    """Why a stop under way when the scheduler stopped was made, as far as what is stored
    says: its message is not stored (the job's end gives it), but the event written as the
    stop began is (`events`, the job's, oldest first)."""
    if lj.stopping == Stop.TIMEOUT:
        return time_limit_message(lj.job)
    if lj.stopping == Stop.LOGS:
        return (
            f"stopped: {lj.job.user}'s running jobs' logs were over "
            "limits.user_max_running_log_bytes; not retried"
        )
    if lj.stopping == Stop.REQUEUE:
        return "a requeue cut short by a scheduler restart"
    if lj.stopping in (Stop.PREEMPT, Stop.CANCEL):
        kind = "preempting" if lj.stopping == Stop.PREEMPT else "cancelling"
        began = next((e["message"] for e in reversed(events) if e["kind"] == kind), "")
        if lj.stopping == Stop.CANCEL and began.endswith(_STOPPING):
            return "cancelled"  # a user's cancel (a replica's retirement says its reason)
        return began.removesuffix(_STOPPING) or (
            "preempted" if kind == "preempting" else "cancelled"
        )
    if lj.stopping in (Stop.FAILED, Stop.UNRUNNABLE):
        # The attempt's first task that did not exit with 0 began the stop.
        last_start = max((i for i, e in enumerate(events) if e["kind"] == "started"), default=0)
        for e in events[last_start:]:
            if e["kind"] == "task-exited" and not e["message"].endswith("exited with code 0"):
                return str(e["message"]).replace(": ", " ", 1)  # "task x: ..." as the stop's
    return ""


_STOPPING = ": stopping its tasks"  # how the events of a preemption's and a cancel's start end

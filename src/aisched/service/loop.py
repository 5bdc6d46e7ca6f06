"""The scheduler's control loop: read state → run the core → write intent → act → observe.

One thread owns all live state (`LiveJob`s, the free capacity, the running views) and is the
only writer of the store. Other threads talk to it through `submit` / `cancel`, which queue a
command and return a Future, and read finished facts from the store.

A step of the loop:

1. Take the queued commands (submissions, cancellations) and the executor's task exits, and
   the timers that fell due (time limits, retry backoff, victims that take too long). Timers
   come from a heap (`timers`), so a step that runs no cycle costs what changed, not a walk
   over every live job; the pending list is made only for a cycle.
2. Flush those changes in one transaction; only then reply to callers and signal tasks.
3. When something changed (or `cycle_interval_s` passed with work waiting), run one cycle of
   the pure core on a snapshot of the live state, unless the last cycle's gap has not passed
   (`cycle_gap_factor`: under a stream of submissions, time to take them in) and no job
   submitted since could start now. Waiting jobs' estimated starts are worked out by one
   cycle in `eta_interval_s`, the others keeping the last ones.
4. Write every decision's intent (the job RUNNING, its task rows `launching`; the victims'
   `stopping`), commit, then act: stop victims, launch tasks, record their handles.

What happens to a job between decisions (attempt ends, retries and backoff, preemption,
shrink and growth, time limits, the states it may move between, the resources it holds) is the
lifecycle's (`aisched.lifecycle`), the same rules the simulator drives; this loop only applies
them to the store and the executor. Its parts, one responsibility each, are its base classes:
`scheduler_state` (live state, the lifecycle's ledger, views for the core), `launches`,
`exits` (task exits, attempt ends), `intents` (the cycle and its decisions, timers, growth),
`commands` (submit, cancel, scale, pipelines, services) and `recovery`. Here: the thread, one
step, and what readers see.

Invariants: a job is in at most one of pending and running; resources are taken from `free`
when an attempt is bound and given back only when every task of it has exited; a task row is
written before its process may exist; a preemption's beneficiary waits (out of the cycle) until
its victims have stopped, so it never runs beside them. After a crash, `recover` rebuilds all of
this from the store and the executor's `adopt`, before the first cycle.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from aisched.executors.base import TaskExited, unavailable
from aisched.model.states import JobState
from aisched.service.bulk_cancel import BulkCancels
from aisched.service.live import Batch, LiveJob, Origin, TaskPhase
from aisched.service.loop_types import (
    BulkCancelCommand,
    Command,
    LoopConfig,
    LoopStats,
    Rejected,
    ScaleCommand,
    SubmitAllCommand,
    SubmitCommand,
)
from aisched.service.recovery import Recovery
from aisched.service.step_errors import classify, one_line
from aisched.store.errors import Deposed

__all__ = ["LoopConfig", "LoopStats", "Rejected", "Scheduler"]

log = logging.getLogger("aisched.loop")


class Scheduler(Recovery, BulkCancels):
    """The control loop (see the module docstring); its parts are its base classes."""

    # Called (in the loop thread) when a write was refused because another instance leads
    # now; the loop has stopped by then (`service.leader`).
    on_deposed: Callable[[str], None] | None = None
    # Why new launches must wait now (the disks they write to are full), else None.
    launch_hold: Callable[[], str | None] = staticmethod(lambda: None)

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="aisched-loop", daemon=True)
        thread.start()
        # Published once started: a thread not yet started is not alive, and `/v1/healthz`
        # (and readiness) read a published loop that is not alive as a dead one.
        self.thread = thread

    def ended(self) -> bool:
        """Whether the loop ran and has stopped: a command queued now is never answered. (Not
        yet started, as while a new leader recovers, is not ended: it answers once it runs.)"""
        return self.thread is not None and not self.thread.is_alive()

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
            except Deposed as exc:  # another instance leads: not one more step
                log.error("scheduler stopped: %s", exc)
                if self.on_deposed is not None:
                    self.on_deposed(str(exc))
                return
            except Exception as exc:  # neither a bug nor a full disk may kill the service
                # Counted (aisched_loop_errors_total, readiness) and backed off; the traceback
                # is logged for the first failure of a run, then one line per failure.
                first = not self.step_errors.failing
                delay = self.step_errors.failed(exc, self.clock())
                log.error("scheduler step failed (retry in %.1f s): %s", delay, exc, exc_info=first)
            else:
                if self.step_errors.failing:
                    log.info("scheduler step succeeded again: ready")
                self.step_errors.succeeded()
            self.wake.wait(delay)
            self.wake.clear()

    def step(self) -> float:
        """Run one step; returns how long the loop may sleep before the next one."""
        if self.fit_after_warm_up and self.predictor is not None:
            # Started here, once the service is up, not on the start path (`warm_up`).
            self.fit_after_warm_up = False
            self.predictor.fit_if_due()
        self._sync_nodes()
        now = self.clock()
        batch = self.batch
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            replies, made = len(batch.after), len(batch.new_jobs)
            try:
                self._apply_command(cmd, batch, now)
                if len(batch.new_jobs) > made:
                    ids = frozenset(row["id"] for row in batch.new_jobs[made:])
                    batch.origins.append(Origin(cmd.future, ids, tuple(batch.after[replies:])))
            except Exception as exc:
                # Off the queue, so answered here or never: the caller gets the error (its
                # request fails) rather than waiting forever, and the step fails as it did.
                if not cmd.future.done():
                    cmd.future.set_exception(exc)
                raise
        exits = self.exits_due
        exits.extend(self.executor.poll())
        while exits:
            self._take_exit(exits.popleft(), batch, now)
        self._timers(batch, now)
        self._bound_running_logs(batch, now)
        self._recheck_dependents(batch, now)  # what a failed step left undone, if anything
        self.retention.forget_ended(self.store, batch, now, newest_id=str(self.next_seq - 1))
        self.retention.forget_attempts(batch, now)
        try:
            batch.flush(self.store)
        except Exception as exc:
            if classify(exc) != "data" or not self._refuse_unstorable(batch, now):
                raise  # the step fails and is retried, its batch kept
            batch.flush(self.store)
        self._launch_restarts(now)
        due = now - self.last_cycle_at >= self.config.cycle_interval_s
        pending = None
        if self.dirty or due:
            # The pending list costs a walk over the live jobs: made only for a cycle.
            gap = self.next_cycle_not_before - time.perf_counter()
            if gap > 0 and self._schedulable(now) and not self._fresh_could_start():
                return gap
            blocked = self.pipelines.blocked
            pending = [  # `_may_place`, inline: this walks every live job
                view
                for lj in self.jobs.values()
                if (view := lj.pending_view) is not None
                and not lj.waiting_for
                and (lj.not_before is None or lj.not_before <= now)
                and lj.job.id not in blocked
            ]
            # New launches are held while the executor cannot start anything (its cluster is
            # unreachable) or their files cannot be written (a full disk): the jobs wait,
            # pending, rather than fail to launch and use up their retries.
            # A held cycle counts as one for pacing: the next look is a cycle from now.
            if pending and unavailable(self.executor) is not None:
                self.last_cycle_at = now
            elif pending and (held := self.launch_hold()) is not None:
                self._hold_launches(pending, held, now)
            elif pending:
                self._cycle(now, pending)
        if not pending and not self._schedulable(now):
            self.dirty = False
            self.fresh.clear()  # held back (dependencies), or gone: no cycle will clear them
            # Capacity freed by preemption or shrinking is owed to the job waiting for it.
            if not self.waiters:  # no job waits for a victim (`_set_waiting` keeps it)
                self._grow_elastic(now)
        return self._sleep_for(now)

    def _take_exit(self, ev: TaskExited, batch: Batch, now: float) -> None:
        """Handle one task exit; one whose handling meets a bug holds its job
        (`_hold_for_bug`) and is handled again when the hold ends, unless it got as far as
        marking its task exited (the attempt is then ended, `_timer_due`)."""
        job_id = ev.key[0]
        if job_id in self.bug_held:
            self.exits_held.setdefault(job_id, []).append(ev)
            return
        try:
            self._on_exit(ev, batch, now)
        except Exception as exc:
            if not self._holds_for(exc):
                raise  # taken off the queue already, so not met again every step
            lj = self.jobs.get(job_id)
            if lj is None:
                raise
            task = next((t for t in lj.tasks if t.name == ev.key[2]), None)
            if task is not None and task.phase != TaskPhase.EXITED:
                self.exits_held.setdefault(job_id, []).append(ev)
            self._hold_for_bug(lj, exc, "the exit of its task " + ev.key[2], now)

    def _refuse_unstorable(self, batch: Batch, now: float) -> bool:
        """The batch failed on a value the store cannot hold (a NUL byte in text for
        PostgreSQL, an integer past 64 bits, ...): such a write fails however often it is
        retried, and would hold back every later command. Each command that made jobs is tried
        on its own, in a transaction rolled back; one the store refuses for its data is taken
        out whole: its jobs are ended in memory and every write of theirs leaves the batch, and
        its caller is answered 422 with what the store said. Returns whether any was; if none
        was, the value came from elsewhere and the step fails (and is retried) as before."""
        refused: list[tuple[Origin, str]] = []
        for origin in batch.origins:
            try:
                with self.store.trial() as tx:
                    batch.of_jobs(origin.job_ids).write(tx)
            except Exception as exc:
                if classify(exc) != "data":
                    raise
                refused.append((origin, one_line(exc)))
        if not refused:
            return False
        replies = {id(fn) for origin, _ in refused for fn in origin.after}
        batch.after = [fn for fn in batch.after if id(fn) not in replies]
        batch.origins = [o for o in batch.origins if all(o is not r for r, _ in refused)]
        for origin, why in refused:
            log.warning("a command was refused: the store cannot hold it: %s", why)
            # Each ends in memory as a cancelled job does (replicas before their service), and
            # is counted nowhere: it never was. Their dependents are re-checked once all have
            # ended: a later step of a refused pipeline is not ended first as a broken
            # dependent, nor released to start.
            made = [self.jobs[i] for i in origin.job_ids if i in self.jobs]
            with self._ending_together(batch, now):
                for lj in sorted(made, key=lambda lj: lj.job.replica_of is None):
                    if self.jobs.get(lj.id) is not lj:  # ended with one before it
                        continue
                    self._finish(lj, JobState.CANCELLED, batch, now, "not stored")
                    self.terminal_counts[JobState.CANCELLED.value] -= 1
            batch.drop_jobs(origin.job_ids)
            self.retention.ended_bytes.forgotten(origin.job_ids)
            self.fresh = [j for j in self.fresh if j.id not in origin.job_ids]
            for key, rows in list(self.unstored_keys.items()):
                if any(r["id"] in origin.job_ids for r in rows):
                    del self.unstored_keys[key]
            if not origin.future.done():
                origin.future.set_exception(
                    Rejected(
                        f"not stored: the store cannot hold a value of this request ({why}); "
                        "nothing of it was kept: correct it and send it again",
                        422,
                    )
                )
        return True

    def _may_place(self, lj: LiveJob, now: float) -> bool:
        """Whether a job with a pending view goes into the cycle now: not while it waits for
        victims to stop, for its backoff, or for the jobs it depends on."""
        return (
            not lj.waiting_for
            and (lj.not_before is None or lj.not_before <= now)
            and lj.id not in self.pipelines.blocked
        )

    def _schedulable(self, now: float) -> bool:
        """Whether any job would go into a cycle now (stops at the first one)."""
        jobs = self.jobs
        return any(self._may_place(jobs[i], now) for i in self.queued)

    def _apply_command(self, cmd: Command, batch: Batch, now: float) -> None:
        if isinstance(cmd, SubmitCommand):
            self._on_submit(cmd, batch, now)
        elif isinstance(cmd, SubmitAllCommand):
            self._on_submit_all(cmd, batch, now)
        elif isinstance(cmd, ScaleCommand):
            self._on_scale(cmd, batch, now)
        elif isinstance(cmd, BulkCancelCommand):
            self._on_bulk_cancel(cmd, batch, now)
        else:
            self._on_cancel(cmd, batch, now)

    def _sleep_for(self, now: float) -> float:
        """Until the next timer that still stands (a time limit, a backoff's end, an elastic
        job's first chance to grow: after that it is looked at whenever something changes),
        the next periodic cycle while jobs wait, or `tick_s`, whichever comes first."""
        delay = min(self.config.tick_s, max(self.timers.next_due(self._timer_stands) - now, 0.0))
        blocked = self.pipelines.blocked
        if any(i not in blocked for i in self.queued):
            delay = min(delay, max(self.last_cycle_at + self.config.cycle_interval_s - now, 0.0))
        return max(delay, 0.0)

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

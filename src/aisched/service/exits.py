"""Task exits and attempt ends: a task's exit is recorded; a failed one stops the rest of its
gang; once every task of an attempt has ended its resources are given back and the lifecycle
(`lifecycle.attempts.after_attempt`) says what the job becomes, which this part applies to the
store: requeued, retried after a backoff, restarted on a shrink's kept tasks, or finished; a
job that finishes has the jobs that wait on it re-checked (`_recheck_dependents`).
What a stopped victim frees while a job waits for it is noted, to be kept for that job
if its wait goes on once every exit of the step is in (`intents._timers`,
`lifecycle.preemption`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial

from aisched.core.decisions import Bind
from aisched.core.status import JobStatus, StatusCode
from aisched.executors.base import ExitKind, TaskExited
from aisched.lifecycle.attempts import Requeue, RestartOn, after_attempt
from aisched.lifecycle.preemption import release_kept
from aisched.lifecycle.services import replica_failed
from aisched.lifecycle.states import move
from aisched.model.states import JobState
from aisched.service.identity import account_gone
from aisched.service.launches import Launches
from aisched.service.live import Batch, LiveJob, Stop, TaskPhase
from aisched.service.paths import remove_empty_checkpoint_dir
from aisched.service.scheduler_state import clock, jobs_counted

log = logging.getLogger("aisched.loop")


class Exits(Launches):
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
            why = Stop.UNRUNNABLE if ev.kind == ExitKind.UNRUNNABLE else Stop.FAILED
            lj.stopping = why
            lj.stop_message = f"task {name} {_describe_exit(ev)}"
            lj.exit_code = ev.exit_code
            batch.job(lj.id, stopping=why.value, exit_code=ev.exit_code)
            self._stop_tasks(lj, batch)
        if not lj.live_tasks():
            self._end_attempt(lj, batch, now)

    def _end_attempt(self, lj: LiveJob, batch: Batch, now: float) -> None:
        """Every task of the running attempt has exited: release, then decide what is next."""
        self._give(lj, now)
        self.dirty = True  # capacity came back
        reason, message = lj.stopping, lj.stop_message
        lj.stopping, lj.stop_message = None, ""
        restarts_on = set(lj.shrink_to or ()) if reason == Stop.SHRINK else set()
        if self.waiters.get(lj.id):  # kept for a job whose wait goes on: see `_timers`
            freed = tuple(t.binding for t in lj.tasks if t.binding not in restarts_on)
            self.freed_now.append((lj.id, freed))
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
            started=len(lj.tasks),
            ran_s=now - (lj.attempt_started_at if lj.attempt_started_at is not None else now),
            quick_exits=lj.quick_exits,
        )
        lj.shrink_to = None
        if end.quick_exits != lj.quick_exits:
            lj.quick_exits = end.quick_exits
            batch.job(lj.id, quick_exits=lj.quick_exits)
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
            if (until := nxt.not_before) is not None:
                why = (
                    f"retry {lj.failures} of {lj.job.max_retries} after a failure, "
                    f"not before {clock(until)}"
                    if reason is not None
                    else f"restart (policy always) after a clean exit, not before {clock(until)}"
                )
                self._hold_until(lj, JobStatus(StatusCode.WAIT_RESOURCES, why, until), batch)
            batch.event(now, lj.id, nxt.event, nxt.message)
            self._requeue(lj, batch, now)
        else:
            if end.succeeded:
                lj.exit_code = 0
                batch.job(lj.id, exit_code=0)
                self._observe(lj.job, (lj.attempt_started_at or now), now)
            refused = reason == Stop.UNRUNNABLE
            self._finish(lj, nxt.state, batch, now, nxt.why, launch_refused=refused)

    def _still_stopping(self, job_id: str) -> bool:
        """Whether a victim still holds what it was preempted for: running and stopping (a
        shrunk job has stopped once it runs again, smaller, no longer stopping)."""
        lj = self.jobs.get(job_id)
        return lj is not None and lj.state == JobState.RUNNING and lj.stopping is not None

    def _requeue(self, lj: LiveJob, batch: Batch, now: float) -> None:
        lj.state = move(lj.id, lj.state, JobState.PENDING)
        lj.tasks = []
        batch.job(lj.id, state=JobState.PENDING.value)
        self._make_pending(lj, batch)
        self.dirty = True

    def _finish(
        self,
        lj: LiveJob,
        state: JobState,
        batch: Batch,
        now: float,
        why: str,
        launch_refused: bool = False,
    ) -> None:
        """End `lj` in `state` saying `why`; `launch_refused`: its last attempt could not start,
        for good (`Stop.UNRUNNABLE`)."""
        if self.predictor is not None and state != JobState.SUCCEEDED:
            self.predictor.forget(lj.id)
        lj.state = move(lj.id, lj.state, state)
        self._unqueue(lj)
        release_kept(self.held, lj.id)  # it ended while waiting for victims
        del self.jobs[lj.id]
        account = lj.job.account
        self.live_per_user[account] -= jobs_counted(lj.job)
        if not self.live_per_user[account]:
            del self.live_per_user[account]
        self.live_bytes_per_user[account] -= lj.counted_bytes
        if not self.live_bytes_per_user[account]:
            del self.live_bytes_per_user[account]
        self.retention.ended_bytes.ended(lj.id, lj.job.user, lj.doc_bytes)
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
        # Once stored: a step whose write fails leaves the job live, to run again.
        batch.after.append(
            partial(remove_empty_checkpoint_dir, self.config.data_dir, lj.checkpoint_dir)
        )
        if self.waiters.get(lj.id):  # a bind waited for it: the next cycle may place that job
            self.dirty = True
        if lj.waiting_for:  # it ended while waiting on victims
            self._wait_for_victims(lj, None, batch)
        if state == JobState.FAILED and lj.job.replica_of is not None:
            self._replica_failed(lj, why, batch, now, launch_refused)
        if lj.job.replica_of is not None:
            self._service_stopped(lj.job.replica_of, batch, now)
        self.pipelines.on_end(lj.id, state, lj.job.name)
        batch.after.append(partial(self.pipelines.stored, lj.id))
        self._recheck_dependents(batch, now)

    def _replicas_left(self, service_id: str) -> bool:
        """Whether any replica of the service is live, one being stopped included."""
        return any(r.job.replica_of == service_id for r in list(self.jobs.values()))

    def _service_stopped(self, service_id: str, batch: Batch, now: float) -> None:
        """End a cancelled service once the last of its replicas has ended; only then are
        the jobs that depend on it re-checked, as for any running job that is cancelled."""
        svc = self.jobs.get(service_id)
        stop = None if svc is None else svc.stopping
        if svc is None or stop not in (Stop.CANCEL, Stop.UNRUNNABLE):
            return
        if self._replicas_left(service_id):
            return
        # A failing service's message is not stored: after a restart, it is worked out again.
        why = svc.stop_message or _no_replica_can_start(svc, "")
        svc.stopping, svc.stop_message = None, ""
        batch.job(svc.id, stopping=None)
        if stop == Stop.UNRUNNABLE:
            self._finish(svc, JobState.FAILED, batch, now, why)
        else:
            self._finish(
                svc, JobState.CANCELLED, batch, now, "cancelled; its replicas have stopped"
            )

    def _replica_failed(
        self, replica: LiveJob, why: str, batch: Batch, now: float, launch_refused: bool
    ) -> None:
        """Count a replica that failed for good in its service's crash loop: the replicas
        made for the service from now wait until the loop's backoff is over (`_scale_to`).
        But a replica whose launch was refused because the account that submitted the service
        is gone (deleted, its name perhaps given to another) ends the service, failed and not
        retried, as such a refusal ends a batch job: no replica of it can ever start, and a
        crash loop would only make and refuse replica after replica (`_fail_service`)."""
        svc = self.jobs.get(replica.job.replica_of or "")
        if svc is None or svc.job.service is None or svc.stopping is not None:
            return
        if launch_refused and (gone := account_gone(svc.job.user, svc.job.uid)) is not None:
            self._fail_service(svc, _no_replica_can_start(svc, gone, replica.id), batch, now)
            return
        run = replica_failed(
            svc.crash_loop, svc.job, replica.id, why, now, self.config.max_backoff_s
        )
        svc.crash_loop = run
        batch.event(
            now,
            svc.id,
            "replica-failed",
            f"{run.waiting_note(clock)} (a backoff of {run.until - now:g}s)",
        )

    def _fail_service(self, svc: LiveJob, why: str, batch: Batch, now: float) -> None:
        """End the service `svc`, failed, saying `why`: its replicas are cancelled, and it ends
        once they have stopped (`_service_stopped`), as a cancelled one does."""
        self._scale_to(svc, 0, "the service fails", batch, now)
        svc.stopping, svc.stop_message = Stop.UNRUNNABLE, why
        batch.job(svc.id, stopping=Stop.UNRUNNABLE.value)
        batch.event(now, svc.id, "failing", f"{why}: stopping its replicas")
        self._service_stopped(svc.id, batch, now)

    def _recheck_dependents(self, batch: Batch, now: float) -> None:
        """Re-check the jobs that wait on jobs that ended (`pipelines.recheck`), and those that
        wait on them in turn when a re-check ends them (a broken dependency cancels), until none
        is left. A loop over a work list, not recursion, so a chain of any length cascades in
        one go; a call made while one runs (a re-check that ends a job) leaves its work to that
        one. A re-check that meets a bug holds its job for a while, still waiting, and the
        rest are re-checked (`_hold_for_bug`); one the store fails stays first on the list, for
        the next step to redo."""
        if self.rechecking:
            return
        self.rechecking = True
        todo = self.pipelines.recheck
        try:
            while todo:
                waiting = self.jobs.get(todo[0])
                if (
                    waiting is not None
                    and waiting.state == JobState.PENDING
                    and waiting.id not in self.bug_held  # re-checked when its hold is over
                ):
                    try:
                        self._check_dependencies(waiting, batch, now)
                    except Exception as exc:
                        if not self._holds_for(exc):
                            raise  # a store that could not be read, or a test: still first
                        # Out of cycles until it is re-checked, when the hold is over.
                        self.pipelines.blocked.setdefault(waiting.id, "its re-check failed")
                        self._hold_for_bug(waiting, exc, "checking its dependencies", now)
                todo.popleft()
        finally:
            self.rechecking = False

    @contextlib.contextmanager
    def _ending_together(self, batch: Batch, now: float) -> Iterator[None]:
        """Jobs ended in the block end as one act (a bulk cancel, a refused submission): the
        jobs that wait on them are re-checked once the block is over, not as each ends.
        Re-checked at once, a job the act has still to end could be ended first as a broken
        dependent (and the act then ended it twice), or released (`condition: any`) and, a
        service, started. A block that raises leaves its re-checks on the list, for the
        step's own call (`loop.step`) to make."""
        if self.rechecking:  # inside a re-check: that one takes the work list's new jobs
            yield
            return
        self.rechecking = True
        try:
            yield
        finally:
            self.rechecking = False
        self._recheck_dependents(batch, now)


def _no_replica_can_start(svc: LiveJob, gone: str, replica: str = "") -> str:
    """Why a service whose account is gone fails (`gone`: `identity.account_gone`'s words)."""
    refused = f" (replica {replica}'s launch was refused)" if replica else ""
    was = f": {gone}" if gone else ""
    return (
        f"the account that submitted the service ({svc.job.user}) no longer exists{was}, so "
        f"none of its replicas can start{refused}; not retried"
    )


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

"""The cycle and its intents: one run of the pure core over a snapshot of the live state, and
every decision written as intent before it is acted on (a bind's job RUNNING with its task rows
`launching`; a preemption's or shrink's victim `stopping`), then acted on. Also the timers
that fall due between cycles (time limits, retry backoff, victims that take too long) and the
growth of elastic jobs into idle capacity (`lifecycle.elastic`). A preemption's victims and the
wait of the job they make room for follow `lifecycle.preemption`; a job the cycle says can
never fit, `lifecycle.admission`."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace

from aisched.core.cycle import CycleResult, InvariantViolation, run_cycle
from aisched.core.decisions import Bind, Preempt, Shrink
from aisched.core.elastic import extra_tasks_fit
from aisched.core.policy import Policy
from aisched.core.snapshot import PendingJob, Snapshot
from aisched.core.status import JobStatus, StatusCode
from aisched.executors.base import task_name
from aisched.lifecycle.admission import never_fits_now
from aisched.lifecycle.attempts import time_limit_at, time_limit_message
from aisched.lifecycle.elastic import (
    Running,
    capacity_is_idle,
    grew_from_after_start,
    grow_message,
    next_to_grow,
    queue_takes_back,
)
from aisched.lifecycle.preemption import (
    VictimWait,
    after_victims,
    blockers,
    keep_freed,
    release_kept,
    resume_order,
    resumed_tasks,
    wait_for,
)
from aisched.lifecycle.states import move
from aisched.model.job import Job
from aisched.model.states import JobState
from aisched.service import poison
from aisched.service.exits import Exits
from aisched.service.live import Batch, LiveJob, LiveTask, Requests, Stop, TaskPhase
from aisched.service.scheduler_state import clock

log = logging.getLogger("aisched.loop")


class Intents(Exits):
    def _hold_launches(self, pending: list[PendingJob], why: str, now: float) -> None:
        """No cycle while new launches are held (`launch_hold`): each job due to start says
        why it waits, once, and the next look is a cycle from now."""
        self.last_cycle_at = now
        status = JobStatus(StatusCode.NOT_CONSIDERED, f"launches are held: {why}")
        for view in pending:
            lj = self.jobs.get(view.job.id)
            if lj is not None:
                self._write_status(lj, status, self.batch)

    def _cycle(self, now: float, pending: list[PendingJob]) -> None:
        for job_id in list(self.held.views):  # the running jobs, not every live one
            lj = self.jobs.get(job_id)
            if lj is None or lj.stopping is None:
                continue
            view = lj.running_view
            if view is not None and not view.terminating:
                view = lj.running_view = replace(view, terminating=True)
                self.held.update(view)
        snapshot = self.held.snapshot(self.queues)
        # Estimated starts are for people to read: worked out by one cycle in `eta_interval_s`
        # (they cost a pass over the queue and, when they move, a write per waiting job); the
        # cycles between keep the last ones. Decisions are the same either way.
        etas = now - self.last_eta_at >= self.config.eta_interval_s
        if etas:
            self.last_eta_at = now
        t0 = time.perf_counter()
        result = self._run_cycle(
            snapshot, pending, self.policy if etas else self.policy_without_eta, now
        )
        took = time.perf_counter() - t0
        self.next_cycle_not_before = t0 + took * (1 + self.config.cycle_gap_factor)
        self.stats.cycles += 1
        self.stats.last_cycle_s = took
        self.last_cycle_at = now
        self.dirty = False
        if self.on_cycle is not None:
            self.on_cycle(took, result)
        batch = self.batch
        self.fresh.clear()
        self.waiting_shapes.clear()
        keep_eta = not etas and self.policy_without_eta is not self.policy
        launches: list[tuple[LiveJob, Requests]] = []
        # Launched once the intent is stored: by this flush, or by the one that retries it;
        # queued before the decisions are applied, so that what was applied before one that
        # raises (a bug) is launched with the batch it wrote, not left launching for ever.
        batch.after.append(lambda: self._launch_all(launches, now))
        for d in result.decisions:
            if isinstance(d, Preempt):
                self._apply_preempt(d, batch, now)
            elif isinstance(d, Shrink):
                self._apply_shrink(d, batch, now)
            elif isinstance(d, Bind):
                planned = self._apply_bind(d, batch, now)
                if planned is not None:
                    launches.append(planned)
        # A status per waiting job: this loop is the service's share of a long queue's
        # cycle, so a status unchanged since it was last written costs two comparisons.
        jobs, shapes = self.jobs, self.waiting_shapes
        for job_id, status in result.diagnostics.items():
            waiting = jobs.get(job_id)
            if waiting is None or waiting.state is not JobState.PENDING or waiting.waiting_for:
                continue
            code = status.code
            if code is StatusCode.NEVER_FITS:
                with_lost, lost, shrank = self._with_lost(now)
                end = never_fits_now(waiting.job, status.reason, self.policy, with_lost)
                if end is not None:
                    self._finish(waiting, end.state, batch, now, self._gave_up(waiting, end.why))
                    continue
                waiting.waited_for_left = tuple(lost)
                waiting.waited_for_shrunk = tuple(shrank)
                status = JobStatus(
                    StatusCode.WAIT_RESOURCES,
                    f"{status.reason.replace('can never fit', 'does not fit')} now; waits up "
                    f"to {self.config.lost_node_grace_s:g} s for {self._awaited(lost, shrank)}",
                )
            elif code is not StatusCode.PLACED and code is not StatusCode.PREEMPTING:
                shapes.add((waiting.job.shape_id, waiting.job.queue))
                written = waiting.written_status
                if (
                    keep_eta
                    and status.eta_s is None
                    and written is not None
                    and written[1] == status.reason
                    and written[0] == code
                ):
                    continue  # as written, with its last estimated start
            self._write_status(waiting, status, batch, keep_eta)
        batch.flush(self.store)
        if self.config.validate:
            self._validate(now)

    def _run_cycle(
        self, snapshot: Snapshot, pending: list[PendingJob], policy: Policy, now: float
    ) -> CycleResult:
        """`run_cycle`; if it raises and one job alone sets it off (`poison`), that job is held
        back for `poison.HOLD_S`, saying why, and the cycle runs without it. A failure that is
        not one job's, or one in validate mode (tests want the bug), fails the step as before."""
        try:
            return run_cycle(snapshot, pending, policy, now)
        except Exception as exc:
            if self.config.validate:
                raise
            failed = exc
        left = list(pending)
        for _ in range(poison.MAX_HELD_PER_CYCLE):
            found = poison.job_it_fails_on(
                lambda part: run_cycle(snapshot, part, policy, now), left
            )
            if found is None:
                raise failed
            view, error = found
            self._hold_poison(view.job.id, error, now)
            left = [p for p in left if p is not view]
            try:
                return run_cycle(snapshot, left, policy, now)
            except Exception as exc:
                failed = exc
        raise failed

    def _hold_poison(self, job_id: str, error: Exception, now: float) -> None:
        """Leave a job the cycle fails on out of cycles for `poison.HOLD_S` (its retry
        backoff's field and timer), with the error in its status and events and the traceback
        in the log: a bug to report, which the job's owner cannot mend."""
        lj = self.jobs[job_id]
        until = now + poison.HOLD_S
        self.stats.held_for_cycle_errors += 1
        why = (
            f"held until {clock(until)}: the scheduler fails on this job ({poison.a_bug(error)}); "
            "the other jobs are scheduled without it, and it is tried again then"
        )
        log.error("job %s: %s", lj.id, why, exc_info=error)
        self.batch.event(now, lj.id, "held", why)
        self._hold_until(lj, JobStatus(StatusCode.NOT_CONSIDERED, why, until), self.batch)

    def _awaited(self, lost: list[str], shrank: list[str]) -> str:
        """What a job admitted before waits for: the nodes that left to come back, those that
        shrank at a restart to be as large again (with what they have now and had before)."""
        parts = [f"{', '.join(lost)}, which left, to come back"] if lost else []
        now = {n.name: n for n in self.nodes}
        for name in shrank:
            was = self.shrank[name][0].capacity.describe()
            has = now[name].capacity.describe() if name in now else "nothing"
            parts.append(
                f"{name}, which has {has} since the restart ({was} before), to be as large again"
            )
        return " and ".join(parts)

    def _gave_up(self, lj: LiveJob, why: str) -> str:
        """`why` a job fails as never fitting, naming the nodes it waited for that are still
        away or that shrank: its last reason said it waited for them, and they are why it
        fails now."""
        here = {n.name for n in self.nodes}
        away = [name for name in lj.waited_for_left if name not in here]
        parts = [f"{', '.join(away)}, which left, to come back"] if away else []
        parts += [
            f"{name}, smaller since the restart, to be as large again"
            for name in lj.waited_for_shrunk
        ]
        if not parts:
            return why
        return (
            f"{why}; waited {self.config.lost_node_grace_s:g} s (lost_node_grace) for "
            f"{' and '.join(parts)}"
        )

    def _fresh_could_start(self) -> bool:
        """Whether a job submitted since the last cycle could start now, so a cycle for it need
        not wait out the gap an earlier, longer cycle left (`cycle_gap_factor`): its tasks fit
        in what is free (counted coarsely: whole GPUs, any node), and the last cycle left no job
        of its shape and queue waiting. A guess that is wrong costs one cycle, never a
        decision."""
        looked = set(self.waiting_shapes)  # a burst is mostly of a few shapes: one look each
        for job in self.fresh:
            key = (job.shape_id, job.queue)
            if key in looked:
                continue
            looked.add(key)
            fits = sum(
                extra_tasks_fit(self.arrays, self.free, g.request, g.replicas) for g in job.groups
            )
            if fits >= job.gang_min:
                return True
        return False

    def _validate(self, now: float) -> None:
        """Validate mode: the ledger matches the held bindings, no job is both pending and
        running, and every running job's tasks are what it holds."""
        problems = self.held.problems()
        for lj in self.jobs.values():
            held = self.held.views.get(lj.id)
            if lj.pending_view is not None and held is not None:
                problems.append(f"job {lj.id} both pending and running")
            if held is not None and held.tasks != tuple(t.binding for t in lj.tasks):
                problems.append(f"job {lj.id} holds other tasks than it runs")
        if problems:
            raise InvariantViolation(f"t={now}: " + "; ".join(problems))

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

    def _apply_bind(self, d: Bind, batch: Batch, now: float) -> tuple[LiveJob, Requests] | None:
        lj = self.jobs.get(d.job_id)
        if lj is None or lj.state != JobState.PENDING:
            return None
        stopping = self._still_stopping
        holders = (*d.after, *blockers(d.tasks, self.held, stopping))
        wait = wait_for(holders, stopping, now, d.tasks)
        if wait is not None:
            self._wait_for_victims(lj, wait, batch)  # and says so in its reason
            return None
        lj.state = move(lj.id, lj.state, JobState.RUNNING)
        lj.attempt += 1
        self.retention.attempt_placed(lj.id, lj.attempt)
        lj.attempt_started_at = now
        if lj.started_at is None:
            lj.started_at = now
        pending = self._unqueue(lj)
        logs = self.config.data_dir / "logs" / lj.id / str(lj.attempt)
        ordered = sorted(d.tasks, key=lambda t: (_group_index(lj.job, t.group), t.index))
        lj.grew_from = grew_from_after_start(lj.grew_from, len(d.tasks))
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
        self._arm_timers(lj)
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
        # Placed, not started: the tasks are made once this batch is stored (`_launch_all`,
        # which records `started`), and a leader that dies or pauses first never makes them.
        batch.event(now, lj.id, "placed", f"attempt {lj.attempt}: {where}")
        return lj, self._launch_requests(lj)

    def _timers(self, batch: Batch, now: float) -> None:
        """Act on what fell due: the jobs whose timers came (`timers`), those waiting for
        victims (`waiters`) and those whose hold for a bug is over (`bug_held`), in submission
        order; no other job has anything due. A job whose handling raises is held for a bug
        (`_hold_for_bug`) and the others are handled."""
        ids = self.timers.pop_due(now) | self._bug_holds_over(now)
        for waiting in self.waiters.values():
            ids |= waiting
        ended: dict[str, VictimWait] = {}  # waits for victims that are over
        going_on: dict[str, VictimWait] = {}  # the others, as they stood before this step
        for job_id in sorted(ids, key=lambda i: (len(i), i)):
            lj = self.jobs.get(job_id)
            if lj is None or job_id in self.bug_held:
                continue
            try:
                self._timer_due(lj, ended, going_on, batch, now)
            except Exception as exc:
                if not self._holds_for(exc):
                    raise
                self._hold_for_bug(lj, exc, "its timers", now)
        # Every exit of the step is in: what victims freed is kept for the jobs whose waits
        # go on, judged now, whatever order the exits came in (`lifecycle.preemption`).
        freed_now, self.freed_now = self.freed_now, []
        for victim, freed in freed_now:
            keep_freed(self.held, victim, freed, going_on, lambda j: self.jobs[j].job, now)
        for job_id in resume_order(ended):
            lj = self.jobs[job_id]
            try:
                self._victims_stopped(lj, ended[job_id], batch, now)
            except Exception as exc:
                if not self._holds_for(exc):
                    raise
                self._hold_for_bug(lj, exc, "its start after its victims stopped", now)

    def _timer_due(
        self,
        lj: LiveJob,
        ended: dict[str, VictimWait],
        going_on: dict[str, VictimWait],
        batch: Batch,
        now: float,
    ) -> None:
        """What is due for one job: its time limit, the end of its backoff, and whether its
        wait for victims is over (into `ended`) or goes on (into `going_on`). A running job
        whose tasks have all exited is at the end of its attempt, which an exit's handling
        that raised (`_take_exit`) did not reach."""
        if lj.state == JobState.RUNNING and lj.tasks and not lj.live_tasks():
            self._end_attempt(lj, batch, now)
            return
        if (
            lj.state == JobState.RUNNING
            and lj.stopping is None
            and now >= time_limit_at(lj.job, lj.attempt_started_at)
        ):
            why = time_limit_message(lj.job)
            self._stop_over_limit(lj, Stop.TIMEOUT, "timeout", why, batch, now)
        if lj.not_before is not None and lj.not_before <= now:
            lj.not_before = None
            batch.job(lj.id, not_before=None)
            self.dirty = True
        if lj.waiting_for:
            was = VictimWait(
                lj.waiting_for,
                now if lj.waiting_since is None else lj.waiting_since,
                lj.waiting_tasks,
            )
            wait = after_victims(
                was,
                self._still_stopping,
                lambda v: self.jobs[v].job.grace_period_s,
                now,
                self.config.victim_wait_s,
            )
            if wait is None:
                ended[lj.id] = was
            else:
                going_on[lj.id] = was
                self._wait_for_victims(lj, wait, batch)

    def _victims_stopped(self, lj: LiveJob, wait: VictimWait, batch: Batch, now: float) -> None:
        """A job's wait for its victims is over: it starts where the core bound it, with what
        they freed, else it is placed afresh by a cycle."""
        self._wait_for_victims(lj, None, batch)
        release_kept(self.held, lj.id)
        self.dirty = True
        tasks = resumed_tasks(wait, self.held)
        if tasks is not None:
            planned = self._apply_bind(Bind(lj.id, tasks), batch, now)
            if planned is not None:
                self.restarts.append(planned)

    def _bug_holds_over(self, now: float) -> set[str]:
        """The jobs whose hold for a bug ends now; those that wait on other jobs are
        re-checked too (a re-check may be what raised, and it was not done)."""
        over = {job_id for job_id, until in self.bug_held.items() if until <= now}
        for job_id in sorted(over, key=lambda i: (len(i), i)):
            del self.bug_held[job_id]
            if job_id in self.pipelines.blocked:
                self.pipelines.recheck.append(job_id)
            self.exits_due.extend(self.exits_held.pop(job_id, ()))  # for the next step
        return over

    def _hold_for_bug(self, lj: LiveJob, error: Exception, what: str, now: float) -> None:
        """Handling `what` of one job raised: a bug met on that job alone (the step's other
        work does not need it). Every step would
        meet it again and fail, stopping every other job with it; so this job's timers and
        re-checks are left alone for `poison.HOLD_S`, then tried again; a job that waits on
        victims or on other jobs stays out of cycles meanwhile. What the failed call changed
        before it raised stays as it is."""
        until = now + poison.HOLD_S
        self.bug_held[lj.id] = until
        self.stats.held_for_step_errors += 1
        why = (
            f"held until {clock(until)}: the scheduler fails on {what} "
            f"({poison.a_bug(error)}); the other jobs go on, and it is tried again then"
        )
        log.error("job %s: %s", lj.id, why, exc_info=error)
        self.batch.event(now, lj.id, "held", why)
        if lj.state == JobState.PENDING:
            self._write_status(lj, JobStatus(StatusCode.NOT_CONSIDERED, why, until), self.batch)

    def _stop_over_limit(
        self, lj: LiveJob, stop: Stop, event: str, why: str, batch: Batch, now: float
    ) -> None:
        """Stop a running job past one of its limits (its time limit, its user's running
        logs): it fails, not retried, saying `why` (in its events as `event`)."""
        lj.stopping = stop
        lj.stop_message = why
        batch.job(lj.id, stopping=stop.value)
        batch.event(now, lj.id, event, why)
        self._stop_tasks(lj, batch)

    def _bound_running_logs(self, batch: Batch, now: float) -> None:
        """Stop the jobs whose users' running logs are past their bound (`running_logs`)."""
        if not self.running_logs.due(now):
            return  # the walk below is for a check only
        running = {
            lj.id: lj.job.user
            for lj in self.jobs.values()
            if lj.state == JobState.RUNNING and lj.stopping is None
        }
        for job_id, why in self.running_logs.over(running, now):
            lj = self.jobs[job_id]
            log.warning("job %s (user %s): %s", job_id, lj.job.user, why)
            self._stop_over_limit(lj, Stop.LOGS, "logs-over-bound", why, batch, now)

    def _grow_elastic(self, now: float) -> None:
        """Nothing waits: restart the elastic job that idle capacity could make larger, one at
        a time (`lifecycle.elastic.next_to_grow`; none while another is stopping to be
        requeued). The stop is a requeue (SIGTERM first, so it checkpoints; no failure
        counted); the next cycle places it with as many tasks as fit."""
        jobs = list(self.jobs.values())
        requeuing = any(lj.stopping == Stop.REQUEUE for lj in jobs)
        # The step calls this with nothing pending and no job waiting for victims.
        if not capacity_is_idle(pending=False, waiting_for_victims=False, requeuing=requeuing):
            return
        running = (
            Running(lj.job, len(lj.tasks), lj.attempt_started_at, lj.grew_from)
            for lj in jobs
            if lj.state == JobState.RUNNING and lj.stopping is None
        )
        room = functools.partial(queue_takes_back, self.queues, self.held)
        after = self.config.elastic_grow_after_s
        found = next_to_grow(running, now, after, self.arrays, self.free, room)
        if found is None:
            return
        lj, extra = self.jobs[found[0].id], found[1]
        batch = self.batch
        held = len(lj.tasks)
        lj.stopping = Stop.REQUEUE
        lj.grew_from = held
        lj.stop_message = grow_message(held, extra)
        batch.job(lj.id, stopping=Stop.REQUEUE.value)
        batch.event(now, lj.id, "growing", lj.stop_message)
        self._stop_tasks(lj, batch)
        batch.flush(self.store)


def _group_index(job: Job, group: str) -> int:
    for i, g in enumerate(job.groups):
        if g.name == group:
            return i
    return len(job.groups)

"""Commands in: the public face other threads call (`submit`, `submit_all`, `scale`,
`cancel`: each queues a command and returns a Future), and how the loop thread applies them:
admission (refused at once when a job can never run), pipelines' dependencies, services and
their replicas, cancellation.

Every command taken off the queue is answered: with its result once what it changed is stored,
or with `Rejected`. A command that needs to read the store before it may change anything (an
Idempotency-Key to look up, an ended job to name, a pipeline's earlier jobs) and finds the store
unreadable (locked, unreachable) is refused with 503 at once, having changed nothing, so the
caller may send it again with the same key (`_reading`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace

from aisched.core.dependencies import DependencyVerdict
from aisched.core.status import JobStatus, StatusCode
from aisched.lifecycle.admission import refusal
from aisched.lifecycle.services import replica_name, replicas_within, surplus
from aisched.lifecycle.states import move
from aisched.model.job import Job, JobKind
from aisched.model.states import JobState
from aisched.service import poison
from aisched.service.identity import same_account
from aisched.service.intents import Intents
from aisched.service.launches import free_port
from aisched.service.live import Batch, LiveJob, Stop
from aisched.service.loop_types import (
    CancelCommand,
    NotAccepting,
    Rejected,
    ScaleCommand,
    SubmitAllCommand,
    SubmitCommand,
)
from aisched.service.paths import checkpoint_dir
from aisched.service.pipelines import DependencyError
from aisched.service.replicas import replica_job
from aisched.service.retention import no_job
from aisched.service.scheduler_state import bytes_counted, clock, jobs_counted
from aisched.service.step_errors import classify, one_line
from aisched.store.codec import job_to_dict, submitter_uid
from aisched.store.db import Row

log = logging.getLogger("aisched.loop")


class Commands(Intents):
    def submit(
        self,
        job: Job,
        fmt: str = "native",
        warnings: tuple[str, ...] = (),
        idempotency_key: str | None = None,
        not_accepting: NotAccepting | None = None,
    ) -> Future[Row]:
        """Queue a job (its id is set by the loop; its submit time is now); the Future gives
        the job's row as stored once it is durable, or raises Rejected (e.g. it can never fit
        this machine). With an `idempotency_key` its user already used, the Future gives that
        earlier job's row instead, and nothing new is stored. With `not_accepting` (the
        service takes no new work now) only that earlier job is answered: a new one raises
        `not_accepting`."""
        fut: Future[Row] = Future()
        self.commands.put(
            SubmitCommand(job, fmt, warnings, self.clock(), fut, idempotency_key, not_accepting)
        )
        self.wake.set()
        return fut

    def submit_all(
        self,
        items: tuple[tuple[Job, str, tuple[str, ...]], ...],
        idempotency_key: str | None = None,
        not_accepting: NotAccepting | None = None,
    ) -> Future[list[Row]]:
        """Queue jobs submitted together, each (job, format, warnings); their `depends_on`
        name jobs of `items` by name, or earlier jobs by id. The Future gives every job's row,
        in order, or raises Rejected and stores none of them (`idempotency_key` and
        `not_accepting` as `submit`)."""
        fut: Future[list[Row]] = Future()
        self.commands.put(
            SubmitAllCommand(items, self.clock(), fut, idempotency_key, not_accepting)
        )
        self.wake.set()
        return fut

    def scale(
        self,
        service_id: str,
        replicas: int,
        reason: str,
        replace: str | None = None,
        ready: frozenset[str] | None = None,
    ) -> Future[int]:
        """Ask for `replicas` live replicas of a service: new ones are submitted, surplus ones
        cancelled (pending ones first, then running ones not among the `ready` when given,
        then the newest); with `replace`, that replica is cancelled first and does not count
        (a new one takes its place). The Future gives the number asked for, or raises
        Rejected(404/409) for an unknown or ended service."""
        fut: Future[int] = Future()
        self.commands.put(ScaleCommand(service_id, replicas, reason, fut, replace, ready))
        self.wake.set()
        return fut

    def cancel(self, job_id: str) -> Future[str]:
        """Cancel a job: at once if pending, after its tasks stopped if running. The Future
        gives the job's state after the command; Rejected(404/409) if unknown or finished."""
        fut: Future[str] = Future()
        self.commands.put(CancelCommand(job_id, fut))
        self.wake.set()
        return fut

    def _refusal(self, job: Job, now: float) -> Rejected | None:
        """Why `job` is refused now (it can never run here), or None. A bug that the check
        meets on this job alone (it is the core's placement, plugins included) refuses it
        with 500 and is logged: the step goes on for every other caller's commands, where a
        raise would fail it (readiness with it) as often as the job is sent."""
        try:
            why = refusal(self._admitting_against(now), self.policy, job)
        except Exception as exc:
            log.error("the admission check failed on a submission of %s (a bug)", job.user,
                      exc_info=exc)  # fmt: skip
            return Rejected(
                f"the scheduler failed on this job ({poison.a_bug(exc)}); nothing of it was kept",
                500,
            )
        return None if why is None else Rejected(why)

    def _on_submit(self, cmd: SubmitCommand, batch: Batch, now: float) -> None:
        try:
            earlier = self._idempotent(cmd.job.user, cmd.job.uid, cmd.idempotency_key, 1)
        except Rejected as e:
            cmd.future.set_exception(e)
            return
        if earlier is not None:
            rows = earlier
            batch.after.append(lambda: cmd.future.set_result(rows[0]))
            return
        if cmd.not_accepting is not None:
            cmd.future.set_exception(cmd.not_accepting)
            return
        past = self._past_user_limit([cmd.job])
        if past is not None:
            cmd.future.set_exception(Rejected(past, 429))
            return
        why = self._refusal(cmd.job, now)
        if why is not None:
            cmd.future.set_exception(why)
            return
        row = self._admit(cmd.job, cmd.fmt, cmd.warnings, cmd.received_at, batch)
        self._remember_key(cmd.job.user, cmd.idempotency_key, [row], batch)
        batch.after.append(lambda: cmd.future.set_result(row))

    def _on_submit_all(self, cmd: SubmitAllCommand, batch: Batch, now: float) -> None:
        # 1. Answer a retry with the jobs it made; refuse the whole submission if any job of it
        #    can never run or depend as asked.
        user = cmd.items[0][0].user if cmd.items else ""
        uid = cmd.items[0][0].uid if cmd.items else None
        try:
            earlier = self._idempotent(user, uid, cmd.idempotency_key, len(cmd.items))
        except Rejected as e:
            cmd.future.set_exception(e)
            return
        if earlier is not None:
            found = earlier
            batch.after.append(lambda: cmd.future.set_result(found))
            return
        if cmd.not_accepting is not None:
            cmd.future.set_exception(cmd.not_accepting)
            return
        if (past := self._past_user_limit([job for job, _, _ in cmd.items])) is not None:
            cmd.future.set_exception(Rejected(past, 429))
            return
        for job, _fmt, _warnings in cmd.items:
            why = self._refusal(job, now)
            if why is not None:
                cmd.future.set_exception(Rejected(f"job {job.name!r}: {why}", why.status))
                return
        ids = [str(self.next_seq + i) for i in range(len(cmd.items))]
        try:
            with _reading("the jobs it depends on", _SEND_AGAIN_WITH_KEY):
                jobs = self.pipelines.resolve([j for j, _, _ in cmd.items], ids, self.jobs)
        except DependencyError as e:
            cmd.future.set_exception(Rejected(str(e)))
            return
        except Rejected as e:
            cmd.future.set_exception(e)
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
        self._remember_key(user, cmd.idempotency_key, rows, batch)
        batch.after.append(lambda: cmd.future.set_result(rows))

    def _past_user_limit(self, jobs: list[Job]) -> str | None:
        """Why adding `jobs` (one submission's, of one account) would take their account past
        `user_max_jobs` or `user_max_job_bytes`, or None. What counts is the account's own
        (`Job.counted_with`): the jobs of a deleted account whose name another now holds are
        not the new account's."""
        if not jobs:
            return None
        user, counted = jobs[0].user, jobs[0].counted_with
        adding = sum(jobs_counted(job) for job in jobs)
        most = self.config.user_max_jobs
        has = sum(self.live_per_user[key] for key in counted)
        if most > 0 and has + adding > most:
            more = "" if adding == 1 else f" (this submission counts {adding})"
            return (
                f"{user} has {has} jobs not yet ended and may have at most {most}{more} "
                "(limits.user_max_jobs; a service counts with the replicas it may scale to): "
                "wait for some to end, or cancel some"
            )
        most = self.config.user_max_job_bytes
        if most <= 0:
            return None
        adding = sum(bytes_counted(job) for job in jobs)
        has = sum(self.live_bytes_per_user[key] for key in counted)
        if has + adding <= most:
            return None
        return (
            f"{user}'s jobs not yet ended take {_mib(has)} of job documents, and this "
            f"submission {_mib(adding)} more; at most {_mib(most)} (limits.user_max_job_bytes; "
            "a service counts once for each replica it may scale to): wait for some to end, "
            "cancel some, or send smaller documents"
        )

    def _idempotent(self, user: str, uid: int | None, key: str | None, n: int) -> list[Row] | None:
        """The rows an earlier submission with this key made, if any (the first job holds the
        key, the others of a pipeline `KEY/1`, `KEY/2`...); they may not be stored yet (the
        batch holds them), so the caller answers once the batch has flushed. Raises
        Rejected(503) when the store cannot be read: nothing has changed then; Rejected(409)
        when the key was used by another account of `user`'s name (uid `uid`): one deleted
        since, whose jobs are not the caller's to be given."""
        if key is None:
            return None
        rows = self.unstored_keys.get((user, key))
        if rows is None:
            keys = [key] + [f"{key}/{i}" for i in range(1, n)]
            with _reading("its Idempotency-Key", _SEND_AGAIN_WITH_KEY), self.store.read() as tx:
                rows = tx.jobs_by_idempotency_key(user, keys)
        if rows and not same_account(user, uid, rows[0]["user"], submitter_uid(rows[0]["spec"])):
            raise Rejected(
                f"Idempotency-Key {key!r} was used by another account named {user} (uid "
                f"{submitter_uid(rows[0]['spec'])}, deleted since): send the submission with "
                "another key",
                409,
            )
        return rows or None

    def _remember_key(self, user: str, key: str | None, rows: list[Row], batch: Batch) -> None:
        if key is None:
            return
        for i, row in enumerate(rows):
            row["idempotency_key"] = key if i == 0 else f"{key}/{i}"
        self.unstored_keys[(user, key)] = rows

        def stored() -> None:
            self.unstored_keys.pop((user, key), None)

        batch.after.append(stored)

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
        ckpt = checkpoint_dir(self.config.data_dir, self.config.instance, job.user, job_id)
        lj = LiveJob(job=job, state=JobState.PENDING, submitted_at=submitted, checkpoint_dir=ckpt)
        self._add_live(lj)
        service = job.kind == JobKind.SERVICE
        if not service:
            self._make_pending(lj, batch)
            self.fresh.append(job)
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
            "idempotency_key": None,  # set by _remember_key before the batch is flushed
        }
        batch.new_jobs.append(row)
        lj.written_status = (StatusCode.NOT_CONSIDERED.value, "", None)
        batch.event(submitted, job_id, "submitted", f"submitted to queue {job.queue}")
        self.dirty = True
        if service and start_service and not job.depends_on:  # else its dependencies start it
            self._start_service(lj, batch, submitted, row)
        return row

    def _start_service(self, lj: LiveJob, batch: Batch, now: float, row: Row | None = None) -> None:
        """A service runs from its start (its submission, or once its dependencies are met)
        until cancelled; its replicas are the work. It never enters the cycle itself."""
        assert lj.job.service is not None
        lj.state = move(lj.id, lj.state, JobState.RUNNING)
        self._unqueue(lj)
        lj.started_at = lj.attempt_started_at = now
        self._arm_timers(lj)
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

    def _on_scale(self, cmd: ScaleCommand, batch: Batch, now: float) -> None:
        lj = self.jobs.get(cmd.service_id)
        if lj is None or lj.job.kind != JobKind.SERVICE or lj.job.service is None:
            cmd.future.set_exception(Rejected(f"no live service {cmd.service_id}", 404))
            return
        if lj.stopping is not None:  # a round that began before the cancel
            cmd.future.set_exception(Rejected(f"service {lj.id} is being cancelled", 409))
            return
        n = replicas_within(lj.job.service, cmd.replicas)
        old = self.jobs.get(cmd.replace) if cmd.replace is not None else None
        if old is not None and old.job.replica_of == lj.id and old.stopping != Stop.CANCEL:
            self._retire(old, f"replaced: {cmd.reason}", batch, now)
        self._scale_to(lj, n, cmd.reason, batch, now, cmd.ready)
        batch.after.append(lambda: cmd.future.set_result(n))

    def replicas_of(self, service_id: str) -> list[LiveJob]:
        """Live replicas of a service not being stopped for good, oldest first."""
        out = [
            r
            for r in list(self.jobs.values())
            if r.job.replica_of == service_id and r.stopping != Stop.CANCEL
        ]
        return sorted(out, key=lambda r: (len(r.id), r.id))

    def _scale_to(
        self,
        svc: LiveJob,
        n: int,
        reason: str,
        batch: Batch,
        now: float,
        ready: frozenset[str] | None = None,
    ) -> None:
        live = self.replicas_of(svc.id)
        if len(live) == n:
            return
        # After replicas failed in a row, new ones wait out the crash loop's backoff.
        run = svc.crash_loop
        if run is not None and (n < len(live) or run.until <= now):
            run = None
        if run is not None:
            reason = f"{reason}; {run.waiting_note(clock)}"
        batch.event(now, svc.id, "scaling", f"{len(live)} -> {n} replicas: {reason}")
        for _ in range(n - len(live)):
            name = replica_name(svc.job, str(self.next_seq))
            replica = replica_job(svc.job, name, free_port(self.config.master_addr))
            row = self._admit(replica, "native", (), now, batch)
            if run is not None:
                status = JobStatus(StatusCode.WAIT_RESOURCES, run.waiting_note(clock), run.until)
                self._hold_until(self.jobs[row["id"]], status, batch)
        going = surplus([(r.id, r.state == JobState.RUNNING) for r in live], n, ready)
        for r in (self.jobs[job_id] for job_id in going):
            self._retire(r, f"scaled down: {reason}", batch, now)

    def _retire(self, replica: LiveJob, message: str, batch: Batch, now: float) -> None:
        """Cancel a replica for its service: a running one is stopped first."""
        if replica.state == JobState.RUNNING:
            replica.stopping = Stop.CANCEL
            replica.stop_message = message
            batch.job(replica.id, stopping=Stop.CANCEL.value)
            batch.event(now, replica.id, "cancelling", message)
            self._stop_tasks(replica, batch)
        else:
            self._finish(replica, JobState.CANCELLED, batch, now, message)

    def _on_cancel(self, cmd: CancelCommand, batch: Batch, now: float) -> None:
        lj = self.jobs.get(cmd.job_id)
        ended = batch.jobs.get(cmd.job_id, {}).get("state") if lj is None else None
        if ended is not None:
            # It ended in this step (another cancel, a bulk one): the store still has it live
            # until the batch is stored, and this answer waits for that, as the first did.
            refused = Rejected(f"job {cmd.job_id} has already ended ({ended})", 409)
            batch.after.append(lambda: cmd.future.set_exception(refused))
            return
        if lj is None:
            try:
                with _reading("the job", "send it again"), self.store.read() as tx:
                    row = tx.get_job(cmd.job_id)
            except Rejected as e:
                cmd.future.set_exception(e)
                return
            if row is None:
                cmd.future.set_exception(Rejected(no_job(cmd.job_id, self.next_seq - 1), 404))
            else:
                cmd.future.set_exception(
                    Rejected(f"job {cmd.job_id} has already ended ({row['state']})", 409)
                )
            return
        state = self._cancel_live(lj, batch, now)
        batch.after.append(lambda: cmd.future.set_result(state))

    def _cancel_live(self, lj: LiveJob, batch: Batch, now: float) -> str:
        """Cancel a live job: a pending one ends at once, a running one is stopped first (a
        service: its replicas; it ends once they have, `Exits._service_stopped`). Returns its
        state after this (cancelled, or running while it stops)."""
        if lj.job.kind == JobKind.SERVICE:
            if lj.stopping == Stop.CANCEL:
                return JobState.RUNNING.value
            self._scale_to(lj, 0, "the service is cancelled", batch, now)
            if not self._replicas_left(lj.id):
                why = "cancelled" if lj.state == JobState.RUNNING else "cancelled while pending"
                self._finish(lj, JobState.CANCELLED, batch, now, why)
                return JobState.CANCELLED.value
            # Running until its replicas have stopped: the jobs that depend on it wait so.
            lj.stopping = Stop.CANCEL
            lj.stop_message = "cancelled"
            batch.job(lj.id, stopping=Stop.CANCEL.value)
            batch.event(now, lj.id, "cancelling", "cancel requested: stopping its replicas")
            return JobState.RUNNING.value
        if lj.state == JobState.RUNNING:
            if lj.stopping != Stop.CANCEL:
                lj.stopping = Stop.CANCEL
                lj.stop_message = "cancelled"
                batch.job(lj.id, stopping=Stop.CANCEL.value)
                batch.event(now, lj.id, "cancelling", "cancel requested: stopping its tasks")
                self._stop_tasks(lj, batch)
            return JobState.RUNNING.value
        self._finish(lj, JobState.CANCELLED, batch, now, "cancelled while pending")
        return JobState.CANCELLED.value


# A submission refused before anything was stored is safe to send again as it was.
_SEND_AGAIN_WITH_KEY = "send it again with the same Idempotency-Key"


@contextlib.contextmanager
def _reading(what: str, again: str) -> Iterator[None]:
    """A read the command needs before it changes anything: a store that fails it (locked,
    unreachable, an I/O error) refuses the command with 503 saying why, rather than failing
    the step with the command already off the queue and its caller never answered. A bug
    still raises."""
    try:
        yield
    except Rejected:
        raise
    except Exception as exc:
        if classify(exc) == "bug":
            raise
        why = one_line(exc)
        log.warning("a command was refused: the store could not be read: %s", why)
        raise Rejected(
            f"not taken: the store could not be read to check {what} ({why}); nothing was "
            f"changed: {again} (GET /v1/readyz says when the store is back)",
            503,
        ) from exc


def _mib(n: int) -> str:
    """A size for a person: bytes below 10 KiB (a limit of 1K read "0.00 MiB"), else MiB with
    two decimals below 10 MiB."""
    if n < 10 << 10:
        return f"{n:,} bytes"
    mib = n / (1 << 20)
    return f"{mib:.2f} MiB" if mib < 10 else f"{mib:.0f} MiB"

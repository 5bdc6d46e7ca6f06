"""Ended jobs are kept `limits.keep_ended` (30 days by default), then forgotten: their rows,
task rows and events in the store, and their files in the data directory (`logs/JOB`, the
local executor's `tasks/JOB`), so a service that runs for months does not fill its disk and
its lists with history; one user's oldest ended jobs go sooner, when what their ended jobs
keep passes `limits.user_max_ended_bytes` (`ended_bytes`). Checkpoint directories are left
alone: they may hold what the job made (a user's are in their home anyway).

Only jobs that have ended are ever forgotten (the store checks the state again as it deletes),
and never the newest job: its id is where the next id is counted from, so an id, and with it a
log or checkpoint directory, is never given out twice. The leader's loop does this, at most
`FORGET_AT_MOST` jobs in a step: their files first, then their rows in the step's own
transaction, so no file outlives the rows that name it.

A live job keeps the records of its latest `limits.keep_attempts` attempts only (20 by
default): a job that restarts for ever (`restart: always`, or many retries and preemptions)
made a task row, a `tasks/JOB/ATTEMPT` and a `logs/JOB/ATTEMPT` folder and a few events per
attempt, without end (one that exits at once: 1,478 attempts and 35 MB in a minute). When an
attempt past that count is placed, the attempts before the kept ones are forgotten in the next
step, the same careful way: their folders first, then their task rows and their events (those
before the placement of the oldest attempt kept, except the job's first few,
`live.FIRST_EVENTS_KEPT`), and one `attempts-forgotten` event says so. Nothing of the kept
attempts goes, and so nothing that recovery reads (the current attempt's task rows, exit
records and events); an earlier attempt has ended for good before a later one is placed (an
attempt's resources are given back, and the next one bound, only once every task of it has
exited).

Audit rows are kept `limits.keep_audit` (365 days by default) and deleted by the same pass, in
the same batches (at most `FORGET_AT_MOST` rows a step).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path

from aisched.model.numerals import is_decimal
from aisched.service.ended_bytes import Ended, EndedBytes, job_dirs
from aisched.service.live import Batch
from aisched.store.db import ATTEMPTS_FORGOTTEN, Store

log = logging.getLogger("aisched.loop")

FORGET_EVERY_S = 60.0  # or a tenth of `keep_s`, when that is shorter
FORGET_AT_MOST = 500
MAX_ATTEMPT_DIGITS = 18  # a longer folder name is no attempt's


def no_job(job_id: str, newest_seq: int) -> str:
    """What a request naming no job is answered: an id given out before (at or under the newest
    job's) was most likely forgotten, and its owner may wonder where it went."""
    if is_decimal(job_id) and 0 < int(job_id) <= newest_seq:
        return (
            f"no job {job_id}: an ended job is forgotten limits.keep_ended after it ended, and "
            "sooner when its user's ended jobs keep more than limits.user_max_ended_bytes"
        )
    return f"no job {job_id}"


class Retention:
    def __init__(
        self,
        data_dir: Path,
        keep_s: float,
        user_max_ended_bytes: int = 0,
        keep_attempts: int = 0,
        keep_audit_s: float = 0.0,
    ) -> None:
        self.data_dir = data_dir
        self.keep_s = keep_s  # 0: keep every ended job for ever
        self.keep_attempts = keep_attempts  # 0: keep every attempt of a live job
        # Live jobs whose older attempts are due to be forgotten: id -> the first one kept.
        self.attempts_due: dict[str, int] = {}
        self.next_at = -math.inf
        self.keep_audit_s = keep_audit_s  # 0: keep every audit row for ever
        self.audit_next_at = -math.inf
        self.ended_bytes = EndedBytes(data_dir, user_max_ended_bytes)
        # Jobs forgotten since the start, for the metrics: by age, and past a user's bound.
        self.forgotten_by_age = 0
        self.forgotten_by_bytes = 0

    def recover(self, store: Store) -> None:
        """Measure what every ended job keeps (at start), when that is bounded."""
        if self.ended_bytes.most:
            with store.read() as tx:
                rows = tx.ended_doc_sizes()
            self.ended_bytes.recover(Ended(*row) for row in rows)

    def forget_ended(self, store: Store, batch: Batch, now: float, newest_id: str) -> None:
        """Remove the files of the jobs that ended more than `keep_s` ago (some of them, when
        many), and of each user's oldest ended jobs past `user_max_ended_bytes`, and add their
        rows' deletion to `batch`, with that of the audit rows older than `keep_audit_s`.
        `newest_id`: the newest job's, never forgotten."""
        # A batch that still holds some (its write failed, to be retried) is left as it is.
        if self.keep_audit_s > 0 and now >= self.audit_next_at and not batch.forget_audit:
            self._forget_old_audit(store, batch, now)
        if batch.forget:
            return
        if self.keep_s > 0 and now >= self.next_at:
            self._forget_old(store, batch, now)
        if self.ended_bytes.most:
            for user, ids in self.ended_bytes.over(newest_id, FORGET_AT_MOST).items():
                self._remove_files(ids)
                batch.forget.extend(ids)
                self.forgotten_by_bytes += len(ids)
                log.info(
                    "forgot %d of %s's ended jobs, the oldest: their ended jobs kept over "
                    "%.0f MiB (limits.user_max_ended_bytes)",
                    len(ids),
                    user,
                    self.ended_bytes.most / 2**20,
                )

    def attempt_placed(self, job_id: str, attempt: int) -> None:
        """Note that `job_id` placed its `attempt`-th attempt: past `keep_attempts`, the ones
        before the latest `keep_attempts` are forgotten in the next step."""
        if self.keep_attempts and attempt > self.keep_attempts:
            self.attempts_due[job_id] = attempt - self.keep_attempts + 1

    def forget_attempts(self, batch: Batch, now: float) -> None:
        """Remove the folders of the attempts due to be forgotten, and add the deletion of
        their task rows and events, and a note, to `batch`."""
        if batch.forget_attempts:  # a write that failed, to be retried as it is
            return
        for job_id, first_kept in self.attempts_due.items():
            self._remove_attempt_files(job_id, first_kept)
            batch.forget_attempts.append((job_id, first_kept))
            batch.event(
                now,
                job_id,
                ATTEMPTS_FORGOTTEN,
                f"attempts 1 to {first_kept - 1} were forgotten (their tasks, logs and events): "
                f"a live job keeps its latest {self.keep_attempts} (limits.keep_attempts)",
            )
        self.attempts_due.clear()

    def _remove_attempt_files(self, job_id: str, first_kept: int) -> None:
        """Remove `logs/JOB/N` and `tasks/JOB/N` for every N below `first_kept`."""
        for folder in job_dirs(self.data_dir, job_id):
            try:
                names = os.listdir(folder)
            except OSError:  # none yet, or gone
                continue
            for name in names:
                if is_decimal(name) and len(name) <= MAX_ATTEMPT_DIGITS and int(name) < first_kept:
                    # rmtree removes links, never what they point to.
                    shutil.rmtree(folder / name, ignore_errors=True)

    def _forget_old(self, store: Store, batch: Batch, now: float) -> None:
        with store.read() as tx:
            ids = tx.ended_before(now - self.keep_s, FORGET_AT_MOST)
        # A full batch means more are due: the next step takes them, not a minute later.
        full = len(ids) == FORGET_AT_MOST
        self.next_at = now if full else now + min(FORGET_EVERY_S, self.keep_s / 10)
        if not ids:
            return
        # Files first, rows after: a stop in between leaves rows that the next pass takes,
        # never files that no row names any more. (An ended job never runs again.)
        self._remove_files(ids)
        batch.forget.extend(ids)
        self.forgotten_by_age += len(ids)
        self.ended_bytes.forgotten(ids)
        log.info("forgot %d jobs that ended over %.0f s ago", len(ids), self.keep_s)

    def _forget_old_audit(self, store: Store, batch: Batch, now: float) -> None:
        with store.read() as tx:
            seqs = tx.audit_before(now - self.keep_audit_s, FORGET_AT_MOST)
        full = len(seqs) == FORGET_AT_MOST
        self.audit_next_at = now if full else now + min(FORGET_EVERY_S, self.keep_audit_s / 10)
        if seqs:
            batch.forget_audit.extend(seqs)
            log.info("deleted %d audit rows over %.0f s old", len(seqs), self.keep_audit_s)

    def _remove_files(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            for folder in job_dirs(self.data_dir, job_id):
                # rmtree removes links, never what they point to.
                shutil.rmtree(folder, ignore_errors=True)

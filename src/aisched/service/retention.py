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
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

from aisched.model.numerals import is_decimal
from aisched.service.ended_bytes import Ended, EndedBytes, job_dirs
from aisched.service.live import Batch
from aisched.store.db import Store

log = logging.getLogger("aisched.loop")

FORGET_EVERY_S = 60.0  # or a tenth of `keep_s`, when that is shorter
FORGET_AT_MOST = 500


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
    def __init__(self, data_dir: Path, keep_s: float, user_max_ended_bytes: int = 0) -> None:
        self.data_dir = data_dir
        self.keep_s = keep_s  # 0: keep every ended job for ever
        self.next_at = -math.inf
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
        rows' deletion to `batch`. `newest_id`: the newest job's, never forgotten."""
        # A batch that still holds some (its write failed, to be retried) is left as it is.
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

    def _remove_files(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            for folder in job_dirs(self.data_dir, job_id):
                # rmtree removes links, never what they point to.
                shutil.rmtree(folder, ignore_errors=True)

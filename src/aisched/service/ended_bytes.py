"""What each user's ended jobs keep, bounded per user (`limits.user_max_ended_bytes`): their
stored documents and their files in the data directory (`logs/JOB`, the local executor's
`tasks/JOB`). `keep_ended` bounds history by age only, and each task's log by its cap, so one
user's many jobs, each with capped logs, kept a month, could fill the disk; disk pressure then
refuses every user's submissions. Past the bound the user's oldest ended jobs are forgotten, as
`keep_ended` forgets them (`retention`), until what is left fits; never the user's newest ended
job, whose logs its owner most likely still wants, whatever its size, nor the newest job of all
(the next id counts from it).

A job's files are measured once, after it ended (its tasks have exited, so its logs no longer
grow), and the sizes are kept in memory: a pass costs what ended since the last one. After a
start every ended job's files are measured again, as the ledger is not stored: `MEASURE_AT_MOST`
a step, oldest end first, so a start (or a standby's takeover) does not wait for them. Until
all are, a user's total is what is known so far, never more than what is there, so nothing is
forgotten too soon.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aisched.model.numerals import is_decimal

FILE_KINDS = ("logs", "tasks")  # the data directory's folders named after a job
# Ended jobs measured in one step at most: about 55 µs each (docs/benchmarks.md), so 50 ms.
MEASURE_AT_MOST = 1000


@dataclass(frozen=True, slots=True)
class Ended:
    """A job that ended and is not forgotten yet, with its document's size in the store."""

    job_id: str
    user: str
    doc_bytes: int


def job_dirs(data_dir: Path, job_id: str) -> Iterator[Path]:
    """The data directory's folders of a job; none for an id that is not decimal, as every id
    is: anything else is no path to follow."""
    if is_decimal(job_id):
        for kind in FILE_KINDS:
            yield data_dir / kind / job_id


def disk_bytes(top: Path | str) -> int:
    """What the files under `top` take on disk (as `du` counts, links not followed); 0 when
    it is not there."""
    total = 0
    try:
        entries = os.scandir(top)
    except OSError:  # not there (or gone meanwhile)
        return 0
    with entries:
        for entry in entries:
            try:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    total += disk_bytes(entry.path)
            except OSError:
                continue
    return total


class EndedBytes:
    """The ledger: per user, their ended jobs not yet forgotten, in the order they ended, with
    what each keeps."""

    def __init__(self, data_dir: Path, most: int) -> None:
        self.data_dir = data_dir
        self.most = most  # 0: no bound, nothing is kept here
        self.to_measure: deque[Ended] = deque()  # oldest end first
        self.kept: dict[str, tuple[str, int]] = {}  # job id -> (user, bytes)
        self.order: dict[str, deque[str]] = {}  # user -> ids, oldest end first
        self.per_user: Counter[str] = Counter()
        self.over_users: set[str] = set()  # per_user over `most`: a pass looks at these only

    def ended(self, job_id: str, user: str, doc_bytes: int) -> None:
        """A job ended now: its files are measured at the next `over`."""
        if self.most:
            self.to_measure.append(Ended(job_id, user, doc_bytes))

    def recover(self, ended: Iterable[Ended]) -> None:
        """Every ended job in the store, oldest end first, in place of what was known (at
        start, or as this instance leads again: the ledger is not stored); measured by the
        next calls of `over`."""
        self.to_measure, self.kept, self.order, self.per_user = deque(), {}, {}, Counter()
        self.over_users = set()
        if self.most:
            self.to_measure.extend(ended)

    def forgotten(self, job_ids: Iterable[str]) -> None:
        """These jobs are forgotten (by age, or refused by the store): they keep nothing."""
        gone = set(job_ids)
        if self.to_measure:
            self.to_measure = deque(e for e in self.to_measure if e.job_id not in gone)
        for job_id in gone:
            found = self.kept.pop(job_id, None)
            if found is None:
                continue
            user, size = found
            self.per_user[user] -= size
            if self.per_user[user] <= self.most:
                self.over_users.discard(user)
            # Taken from `order` where it is at the front (age forgets the oldest first); one
            # in the middle stays until it comes up: removing it there would cost a walk.
            ids = self.order[user]
            while ids and ids[0] not in self.kept:
                ids.popleft()
            if not ids:  # nothing of theirs is kept
                del self.per_user[user], self.order[user]

    def over(self, newest_id: str, at_most: int) -> dict[str, list[str]]:
        """Measure up to `MEASURE_AT_MOST` ended jobs, then per user over the bound, the ids of
        their oldest ended jobs to forget so that what is left fits (never their newest ended
        job, nor `newest_id`); at most `at_most` in all, the rest at the next call."""
        for _ in range(min(len(self.to_measure), MEASURE_AT_MOST)):
            self._add(self.to_measure.popleft())
        out: dict[str, list[str]] = {}
        taken = 0
        for user in sorted(self.over_users):
            ids, spared = self.order[user], []
            while self.per_user[user] > self.most and len(ids) > 1 and taken < at_most:
                job_id = ids.popleft()
                if job_id == newest_id:
                    spared.append(job_id)
                    continue
                found = self.kept.pop(job_id, None)
                if found is not None:
                    self.per_user[user] -= found[1]
                    out.setdefault(user, []).append(job_id)
                    taken += 1
            ids.extendleft(reversed(spared))
            if self.per_user[user] <= self.most:
                self.over_users.discard(user)
        return out

    def _add(self, e: Ended) -> None:
        size = e.doc_bytes + sum(disk_bytes(d) for d in job_dirs(self.data_dir, e.job_id))
        self.kept[e.job_id] = (e.user, size)
        self.order.setdefault(e.user, deque()).append(e.job_id)
        self.per_user[e.user] += size
        if self.per_user[e.user] > self.most:
            self.over_users.add(e.user)

"""What each user's running jobs' logs take, bounded per user
(`limits.user_max_running_log_bytes`). Each task's log is capped (`log_max_size` x
`log_max_files`), but not how many tasks one user runs at once: a user's many small tasks, each
writing its capped log, could fill the data directory's disk for everyone while they run (what
ended jobs keep is bounded apart, `ended_bytes`). Past the bound the user's running jobs with
the most logs are stopped, largest first, until the rest fit, as a time limit stops a job: failed,
not retried (a retry would write as much again), its logs kept for its owner to read. Other
users' jobs are never touched.

Every `CHECK_EVERY_S` the logs of the running jobs measured longest ago are measured again,
for `MEASURE_FOR_S` at most, in the loop thread; a user's total is the sum of their running jobs'
last sizes, so between checks a user can write past the bound by what their tasks write in that
time. Jobs being stopped already do not count: their logs are no longer the running ones'.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from aisched.model.numerals import is_decimal
from aisched.service.ended_bytes import disk_bytes

CHECK_EVERY_S = 5.0
# A check measures jobs for this long at most (at least one job), in the loop thread: a job's
# cost grows with its tasks' log files (about 55 µs for one with a few, docs/benchmarks.md,
# "What each user's ended jobs keep"), so a count of jobs would not bound it.
MEASURE_FOR_S = 0.05


class RunningLogs:
    def __init__(self, logs_dir: Path, most: int) -> None:
        self.logs_dir = logs_dir
        self.most = most  # 0: no bound, nothing is measured
        self.next_check_at = 0.0
        # Running job id -> what its logs took when last measured; measured longest ago first.
        self.sizes: dict[str, int] = {}
        self.stopped = 0  # jobs stopped for their user's logs since the start

    def due(self, now: float) -> bool:
        """Whether a check is due: with a bound, once every `CHECK_EVERY_S`."""
        return self.most > 0 and now >= self.next_check_at

    def over(self, running: Mapping[str, str], now: float) -> list[tuple[str, str]]:
        """When a check is due: the jobs of `running` (job id -> user: the running jobs not
        being stopped) to stop, each with why, largest logs first (then newest) per user past
        the bound, until what is left fits."""
        if not self.due(now):
            return []
        self.next_check_at = now + CHECK_EVERY_S
        for gone in self.sizes.keys() - running.keys():
            del self.sizes[gone]
        # Ids are decimal (anything else is no path to follow); new ones are measured first.
        fresh = [j for j in running if is_decimal(j) and j not in self.sizes]
        if fresh:
            self.sizes = {**dict.fromkeys(fresh, 0), **self.sizes}
        until = time.perf_counter() + MEASURE_FOR_S
        for job_id in list(self.sizes):
            del self.sizes[job_id]  # and in again, last: measured most recently
            self.sizes[job_id] = disk_bytes(self.logs_dir / job_id)
            if time.perf_counter() >= until:
                break
        per_user: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for job_id, size in self.sizes.items():
            per_user[running[job_id]].append((size, job_id))
        stop: list[tuple[str, str]] = []
        for user, theirs in per_user.items():
            total = sum(size for size, _ in theirs)
            for size, job_id in sorted(theirs, key=lambda sj: (-sj[0], -int(sj[1]))):
                if total <= self.most:
                    break
                stop.append((job_id, _why(user, total, self.most, size)))
                total -= size
        self.stopped += len(stop)
        return stop


def _why(user: str, total: int, most: int, size: int) -> str:
    return (
        f"stopped: {user}'s running jobs' logs took {_mib(total)}, over "
        f"limits.user_max_running_log_bytes ({_mib(most)}); this job's took {_mib(size)}, the "
        "most of theirs; not retried"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"

"""Readiness, as opposed to liveness: can the service take new work right now, and if not, why.

Liveness (`/v1/healthz`) answers whether the loop thread is alive; a service that is alive but
cannot write (a full disk, a failing store) or whose steps keep failing is *not ready*: it
keeps answering reads and serving what runs, but refuses new submissions with a one-line
reason, 507 (Insufficient Storage) when it is the disk, 503 otherwise. That is how kubelet's
disk-pressure condition and Slurm's drained node with a reason behave.

What is watched:

1. The free space of the data directory (the database lives there) and of the log directory
   (tasks' output), through `statvfs`, at most once a `refresh_s`: below `min_free_bytes`,
   fewer free inodes than `min_free_inodes` (many small files: every new file, a launch's
   request, log and checkpoint directory among them, fails with ENOSPC however many bytes are
   free), or read-only (remounted so after a disk error), is disk pressure. Directories on one
   filesystem are reported once.
2. The loop's failed steps (`StepErrors`): a write that failed with ENOSPC is disk pressure
   too, whatever statvfs says (a quota, a full inode table); another store error or a bug
   makes the service not ready until a step succeeds again.
3. The executor's own availability (`executors.base.Availability`): while a Ray cluster's GCS
   cannot be reached, the service is not ready and says so; the loop holds new launches.
4. On a shared database, the lease: a renewal (or a standby's poll) that failed at its last
   try names the database that does not answer, even when nothing else touches the store.

Nothing here acts: recovery is the loop's own (it retries its unwritten batch with back-off),
and readiness comes back by itself once space returns and a step succeeds.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aisched.model.resources import describe_bytes
from aisched.service.step_errors import StepErrors


@dataclass(frozen=True, slots=True)
class DiskState:
    name: str  # what the directory is for: "data", "logs"
    path: str
    free_bytes: int | None  # None: statvfs failed (the directory is gone or unreadable)
    min_free_bytes: int
    error: str = ""
    # None: the filesystem has no fixed number of inodes (btrfs, a tmpfs mounted with nr_inodes=0).
    free_inodes: int | None = None
    min_free_inodes: int = 0

    @property
    def short_of_inodes(self) -> bool:
        return self.free_inodes is not None and self.free_inodes < self.min_free_inodes

    @property
    def pressure(self) -> bool:
        low = self.free_bytes is None or self.free_bytes < self.min_free_bytes
        return low or self.short_of_inodes


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    problems: tuple[str, ...]  # one line each: what is wrong and why
    disks: tuple[DiskState, ...]
    disk_pressure: bool
    loop_errors_total: int
    loop_failing_since: float | None
    last_error: str

    def to_dict(self) -> dict[str, object]:
        return {
            "ready": self.ready,
            "problems": list(self.problems),
            "disk_pressure": self.disk_pressure,
            "disks": [
                {
                    "name": d.name,
                    "path": d.path,
                    "free_bytes": d.free_bytes,
                    "min_free_bytes": d.min_free_bytes,
                    "free_inodes": d.free_inodes,
                    "min_free_inodes": d.min_free_inodes,
                    "pressure": d.pressure,
                }
                for d in self.disks
            ],
            "loop_errors_total": self.loop_errors_total,
            "loop_failing_since": self.loop_failing_since,
            "last_error": self.last_error,
        }


# What `statvfs` says of a directory: free bytes (None: it failed), free inodes (None: the
# filesystem does not count them) and, when it failed or the filesystem is read-only, why.
Space = tuple[int | None, int | None, str]


def _free(path: str) -> Space:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return None, None, e.strerror or str(e)
    if st.f_flag & os.ST_RDONLY or _refuses_writes(path):
        return None, None, "read-only file system"
    return st.f_bavail * st.f_frsize, (st.f_favail if st.f_files else None), ""


def _refuses_writes(path: str) -> bool:
    """Whether the filesystem of `path` refuses writes: ext4 turned read-only by a disk error
    (errors=remount-ro) says so only when written to, not in statvfs's flags. The probe is a
    metadata write: the directory's times set to now."""
    try:
        os.utime(path)
    except OSError as e:
        return e.errno == errno.EROFS
    return False


def _pressure(d: DiskState) -> str:
    if d.free_bytes is None:
        return f"disk pressure: the {d.name} directory {d.path}: {d.error}"
    if d.free_bytes >= d.min_free_bytes:  # then it is the inodes
        return (
            f"disk pressure: {d.free_inodes} inodes free for the {d.name} directory {d.path}, "
            f"below the {d.min_free_inodes} it keeps free (no new file can be made)"
        )
    free, keep = describe_bytes(d.free_bytes), describe_bytes(d.min_free_bytes)
    if free == keep:  # a limit of part of a MiB: both round down to one figure
        free, keep = f"{d.free_bytes:,} bytes", f"{d.min_free_bytes:,} bytes"
    return (
        f"disk pressure: {free} free for the {d.name} directory {d.path}, below the {keep} it "
        "keeps free"
    )


class Health:
    def __init__(
        self,
        dirs: Sequence[tuple[str, Path]],
        min_free_bytes: int,
        errors: StepErrors,
        alive: Callable[[], bool],
        elsewhere: Sequence[Callable[[], str | None]] = (),
        *,
        min_free_inodes: int = 0,
        refresh_s: float = 1.0,
        statvfs: Callable[[str], Space] = _free,
    ) -> None:
        self.dirs = tuple((name, str(path)) for name, path in dirs)
        self.min_free_bytes = min_free_bytes
        self.min_free_inodes = min_free_inodes
        self.errors = errors
        self.alive = alive
        self.elsewhere = elsewhere  # the executor's, the lease's: one line each, or None
        self.refresh_s = refresh_s
        self.statvfs = statvfs
        self._lock = threading.Lock()
        self._disks: tuple[DiskState, ...] = ()
        self._checked_at = -1e18

    def disks(self) -> tuple[DiskState, ...]:
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at >= self.refresh_s:
                self._checked_at = now
                self._disks = self._measure()
            return self._disks

    def _measure(self) -> tuple[DiskState, ...]:
        out: list[DiskState] = []
        seen: set[int] = set()
        for name, path in self.dirs:
            try:
                dev = os.stat(path).st_dev
            except OSError:
                dev = -1
            if dev in seen:
                continue  # one filesystem, one figure
            if dev != -1:
                seen.add(dev)
            free, inodes, error = self.statvfs(path)
            out.append(
                DiskState(
                    name, path, free, self.min_free_bytes, error, inodes, self.min_free_inodes
                )
            )
        return tuple(out)

    def check(self) -> Readiness:
        disks = self.disks()
        e = self.errors
        problems: list[str] = []
        if not self.alive():
            problems.append("the scheduler loop is not running")
        problems += [_pressure(d) for d in disks if d.pressure]
        # Read once: the loop thread replaces these fields as it goes.
        kind, consecutive, last = e.kind, e.consecutive, e.last_error
        if consecutive and kind == "disk-full":
            problems.append(f"disk pressure: the store cannot write: {last}")
        elif consecutive and kind in ("io-error", "store", "data"):
            problems.append(f"the store is failing ({consecutive} steps in a row): {last}")
        elif consecutive:
            problems.append(f"the scheduler's step is failing ({consecutive} in a row): {last}")
        # Last: a failing store or disk says more than the lease failing for the same cause.
        problems += [why for source in self.elsewhere if (why := source()) is not None]
        pressure = any(d.pressure for d in disks) or (consecutive > 0 and kind == "disk-full")
        return Readiness(
            ready=not problems,
            problems=tuple(problems),
            disks=disks,
            disk_pressure=pressure,
            loop_errors_total=e.total,
            loop_failing_since=e.since,
            last_error=last,
        )

    def launch_hold(self) -> str | None:
        """Why new launches must wait now, else None: a launch writes its request, the task's
        log and its checkpoint directory to these disks, and one made into a full disk fails
        ("No space left on device") and counts against the job's retries. (A store on the
        full disk cannot store a launch's intent anyway; a PostgreSQL store elsewhere can.)"""
        for d in self.disks():
            if d.pressure:
                return _pressure(d)
        return None

    def refusal(self) -> tuple[int, str] | None:
        """(status, one-line reason) when a submission must be refused now, else None."""
        r = self.check()
        if r.ready:
            return None
        status = 507 if r.disk_pressure else 503
        return status, f"the service is not accepting new jobs: {r.problems[0]}"


class HealthCollector(Collector):
    """`aisched_ready`, `aisched_disk_pressure`, `aisched_disk_free_bytes` and
    `aisched_loop_errors_total`, read when scraped."""

    def __init__(self, health: Health) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        r = self.health.check()
        yield GaugeMetricFamily(
            "aisched_ready", "1 when the service accepts new jobs (see /v1/readyz).", r.ready
        )
        yield GaugeMetricFamily(
            "aisched_disk_pressure",
            "1 while free space or inodes are below their threshold or a write failed for lack "
            "of space.",
            r.disk_pressure,
        )
        free = GaugeMetricFamily(
            "aisched_disk_free_bytes",
            "Free space of each watched directory's filesystem.",
            labels=["dir"],
        )
        for d in r.disks:
            if d.free_bytes is not None:
                free.add_metric([d.name], d.free_bytes)
        yield free
        yield CounterMetricFamily(
            "aisched_loop_errors",
            "Steps of the scheduler loop that raised (each is retried after a back-off).",
            value=r.loop_errors_total,
        )

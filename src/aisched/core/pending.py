"""The pending jobs as a caller keeps them from one cycle to the next, with a log of changes.

Between two cycles a long queue changes by a few jobs. A caller that keeps its pending jobs in
a `PendingQueue` and hands it to `run_cycle` lets the cycle's kept order (`core.admitted`)
apply just those changes, where from a plain sequence it must compare the whole queue with the
last one. Like `FreeState`'s change log, the log is a shortcut, never an answer: a reader that
cannot follow it (another generation, or entries it never saw) compares whole queues instead.

Invariants:
- A job id is pending at most once; `jobs()` is in insertion order (a job set again in place
  keeps its position, as a dict's value does).
- The log holds every addition and removal since its generation began, in order, with the job
  object itself (so no `id()` in it can be reused while it is there). It is bounded: past
  LOG_LIMIT entries it starts again, empty, with the next generation.
- `shapes()` holds exactly the shapes of the pending jobs, each with how many are pending.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, ValuesView

from aisched.core.snapshot import PendingJob
from aisched.model.job import Job

# Entries of the log before it starts a new generation: many cycles' worth of arrivals and
# binds, few enough that the jobs it holds on to stay a small share of memory.
LOG_LIMIT = 8192


class PendingQueue:
    """Pending jobs in insertion order, looked up by job id, with a log of additions and
    removals. Iterating gives the jobs, as a sequence of them would; `in` takes a job id."""

    __slots__ = ("_jobs", "log", "generation", "_tuple", "_shapes")

    def __init__(self) -> None:
        self._jobs: dict[str, PendingJob] = {}
        self.log: list[tuple[PendingJob, bool]] = []  # (job, True: added / False: removed)
        self.generation = 0
        self._tuple: tuple[PendingJob, ...] | None = None
        # Per shape pending (`Job.shape_id`): how many jobs, and one of them.
        self._shapes: dict[int, tuple[int, Job]] = {}

    def _record(self, pj: PendingJob, added: bool) -> None:
        if len(self.log) >= LOG_LIMIT:
            self.log = []
            self.generation += 1
        self.log.append((pj, added))
        self._tuple = None
        shapes, shape = self._shapes, pj.job.shape_id
        count, job = shapes.get(shape, (0, pj.job))
        count += 1 if added else -1
        if count:
            shapes[shape] = (count, job)
        else:
            del shapes[shape]

    def __setitem__(self, job_id: str, pj: PendingJob) -> None:
        if pj.id != job_id:
            raise ValueError(f"pending job {pj.id} filed under {job_id}")
        old = self._jobs.get(job_id)
        if old is not None:
            self._record(old, False)
        self._jobs[job_id] = pj
        self._record(pj, True)

    def pop(self, job_id: str, default: PendingJob | None = None) -> PendingJob | None:
        pj = self._jobs.pop(job_id, None)
        if pj is None:
            return default
        self._record(pj, False)
        return pj

    def get(self, job_id: str) -> PendingJob | None:
        return self._jobs.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __iter__(self) -> Iterator[PendingJob]:
        """Its jobs in order, as the sequence `run_cycle` takes otherwise would give them."""
        return iter(self._jobs.values())

    def keys(self) -> KeysView[str]:
        return self._jobs.keys()

    def values(self) -> ValuesView[PendingJob]:
        return self._jobs.values()

    def items(self) -> ItemsView[str, PendingJob]:
        return self._jobs.items()

    def newest_first(self) -> Iterator[PendingJob]:
        """The pending jobs, the last added first."""
        return reversed(self._jobs.values())

    def shapes(self) -> ValuesView[tuple[int, Job]]:
        """One (count, job) per shape pending: how many jobs of it, and one of them."""
        return self._shapes.values()

    def of_shape(self, shape_id: int) -> Job | None:
        """A pending job of that shape, if any."""
        hit = self._shapes.get(shape_id)
        return hit[1] if hit is not None else None

    def jobs(self) -> tuple[PendingJob, ...]:
        """The pending jobs in order (one tuple, kept until the next change)."""
        if self._tuple is None:
            self._tuple = tuple(self._jobs.values())
        return self._tuple


__all__ = ["LOG_LIMIT", "PendingQueue"]

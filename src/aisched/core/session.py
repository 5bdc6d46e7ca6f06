"""Mutable state of one scheduling cycle: a private copy of the free capacity, the running set
as preemption changes it, queue usage, reservations, decisions and statuses.

A session is created by `run_cycle` and dropped at its end; nothing outside the cycle sees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aisched.core.decisions import Bind, Decision, Preempt, Reserve, TaskBinding
from aisched.core.policy import Policy
from aisched.core.snapshot import (
    BoolArray,
    ClusterArrays,
    FloatArray,
    FreeState,
    PendingJob,
    RunningJob,
    Snapshot,
)
from aisched.core.status import JobStatus, StatusCode
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.model.resources import Resources

USAGE_DIMS = 3  # milli_cpu, mem_mib, gpu_milli


def usage_vector(r: Resources) -> FloatArray:
    return np.array([r.milli_cpu, r.mem_mib, r.gpu_equivalent_milli], dtype=np.float64)


def bindings_vector(tasks: Sequence[TaskBinding]) -> FloatArray:
    v = np.zeros(USAGE_DIMS, dtype=np.float64)
    for t in tasks:
        v[0] += t.milli_cpu
        v[1] += t.mem_mib
        v[2] += t.gpu_milli * len(t.gpus)
    return v


@dataclass(slots=True)
class Reservation:
    job_id: str
    nodes: BoolArray
    start_s: float | None


class Session:
    """Per-cycle state. Actions read and change it; plugins only read it."""

    def __init__(
        self, snapshot: Snapshot, policy: Policy, now: float, pending: tuple[PendingJob, ...]
    ) -> None:
        self.snapshot = snapshot
        self.arrays: ClusterArrays = snapshot.arrays
        self.policy = policy
        self.now = now
        self.pending = pending
        self.free: FreeState = snapshot.free.copy()
        self.totals: FloatArray = np.array(snapshot.arrays.totals(), dtype=np.float64)
        self.running: dict[str, RunningJob] = {r.id: r for r in snapshot.running}
        self.bound_now: set[str] = set()
        self.decisions: list[Decision] = []
        self.statuses: dict[str, JobStatus] = {}
        self.queue_usage: dict[str, FloatArray] = {}
        self.user_usage: dict[tuple[str, str], FloatArray] = {}
        self.reservations: list[Reservation] = []
        # Jobs that allocate could not place, in scheduling order, for preempt/backfill.
        self.blocked: list[PendingJob] = []
        # Jobs admitted by enqueue, in scheduling order (before fair-share interleaving).
        self.candidates: list[PendingJob] = []
        self.fail_cache: dict[object, str] = {}
        self.placement_attempts = 0
        for r in snapshot.running:
            self.add_usage(r.job, bindings_vector(r.tasks))

    @property
    def queues(self) -> QueueTree:
        return self.snapshot.queues

    def released(self) -> None:
        """Capacity was given back: cached placement failures may now succeed."""
        self.fail_cache.clear()

    def add_usage(self, job: Job, vec: FloatArray, sign: float = 1.0) -> None:
        for q in self.queue_path(job.queue):
            cur = self.queue_usage.get(q)
            self.queue_usage[q] = (cur if cur is not None else np.zeros(USAGE_DIMS)) + sign * vec
        key = (job.queue, job.user)
        cur = self.user_usage.get(key)
        self.user_usage[key] = (cur if cur is not None else np.zeros(USAGE_DIMS)) + sign * vec

    def queue_path(self, queue: str) -> tuple[str, ...]:
        if not self.queues.has(queue):
            return (queue,)
        return self.queues.path(queue)

    def usage_of(self, queue: str) -> FloatArray:
        u = self.queue_usage.get(queue)
        return u if u is not None else np.zeros(USAGE_DIMS)

    def set_status(
        self, job_id: str, code: StatusCode, reason: str, eta: float | None = None
    ) -> None:
        self.statuses[job_id] = JobStatus(code, reason, eta)

    def bind(
        self, pj: PendingJob, tasks: tuple[TaskBinding, ...], after: tuple[str, ...] = ()
    ) -> None:
        """Record a placement that the statement has already applied to `free`."""
        job = pj.job
        self.decisions.append(Bind(job.id, tasks, after))
        bound = pj.runtime_bound_s
        self.running[job.id] = RunningJob(
            job=job,
            tasks=tasks,
            started_s=self.now,
            attained_gpu_s=pj.attained_gpu_s,
            expected_end_s=None if bound is None else self.now + bound,
            last_checkpoint_s=self.now,
        )
        self.bound_now.add(job.id)
        self.add_usage(job, bindings_vector(tasks))
        reason = "placed" if not after else f"placed after preempting {', '.join(after)}"
        code = StatusCode.PLACED if not after else StatusCode.PREEMPTING
        self.set_status(job.id, code, reason)

    def preempt(self, victim: RunningJob, for_job: str, reason: str) -> None:
        self.decisions.append(Preempt(victim.id, for_job, reason))

    def reserve(self, res: Reservation) -> None:
        self.reservations.append(res)
        names = tuple(self.snapshot.arrays.names[i] for i in np.flatnonzero(res.nodes).tolist())
        self.decisions.append(Reserve(res.job_id, names, res.start_s))

    def dominant_share(self, usage: FloatArray) -> float:
        totals = self.totals
        shares = np.where(totals > 0, usage / np.maximum(totals, 1.0), 0.0)
        return float(shares.max())

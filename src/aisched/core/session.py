"""Mutable state of one scheduling cycle: a private copy of the free capacity, the running set
as preemption changes it, queue usage, reservations, decisions and statuses.

A session is created by `run_cycle` and dropped at its end; nothing outside the cycle sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from aisched.core.caps import node_caps
from aisched.core.decisions import Bind, Decision, Preempt, Reserve, Shrink, TaskBinding
from aisched.core.pending import PendingQueue
from aisched.core.snapshot import (
    IN_PLACE,
    ZERO,
    BoolArray,
    ClusterArrays,
    FreeState,
    PendingJob,
    RunningChanges,
    RunningJob,
    Snapshot,
    Usage,
    add_usage,
)
from aisched.core.status import JobStatus, StatusCode
from aisched.core.statuses import Statuses
from aisched.core.taskmix import TaskMix, mix_of
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.model.resources import Resources

if TYPE_CHECKING:  # the policy builds actions, which import from here at run time
    from aisched.core.admitted import AdmittedOrder
    from aisched.core.policy import Policy


class ShapeBy(Enum):
    """What a cycle's placement caches are keyed by (`placement.placement_shape`)."""

    SHAPE = "shape"  # the job's shape alone
    APP = "app"  # its shape and app: a node's cap counts the app's instances (`core.caps`)
    JOB = "job"  # the job itself: a score draws per job


_id = attrgetter("id")
LoggedView = tuple[RunningJob, int]  # an entry of a caller's running log (`RunningChanges`)


def queue_path_of(queues: QueueTree, queue: str) -> tuple[str, ...]:
    """The queues a usage in `queue` counts against: its path, or itself when unknown."""
    return queues.path(queue) if queues.has(queue) else (queue,)


@dataclass(frozen=True, slots=True)
class _RunningBase:
    """What a session derives from the running set alone: the running jobs by id, the usage
    per (queue, user) and per queue along each path. Kept in the cluster's memo while the
    caller hands the same running tuple, usage mapping and queue tree (held, so no id is
    reused): a caller hands a new running tuple whenever the running set changes, as the
    core's other cross-cycle caches already require (`Holdings.running`). Sessions copy the
    dicts they change."""

    running: tuple[RunningJob, ...]
    usage: object
    queues: QueueTree
    by_id: dict[str, RunningJob]
    by_user: Mapping[tuple[str, str], Usage]  # the caller's, read only while it is kept
    queue_usage: dict[str, Usage]
    changes: RunningChanges | None  # the caller's log at `running`, if it keeps one


def _logged_since(last: _RunningBase | None, snapshot: Snapshot) -> list[LoggedView] | None:
    """What the caller's log says came and went since `last` was built, when `last` followed
    the same log and it has only gone on since; else None."""
    was, now = last.changes if last is not None else None, snapshot.changes
    if was is None or now is None or now.log is not was.log or now.upto < was.upto:
        return None
    return now.log[was.upto : now.upto]


def _by_id(
    last: _RunningBase | None, snapshot: Snapshot, changed: list[LoggedView] | None
) -> dict[str, RunningJob]:
    """The running jobs by id, in the running tuple's order: the last base's with what the
    caller's log says came and went since (`changed`), as the caller's ledger did it (a new
    attempt comes last, a view replaced in place keeps its place); else built from the tuple."""
    if last is not None and changed is not None:
        by_id = last.by_id.copy()  # a session may still read the last one
        for k, (view, came) in enumerate(changed):
            if came:
                by_id[view.id] = view
            elif k + 1 == len(changed) or changed[k + 1][1] != IN_PLACE:
                del by_id[view.id]  # (not when its replacement follows: that takes its place)
        return by_id
    running = snapshot.running
    return dict(zip(map(_id, running), running, strict=True))


def _queue_usage(
    last: _RunningBase | None, snapshot: Snapshot, changed: list[LoggedView] | None
) -> dict[str, Usage]:
    """The usage per queue along each path: the last base's moved by the views the log says
    came and went (`changed`), when the queue tree is the same; else summed from the usage per
    (queue, user). Usage amounts are integers, so the sums are exact in any order; a queue
    with nothing running reads as zero either way (a missing entry is zero)."""
    queues = snapshot.queues
    qu: dict[str, Usage]
    if last is not None and changed is not None and last.queues is queues:
        qu = last.queue_usage.copy()  # a session may still read the last one
        for view, came in changed:
            sign = 1.0 if came else -1.0
            for q in queue_path_of(queues, view.job.queue):
                qu[q] = add_usage(qu.get(q, ZERO), view.usage, sign)
        return qu
    return usage_along_paths(queues, snapshot.user_usage())


def usage_along_paths(
    queues: QueueTree, by_user: Mapping[tuple[str, str], Usage]
) -> dict[str, Usage]:
    """Per queue, what runs in it and under it, from the usage per (queue, user): summed per
    queue first, then once along each queue's path. Usage amounts are integers, so the sums
    are exact in any order; a queue with nothing running has no entry (zero)."""
    leaves: dict[str, Usage] = {}
    for (queue, _user), vec in by_user.items():
        if vec != ZERO:
            leaves[queue] = add_usage(leaves.get(queue, ZERO), vec)
    out: dict[str, Usage] = {}
    for queue, vec in leaves.items():
        for q in queue_path_of(queues, queue):
            out[q] = add_usage(out.get(q, ZERO), vec)
    return out


def limited_user_usage(
    queues: QueueTree, by_user: Mapping[tuple[str, str], Usage]
) -> dict[tuple[str, str], Usage]:
    """The usage per (queue with a user limit, user), summed from the usage per (leaf queue,
    user) along each leaf's path: a user limit counts the queues under it too."""
    limited = queues.user_limited
    out: dict[tuple[str, str], Usage] = {}
    for (leaf, user), vec in by_user.items():
        if vec == ZERO or not queues.has(leaf):
            continue
        for q in queues.path(leaf):
            if q in limited:
                out[q, user] = add_usage(out.get((q, user), ZERO), vec)
    return out


def _running_base(snapshot: Snapshot) -> _RunningBase:
    memo = snapshot.arrays.memo
    hit = memo.get("running-base")
    last = hit if isinstance(hit, _RunningBase) else None
    if (
        last is not None
        and last.running is snapshot.running
        and last.usage is snapshot.usage
        and last.queues is snapshot.queues
    ):
        return last
    running = snapshot.running
    by_user = snapshot.user_usage()
    changed = _logged_since(last, snapshot)
    base = _RunningBase(
        running,
        snapshot.usage,
        snapshot.queues,
        _by_id(last, snapshot, changed),
        by_user,
        _queue_usage(last, snapshot, changed),
        snapshot.changes,
    )
    memo["running-base"] = base
    return base


def cluster_totals(arrays: ClusterArrays) -> Usage:
    """The cluster's capacity as a usage vector (memoised: the arrays never change)."""
    hit = arrays.memo.get("totals")
    if hit is None:
        cpu, mem, gpu = arrays.totals()
        hit = arrays.memo["totals"] = (float(cpu), float(mem), float(gpu))
    return hit  # type: ignore[return-value]


def usage_vector(r: Resources) -> Usage:
    return (float(r.milli_cpu), float(r.mem_mib), float(r.gpu_equivalent_milli))


@dataclass(slots=True)
class Reservation:
    """What a blocked job holds: its placement `tasks` on `nodes` from `start_s`, and the
    `headroom`, what will be free at that start once those tasks are taken. Jobs bound beside
    it that still run at its start are taken from the headroom too, so it stays exact."""

    job_id: str
    nodes: BoolArray
    start_s: float | None
    tasks: tuple[TaskBinding, ...] = ()
    headroom: FreeState | None = None
    outside: BoolArray | None = None  # ~nodes, made once when first asked (read-only)


@dataclass(slots=True)
class Guard:
    """The free state a job sees beside some reservations (the least of now's free state and
    their headrooms), with its own failure cache. A bind makes the free state `stale` (it is
    rebuilt when next asked for) but keeps the cache: capacity only shrinks then, so a failure
    stays one. A release drops the guard."""

    free: FreeState
    fail_cache: dict[object, str]
    stale: bool = False


class Session:
    """Per-cycle state. Actions read and change it; plugins only read it."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: Policy,
        now: float,
        pending: tuple[PendingJob, ...],
        pending_queue: PendingQueue | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.arrays: ClusterArrays = snapshot.arrays
        self.policy = policy
        self.now = now
        self.pending = pending
        # The caller's kept queue `pending` was taken from, if any: its log says what changed.
        self.pending_queue = pending_queue
        self.free: FreeState = snapshot.free.copy()
        self.totals: Usage = cluster_totals(snapshot.arrays)
        base = _running_base(snapshot)
        self.running: dict[str, RunningJob] = base.by_id.copy()
        self.bound_now: set[str] = set()
        self._paths: dict[str, tuple[str, ...]] = {}  # queue_path's answers
        self.decisions: list[Decision] = []
        self.statuses = Statuses(pending)
        self.queue_usage: dict[str, Usage] = {}
        self.user_usage: dict[tuple[str, str], Usage] = {}
        # Per (queue with a user limit, user): that user's usage there and under it.
        self.limited_user_usage: dict[tuple[str, str], Usage] = {}
        self.reservations: list[Reservation] = []
        # Free states beside reservations, keyed by the reservations' job ids (reservation.py).
        self.guards: dict[tuple[str, ...], Guard] = {}
        # Jobs that allocate could not place, in scheduling order, for preempt/backfill
        # (`blocked`; the walk that found them may leave the rest of the list to be built
        # when first read: most cycles of a preempting policy never read it).
        self._blocked: list[PendingJob] = []
        self._blocked_rest: Callable[[list[PendingJob]], None] | None = None
        # Jobs admitted by enqueue, in scheduling order (before fair-share interleaving).
        self.candidates: list[PendingJob] = []
        # Their placement shapes, position for position, when enqueue kept them (None when it
        # reordered the candidates, e.g. promoting starving jobs).
        self.candidate_shapes: list[Hashable] | None = None
        # The order enqueue kept across cycles, when the candidates are exactly its jobs in its
        # order (none promoted or cut by a queue depth): allocate then walks its indexes.
        self.kept_order: AdmittedOrder | None = None
        # True when `blocked` is the candidates less those placed, in candidate order; then
        # `blocked_shapes` are their shapes, position for position.
        self.blocked_in_order = False
        self.blocked_shapes: list[Hashable] | None = None
        # How many candidates at the head were promoted for starving: allocate takes them first.
        self.promoted = 0
        self.fail_cache: dict[object, str] = {}
        self.placement_attempts = 0
        self._status_cache: dict[tuple[StatusCode, str], JobStatus] = {}
        # Per-cycle memo for plugins (e.g. the task mix as arrays); dropped with the session.
        self.memo: dict[object, object] = {}
        # True while a what-if imagines the empty cluster (`placement.never_fits`): per-node
        # caps on an app's instances then count no running task (`core.caps`).
        self.imagine_empty = False
        # The task mix such a what-if scores by (the job it places, alone), so that whether a
        # job could ever fit does not hang on what else waits (`placement.never_fits`).
        self.imagined_mix: TaskMix | None = None
        # What a placement's outcome depends on besides the free state (`placement_shape`):
        # fixed for the cycle, so decided once here rather than on every one of the
        # thousands of calls a long queue makes.
        self.shape_by: ShapeBy = (
            ShapeBy.JOB
            if policy.per_job_placement
            else ShapeBy.APP
            if node_caps(self.arrays) is not None
            else ShapeBy.SHAPE
        )
        # Only drf reads usage per user (`queues.fair_key`): copied in C, not summed again.
        if policy.fair_users:
            self.user_usage = dict(base.by_user)
        self.queue_usage = base.queue_usage.copy()
        if self.queues.user_limited:
            self.limited_user_usage = limited_user_usage(self.queues, base.by_user)

    @property
    def task_mix(self) -> TaskMix:
        """The mix of a what-if's own job (`imagined_mix`), else the snapshot's task mix,
        else the mix of the running and pending jobs."""
        if self.imagined_mix is not None:
            return self.imagined_mix
        given = self.snapshot.task_mix
        if given is not None:
            return given
        hit = self.memo.get("task-mix")
        if hit is None:
            jobs = [r.job for r in self.snapshot.running] + [pj.job for pj in self.pending]
            hit = self.memo["task-mix"] = mix_of(jobs)
        return hit  # type: ignore[return-value]

    @property
    def queues(self) -> QueueTree:
        return self.snapshot.queues

    @contextmanager
    def scratch(self, free: FreeState) -> Iterator[None]:
        """Work on `free` instead of the session's free state, with an empty failure cache
        (cached failures belong to the real state); both are put back on exit."""
        saved = self.free, self.fail_cache
        self.free, self.fail_cache = free, {}
        try:
            yield
        finally:
            self.free, self.fail_cache = saved

    def released(self) -> None:
        """Capacity was given back: cached placement failures may now succeed."""
        self.fail_cache.clear()
        self.guards.clear()

    def add_usage(self, job: Job, vec: Usage, sign: float = 1.0) -> None:
        self._add(job.queue, job.account, vec, sign)

    def _add(self, queue: str, user: str, vec: Usage, sign: float) -> None:
        qu = self.queue_usage
        for q in self.queue_path(queue):
            qu[q] = add_usage(qu.get(q, ZERO), vec, sign)
        key = (queue, user)
        self.user_usage[key] = add_usage(self.user_usage.get(key, ZERO), vec, sign)
        limited = self.queues.user_limited
        if limited:
            lu = self.limited_user_usage
            for q in self.queue_path(queue):
                if q in limited:
                    lu[q, user] = add_usage(lu.get((q, user), ZERO), vec, sign)

    @property
    def blocked(self) -> list[PendingJob]:
        """The jobs allocate could not place, in scheduling order (built in full now if the
        walk left the rest for later)."""
        rest = self._blocked_rest
        if rest is not None:
            self._blocked_rest = None
            rest(self._blocked)
        return self._blocked

    def block_later(self, rest: Callable[[list[PendingJob]], None]) -> None:
        """`rest(blocked)` adds the rest of the blocked jobs, in order, when first read."""
        assert self._blocked_rest is None
        self._blocked_rest = rest

    def queue_path(self, queue: str) -> tuple[str, ...]:
        path = self._paths.get(queue)  # the tree is the snapshot's: fixed for the session
        if path is None:
            path = self._paths[queue] = queue_path_of(self.queues, queue)
        return path

    def usage_of(self, queue: str) -> Usage:
        return self.queue_usage.get(queue, ZERO)

    def user_usage_of(self, queue: str, user: str) -> Usage:
        """What `user`'s running jobs hold in `queue` and under it (kept only for a queue
        with a user limit)."""
        return self.limited_user_usage.get((queue, user), ZERO)

    def set_status_cached(self, job_id: str, code: StatusCode, reason: str) -> None:
        """Like set_status, sharing one status object per (code, reason): many waiting jobs
        give the same reason, and a cycle may set thousands."""
        self.statuses.own[job_id] = self.shared_status(code, reason)

    def shared_status(self, code: StatusCode, reason: str) -> JobStatus:
        """The cycle's one status object for (code, reason)."""
        key = (code, reason)
        status = self._status_cache.get(key)
        if status is None:
            status = self._status_cache[key] = JobStatus(code, reason)
        return status

    def set_status(
        self, job_id: str, code: StatusCode, reason: str, eta: float | None = None
    ) -> None:
        self.statuses.own[job_id] = JobStatus(code, reason, eta)

    def bind(
        self, pj: PendingJob, tasks: tuple[TaskBinding, ...], after: tuple[str, ...] = ()
    ) -> None:
        """Record a placement that the statement has already applied to `free`."""
        job = pj.job
        self.decisions.append(Bind(job.id, tasks, after))
        for guard in self.guards.values():
            guard.stale = True
        bound = pj.runtime_bound_s
        self.running[job.id] = RunningJob(
            job=job,
            tasks=tasks,
            started_s=self.now,
            attained_gpu_s=pj.attained_gpu_s,
            expected_end_s=None if bound is None else self.now + bound,
            checkpoint_interval_s=job.checkpoint_interval_s,
        )
        self.bound_now.add(job.id)
        self.add_usage(job, self.running[job.id].usage)
        reason = "placed"
        if after:
            shrunk = {
                d.job_id for d in self.decisions if isinstance(d, Shrink) and d.for_job == job.id
            }
            # Named in the order of their ids (numbers written out), not the order chosen.
            named = sorted(after, key=lambda j: (len(j), j))
            evicted = [j for j in named if j not in shrunk]
            shrinking = [j for j in named if j in shrunk]
            parts = []
            if evicted:
                parts.append(f"preempting {', '.join(evicted)}")
            if shrinking:
                parts.append(f"shrinking {', '.join(shrinking)}")
            reason = f"placed after {' and '.join(parts)}"
        code = StatusCode.PLACED if not after else StatusCode.PREEMPTING
        self.set_status(job.id, code, reason)

    def preempt(self, victim: RunningJob, for_job: str, reason: str) -> None:
        self.decisions.append(Preempt(victim.id, for_job, reason))

    def shrink(
        self, job: RunningJob, keep: tuple[TaskBinding, ...], for_job: str, reason: str
    ) -> None:
        """Record that `job` goes on with `keep` (the statement has already given the rest)."""
        self.decisions.append(Shrink(job.id, keep, for_job, reason))

    def reserve(self, res: Reservation) -> None:
        self.reservations.append(res)
        self.guards.clear()
        names = tuple(self.snapshot.arrays.names[i] for i in np.flatnonzero(res.nodes).tolist())
        self.decisions.append(Reserve(res.job_id, names, res.start_s, res.tasks))

    def dominant_share(self, usage: Usage) -> float:
        t = self.totals
        return max(
            usage[0] / t[0] if t[0] > 0 else 0.0,
            usage[1] / t[1] if t[1] > 0 else 0.0,
            usage[2] / t[2] if t[2] > 0 else 0.0,
        )

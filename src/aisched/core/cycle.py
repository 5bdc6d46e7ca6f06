"""`run_cycle`: one scheduling cycle over one snapshot.

Runs the policy's actions in order on a private session and returns the decisions, a status for
every pending job, and counters. Pure: the snapshot is not changed, and the same inputs give the
same result. With `validate`, invariants are checked after every action (on in tests and in the
simulator's validate mode) and a violation raises InvariantViolation.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from aisched.core.actions.enqueue import admission_refusal
from aisched.core.actions.preempt import Preempt as PreemptAction
from aisched.core.decisions import Bind, Decision, Preempt, Reserve, Shrink, TaskBinding
from aisched.core.pending import PendingQueue
from aisched.core.policy import Policy
from aisched.core.session import Session, ShapeBy
from aisched.core.snapshot import FreeState, PendingJob, Snapshot, usage_by_user
from aisched.core.status import JobStatus, StatusCode
from aisched.model.job import Job

NOT_REACHED = JobStatus(StatusCode.NOT_CONSIDERED, "not reached by any action this cycle")


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class CycleStats:
    pending: int
    placed: int
    preempted: int
    reserved: int
    placement_attempts: int
    shrunk: int = 0


@dataclass(frozen=True, slots=True)
class CycleResult:
    decisions: tuple[Decision, ...]
    diagnostics: Mapping[str, JobStatus]
    stats: CycleStats
    # The job shapes (`Job.shape_id`) that did not fit, at capacity no smaller than what the
    # cycle leaves free, when placement is judged per shape (empty otherwise). Until capacity
    # is given back, a job of one of these shapes cannot fit either: the simulator skips a
    # cycle that has only such jobs new to it, under a policy that may settle (`may_settle`).
    failed_shapes: frozenset[Hashable] = frozenset()
    # The free state the cycle's decisions leave (its victims gone, every bind taken): each
    # failed shape failed at capacity no smaller, so it fails at this state and any within it.
    free_after: FreeState | None = None

    @property
    def binds(self) -> tuple[Bind, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Bind))

    @property
    def preempts(self) -> tuple[Preempt, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Preempt))

    @property
    def shrinks(self) -> tuple[Shrink, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Shrink))

    @property
    def reserves(self) -> tuple[Reserve, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Reserve))


def run_cycle(
    snapshot: Snapshot,
    pending: Sequence[PendingJob] | PendingQueue,
    policy: Policy,
    now: float,
    *,
    validate: bool = False,
) -> CycleResult:
    """One cycle. `pending` may be the caller's kept `PendingQueue`: the cycle then reads
    what changed since the last one from its log rather than from the whole queue."""
    if isinstance(pending, PendingQueue):
        session = Session(snapshot, policy, now, pending.jobs(), pending)
    else:
        session = Session(snapshot, policy, now, tuple(pending))
    if validate:
        _check_inputs(session)
    for action in policy.actions:
        action.execute(session)
        if validate:
            _check(session, action.name)
    # Every pending job without a status has the same one; no walk over the queue for it.
    session.statuses.finish(NOT_REACHED)
    diagnostics: Mapping[str, JobStatus] = session.statuses
    decisions = tuple(session.decisions)
    stats = CycleStats(
        pending=len(session.pending),
        placed=sum(isinstance(d, Bind) for d in decisions),
        preempted=sum(isinstance(d, Preempt) for d in decisions),
        reserved=sum(isinstance(d, Reserve) for d in decisions),
        placement_attempts=session.placement_attempts,
        shrunk=sum(isinstance(d, Shrink) for d in decisions),
    )
    failed: frozenset[Hashable] = frozenset()
    if session.shape_by is ShapeBy.SHAPE:  # failure keys are (shape, mask key) pairs
        keys = cast("Iterable[tuple[Hashable, Hashable]]", session.fail_cache)
        failed = frozenset(shape for shape, mask in keys if mask is None)
    return CycleResult(decisions, diagnostics, stats, failed, session.free)


def never_runs(snapshot: Snapshot, policy: Policy, job: Job) -> str | None:
    """Why `job` could never run on this cluster and queue tree (unknown queue, above its
    queue's limit on its own, larger than any place it may go), or None. The check enqueue
    makes, without a whole cycle: for refusing a job at submission."""
    return admission_refusal(Session(snapshot, policy, 0.0, ()), job)


def _check_inputs(session: Session) -> None:
    ids = [pj.id for pj in session.pending]
    if len(set(ids)) != len(ids):
        raise InvariantViolation("a job is pending twice")
    snap = session.snapshot
    if snap.usage is not None:
        want = usage_by_user(snap.running)
        keys = {k for k, v in snap.usage.items() if any(v)} | set(want)
        if any(tuple(snap.usage.get(k, (0.0, 0.0, 0.0))) != want.get(k) for k in keys):
            raise InvariantViolation("snapshot usage differs from the running jobs' sum")
    both = set(ids) & {r.id for r in snap.running}
    if both:
        raise InvariantViolation(f"jobs both pending and running: {sorted(both)[:5]}")


def _check(session: Session, action: str) -> None:
    f, a = session.free, session.arrays
    for name, arr in (("cpu", f.cpu), ("mem", f.mem), ("gpu", f.gpu_milli), ("gpu_mem", f.gpu_mem)):
        if (arr < 0).any():
            node = a.names[int(np.argwhere(arr < 0)[0][0])]
            raise InvariantViolation(f"after {action}: {name} over-allocated on {node}")
    if (f.gpu_milli > np.where(a.gpu_valid, 1000, 0)).any():
        raise InvariantViolation(f"after {action}: GPU share above a whole GPU")
    if not np.array_equal(f.whole, (f.gpu_milli == 1000).sum(axis=1)):
        raise InvariantViolation(f"after {action}: whole-GPU counts drifted")
    if not np.array_equal(f.gpu_total, f.gpu_milli.sum(axis=1)):
        raise InvariantViolation(f"after {action}: free GPU totals drifted")
    bound: set[str] = set()
    evicted = {d.job_id for d in session.decisions if isinstance(d, Preempt | Shrink)}
    for d in session.decisions:
        if isinstance(d, Shrink):
            r = session.running.get(d.job_id)
            if r is None or len(d.keep) < r.job.gang_min or not d.keep:
                raise InvariantViolation(f"after {action}: {d.job_id} shrunk below its minimum")
        if isinstance(d, Bind):
            if d.job_id in bound:
                raise InvariantViolation(f"after {action}: {d.job_id} bound twice")
            bound.add(d.job_id)
            if set(d.after) - evicted:
                raise InvariantViolation(f"after {action}: {d.job_id} waits on a job not evicted")
            r = session.running.get(d.job_id)
            if r is not None and not _own_tasks(r.job, d.tasks):
                raise InvariantViolation(
                    f"after {action}: {d.job_id} bound to tasks it does not have: "
                    f"{sorted((t.group, t.index) for t in d.tasks)}"
                )
    if bound & evicted:
        raise InvariantViolation(f"after {action}: a job bound and evicted in one cycle")


def _own_tasks(job: Job, tasks: Sequence[TaskBinding]) -> bool:
    """Whether `tasks` are distinct tasks of the job's own task groups (the names and indices
    its runner starts them by), at least its gang minimum of them."""
    replicas = {g.name: g.replicas for g in job.groups}
    return (
        job.gang_min <= len(tasks) <= job.num_tasks
        and len({(t.group, t.index) for t in tasks}) == len(tasks)
        and all(0 <= t.index < replicas.get(t.group, 0) for t in tasks)
    )


def only_places(policy: Policy) -> bool:
    """Whether the policy's cycles only place pending jobs: no preemption, reclaim, backfill,
    shrinking or ETAs, no promotion of starving jobs, no queue depth. Its choices then depend
    on no clock, and with no capacity given back a job whose shape failed fails again, so a
    cycle with only such jobs new to it decides nothing (`CycleResult.failed_shapes`)."""
    return may_settle(policy) and not any(isinstance(a, PreemptAction) for a in policy.actions)


def may_settle(policy: Policy) -> bool:
    """Whether a caller may skip a cycle it can show would decide nothing: the policy only
    places (`only_places`), or it also preempts by rank (`by: order`), which a caller can rule
    out cheaply at a cycle's time (`evicts_nobody`). Then, with no capacity given back since
    the last cycle, no preemption decided in it, and every job new to the next of a shape that
    failed since in a queue no limit governs, that cycle places nobody; and when nobody could
    be evicted either it decides nothing."""
    for action in policy.actions:
        if action.name == "enqueue":
            if getattr(action, "promotes", False):
                return False
        elif isinstance(action, PreemptAction):
            if action.by != "order":
                return False
        elif action.name != "allocate":
            return False
    return policy.queue_depth is None


def evicts_nobody(snapshot: Snapshot, pending: PendingQueue, policy: Policy, now: float) -> bool:
    """Whether no preempt action of the policy could evict or shrink anyone for any of the
    `pending` jobs at `now` (true when it has none); false when that is not known cheaply."""
    return all(
        action.nobody_to_evict(policy, snapshot, pending, now)
        for action in policy.actions
        if isinstance(action, PreemptAction)
    )

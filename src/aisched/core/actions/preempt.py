"""preempt and reclaim: stop running work so that a blocked job can start.

preempt works inside a queue (or the whole cluster, `scope: cluster`): victims must rank
strictly below the blocked job, by priority (`by: priority`) or by the policy's first job-order
key (`by: order`: Tiresias' LAS queue, or shortest-remaining-time first, where a running job's
estimate is the time to its expected end). reclaim works across queues: a queue within its
guarantee takes back capacity that other queues borrowed beyond theirs, whatever the priorities.
A blocked job kept off a reservation's nodes may make room elsewhere, never on those nodes.
Only preemptible jobs are victims, never one placed in this cycle nor one already terminating.
Victims are ordered by the policy's victim selectors (lowest priority, least work lost since
checkpoint, newest).

Elastic jobs shrink before anyone is evicted. Running elastic jobs with tasks above their
`min_available` give up those surplus tasks first (a `Shrink` decision: the job keeps running
on the rest), and whole jobs are evicted only when shrinking all that may be shrunk does not
make room. The rule for who may be shrunk: for preempt, any preemptible elastic job in the
action's scope of **equal or lower priority** (whatever `by` says: a shrunk job keeps running,
so equal priority is allowed, where eviction needs a strictly lower rank); for reclaim, the
elastic jobs of queues that borrow. Never below `min_available`, never a job placed this cycle
or already terminating; surplus tasks are taken in victim order, each job's last ranks first.

With estimates that may be wrong (learned runtimes), `by: order` takes guards against evicting
for too little gain (all off by default, as the oracle bounds need none):
- `bound: upper`: the blocked job is judged by its runtime bound (upper estimate), as running
  jobs are (their expected end is their runtime bound), not by its median. Judging the two
  sides alike is what keeps two jobs from evicting each other in turn: with the median on one
  side and the upper bound on the other, A (median 1 h, bound 3 h) evicts B (2 h left to its
  bound), and B, requeued with a 1.5 h median, evicts A back.
- `factor`: a victim's key must exceed the blocked job's by this factor, not just be larger
  (on the size part of the key, when the order says how its key follows from a size).
- `min_run_s`: a victim must have run this long in its current attempt, so a restarted job
  makes progress and two jobs cannot evict each other back and forth; with
  `min_run_checkpoints`, a job that checkpoints must have run that many of its own checkpoint
  intervals instead, so what it keeps after an eviction is at least that much work.
- `count_lost_work`: a victim's key is lowered by the GPU-time it would lose (since its last
  checkpoint), the work it must redo, so preemption pays for itself; `restart_cost_s` lowers it
  further by the restart's cost (that many seconds on each of its GPUs).
A running job that has outlived its expected end is expected to run about as long again as it
has run in all (its attained GPU-time): it is not done, and it is probably long.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.eviction import Cut, find_room
from aisched.core.framework import victim_key
from aisched.core.placement import placement_shape
from aisched.core.plugins.order import INFINITE
from aisched.core.plugins.victims import LeastWorkLost, time_left_s
from aisched.core.queues import borrowed, queue_blocks, within_guarantee
from aisched.core.reservation import allowed_nodes
from aisched.core.snapshot import PendingJob, RunningJob
from aisched.core.status import StatusCode
from aisched.model.resources import GPU_MILLI_WHOLE

if TYPE_CHECKING:
    from aisched.core.session import Session

Eligible = Callable[[PendingJob, RunningJob], bool]
LEAST_WORK_LOST = LeastWorkLost()
# Blocked jobs that may make room by eviction: those that found no room, and those kept off a
# reservation's nodes (which may find room off them).
_MAY_EVICT = (StatusCode.WAIT_RESOURCES, StatusCode.WAIT_RESERVATION)
# Who may be evicted for a job; a group and a rank such that, within one group, a job of higher
# rank may evict only a subset of what a job of lower rank may (equal: the same set).
Eligibility = tuple[Eligible, Hashable, float]


def _surplus_cuts(r: RunningJob) -> list[Cut]:
    """One cut per task an elastic job could give up and still run: its tasks above
    `min_available`, the last ones first (the lowest ranks stay)."""
    surplus = len(r.tasks) - r.job.gang_min
    return [Cut(r, t) for t in reversed(r.tasks[len(r.tasks) - surplus :])]


def _run(
    session: Session,
    eligible_for: Callable[[PendingJob], Eligibility | None],
    shrinkable: Eligible,
    why: str,
    stable: bool,
    shapes: list[Hashable] | None = None,
) -> None:
    """Preempt for each blocked job in turn. `shrinkable(pj, r)`: whether the running elastic
    job `r` may give up its surplus tasks for `pj`; such shrinking is tried before any
    eviction, so a job is evicted only when shrinking all that may be shrunk is not enough.
    `stable`: whether a running job stays eligible after others are evicted (true for
    rank-based preemption, false for reclaim, where eviction changes which queues are
    borrowing). `shapes`: the blocked jobs' shapes, position for position, given when the
    blocked jobs come in order of rank, all in one group, with no reservation: a job whose
    shape has failed at a rank no higher than its own would find no room either, so it is
    passed over at the cost of a set lookup, and once every shape has failed the walk stops
    (work then grows with what preemption tries, not with the queue)."""
    # (shape, group) -> the lowest rank that found no room this cycle: a job of the same shape
    # and group and no lower rank may evict no more, so it finds none either, until some
    # preemption changes the state. Blocked jobs come in order, so with a rank that follows the
    # order (shortest remaining first) one failure settles the rest of its shape. While elastic
    # jobs could be shrunk, the key also holds the blocked job's priority and queue (what
    # shrinking depends on), so the memo never claims more than it knows.
    failed: dict[tuple[Hashable, Hashable, tuple[str, ...], Hashable], float] = {}
    # Every possible victim, in victim-preference order, computed once; candidates per
    # eligibility key are filtered from it, and both are refreshed only after a preemption.
    pool: list[RunningJob] | None = None
    by_sig: dict[Hashable, list[RunningJob]] = {}
    # Elastic jobs with tasks above their minimum, in victim-preference order (from `pool`).
    elastic: list[RunningJob] = []
    shrink_by: dict[Hashable, list[RunningJob]] = {}
    # The shapes not yet failed, while stopping early can be judged (see `shapes`).
    if session.reservations:
        shapes = None
    unsettled = set(shapes) if shapes is not None else None
    for i, pj in enumerate(list(session.blocked)):
        if unsettled is not None and not elastic and pool is not None:
            if not unsettled:
                break
            if shapes[i] not in unsettled:  # type: ignore[index]
                continue
        status = session.statuses.get(pj.id)
        if status is None or status.code not in _MAY_EVICT:
            continue
        if queue_blocks(session, pj.job) is not None:
            continue
        found_eligibility = eligible_for(pj)
        if found_eligibility is None:
            continue
        eligible, group, rank = found_eligibility
        sig = (group, rank)
        # A job kept off reserved nodes may still make room elsewhere, never on them.
        allowed, mask_key = (
            allowed_nodes(session, pj) if status.code == StatusCode.WAIT_RESERVATION else (None, ())
        )
        if pool is None:
            pool = [
                r
                for r in session.running.values()
                if r.job.preemptible and not r.terminating and r.id not in session.bound_now
            ]
            pool.sort(key=lambda r: victim_key(session.policy.victims, r, session.now))
            elastic = [r for r in pool if r.job.elastic and len(r.tasks) > r.job.gang_min]
        shrink_sig: Hashable = (pj.job.priority, pj.job.queue) if elastic else None
        memo_key = (placement_shape(session, pj.job), group, mask_key, shrink_sig)
        if memo_key in failed and rank >= failed[memo_key]:
            continue
        cands = by_sig.get(sig)
        if cands is None:
            cands = by_sig[sig] = [r for r in pool if eligible(pj, r)]
        shrinks: list[RunningJob] = []
        if elastic:
            got = shrink_by.get(shrink_sig)
            if got is None:
                got = shrink_by[shrink_sig] = [r for r in elastic if shrinkable(pj, r)]
            shrinks = got
        if not cands and not shrinks:
            failed[memo_key] = rank
            if unsettled is not None and not elastic:  # keyed by shape alone, then
                unsettled.discard(memo_key[0])
            continue
        # Surplus tasks first, whole jobs after: nobody is evicted while shrinking would do.
        cuts = [c for r in shrinks for c in _surplus_cuts(r)] + [Cut(r) for r in cands]
        room = find_room(session, pj.job, cuts, allowed, mask_key or None)
        if room is None:
            failed[memo_key] = rank
            if unsettled is not None and not elastic:  # keyed by shape alone, then
                unsettled.discard(memo_key[0])
            continue
        failed.clear()
        if unsettled is not None and shapes is not None:
            unsettled = set(shapes)
        session.blocked_in_order = False  # no longer the candidates less the placed
        gone = {v.id for v in room.evicted} | {r.id for r, _ in room.shrunk}
        pool = [r for r in pool if r.id not in gone]
        elastic = [r for r in elastic if r.id not in gone]
        shrink_by.clear()
        if stable:
            for key, cs in by_sig.items():
                by_sig[key] = [r for r in cs if r.id not in gone]
        else:
            by_sig.clear()
        for v in room.evicted:
            session.preempt(v, pj.id, f"{why} for {pj.id}")
        for r, keep in room.shrunk:
            session.shrink(r, keep, pj.id, f"shrunk for {pj.id}")
        session.blocked.remove(pj)
        session.bind(
            pj,
            room.tasks,
            after=tuple(v.id for v in room.evicted) + tuple(r.id for r, _ in room.shrunk),
        )


@dataclass(frozen=True, slots=True)
class Preempt:
    by: str = "priority"
    scope: str = "queue"
    factor: float = 1.0
    min_run_s: float = 0.0
    count_lost_work: bool = False
    bound: str = "estimate"
    restart_cost_s: float = 0.0
    min_run_checkpoints: float = 0.0
    name: str = "preempt"

    def __post_init__(self) -> None:
        if self.by not in ("priority", "order"):
            raise ValueError(f"by must be 'priority' or 'order', not {self.by!r}")
        if self.scope not in ("queue", "cluster"):
            raise ValueError(f"scope must be 'queue' or 'cluster', not {self.scope!r}")
        if not self.factor >= 1.0:
            raise ValueError(f"factor must be at least 1, got {self.factor}")
        if not self.min_run_s >= 0.0:
            raise ValueError(f"min_run_s must be 0 or more, got {self.min_run_s}")
        if self.bound not in ("estimate", "upper"):
            raise ValueError(f"bound must be 'estimate' or 'upper', not {self.bound!r}")
        if not 0.0 <= self.restart_cost_s < INFINITE:
            raise ValueError(f"restart_cost_s must be 0 or more, got {self.restart_cost_s}")
        if not 0.0 <= self.min_run_checkpoints < INFINITE:
            raise ValueError(
                f"min_run_checkpoints must be 0 or more, got {self.min_run_checkpoints}"
            )

    def min_run_of(self, r: RunningJob) -> float:
        """How long `r` must have run in its current attempt before it may be evicted: that
        many of its own checkpoint intervals (with `min_run_checkpoints`, for a job that has
        one), else `min_run_s`."""
        interval = r.checkpoint_interval_s
        if self.min_run_checkpoints and interval is not None and interval > 0:
            return self.min_run_checkpoints * interval
        return self.min_run_s

    def execute(self, session: Session) -> None:
        first = session.policy.order[0] if session.policy.order else None
        by_priority = self.by == "priority" or first is None
        now = session.now
        running_keys: dict[str, float] = {}  # first order key of each running job, at now

        size_key = getattr(first, "size_key", None)
        key_of_size = getattr(first, "key_of_size", None)

        def running_key(r: RunningJob) -> float:
            assert first is not None
            if now - r.started_s < self.min_run_of(r):
                return -INFINITE  # too fresh to stop
            left = time_left_s(r, now)
            cost = 0.0
            if self.count_lost_work:
                cost += LEAST_WORK_LOST.key(r, now)
            if self.restart_cost_s:
                cost += self.restart_cost_s * max(r.usage[2] / GPU_MILLI_WHOLE, 1.0)
            if size_key is not None and key_of_size is not None:
                # The cost comes off the size, before the order's aging form applies.
                return float(key_of_size(size_key(r.job, left) - cost, r.job))
            return first.key(r.job, r.attained_at(now), left) - cost

        def eligible_for(pj: PendingJob) -> Eligibility:
            # With `bound: upper` the blocked job is judged by its runtime bound, as a running
            # job is (its expected end comes from that bound): like against like.
            est = pj.runtime_bound_s if self.bound == "upper" else pj.estimate_s
            mine = first.key(pj.job, pj.attained_gpu_s, est) if first is not None else 0.0
            # The bar a victim's key must clear; with `factor`, above the job's own key by it.
            # An order that says how its key follows from a size (qssf, with its aging) takes
            # the factor on the size, before the aging applies: the age is no part of the gain.
            if size_key is not None and key_of_size is not None:
                size = size_key(pj.job, est)
                bar = float(key_of_size(size * self.factor if size > 0 else size, pj.job))
            else:
                bar = mine * self.factor if mine > 0 else mine

            def eligible(p: PendingJob, r: RunningJob) -> bool:
                if self.scope == "queue" and r.job.queue != p.job.queue:
                    return False
                if by_priority:
                    return r.job.priority < p.job.priority
                k = running_keys.get(r.id)
                if k is None:
                    k = running_keys[r.id] = running_key(r)
                return k > bar

            scope = pj.job.queue if self.scope == "queue" else ""
            # The rank is the bar itself: a job whose bar is no lower may evict no more.
            return eligible, scope, -float(pj.job.priority) if by_priority else bar

        def shrinkable(p: PendingJob, r: RunningJob) -> bool:
            if self.scope == "queue" and r.job.queue != p.job.queue:
                return False
            return r.job.priority <= p.job.priority

        # Blocked jobs in candidate order (`in_order`) come in order of the first order key,
        # which is the rank under `by: order`: the walk may stop once every shape has failed.
        shapes = None
        if not by_priority and self.scope == "cluster" and session.blocked_in_order:
            shapes = session.blocked_shapes
        _run(session, eligible_for, shrinkable, "preempted", stable=True, shapes=shapes)


@dataclass(frozen=True, slots=True)
class Reclaim:
    name: str = "reclaim"

    def execute(self, session: Session) -> None:
        def eligible_for(pj: PendingJob) -> Eligibility | None:
            if not within_guarantee(session, pj.job):
                return None

            def eligible(p: PendingJob, r: RunningJob) -> bool:
                return r.job.queue != p.job.queue and borrowed(session, r.job.queue, r.usage)

            return eligible, pj.job.queue, 0.0

        def shrinkable(p: PendingJob, r: RunningJob) -> bool:
            return r.job.queue != p.job.queue and borrowed(session, r.job.queue, r.usage)

        _run(session, eligible_for, shrinkable, "reclaimed", stable=False)

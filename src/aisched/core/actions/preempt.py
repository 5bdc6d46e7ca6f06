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

With estimates that may be wrong (learned runtimes), `by: order` takes three guards against
evicting for too little gain (all off by default, as the oracle bounds need none):
- `factor`: a victim's key must exceed the blocked job's by this factor, not just be larger.
- `min_run_s`: a victim must have run this long in its current attempt, so a restarted job
  makes progress and two jobs cannot evict each other back and forth.
- `count_lost_work`: a victim's key is lowered by the GPU-time it would lose (since its last
  checkpoint), the work it must redo, so preemption pays for itself.
A running job that has outlived its expected end is expected to run about as long again as it
has run in all (its attained GPU-time): it is not done, and it is probably long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.actions.preempt_walk import Eligibility, run
from aisched.core.framework import JobOrder
from aisched.core.plugins.order import INFINITE
from aisched.core.plugins.victims import LeastWorkLost, time_left_s
from aisched.core.queues import borrowed, within_guarantee
from aisched.core.running_ranks import KeptRanks, moves_of
from aisched.core.snapshot import PendingJob, RunningJob

if TYPE_CHECKING:
    from aisched.core.session import Session

LEAST_WORK_LOST = LeastWorkLost()


@dataclass(frozen=True, slots=True)
class Preempt:
    by: str = "priority"
    scope: str = "queue"
    factor: float = 1.0
    min_run_s: float = 0.0
    count_lost_work: bool = False
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

    def execute(self, session: Session) -> None:
        first = session.policy.order[0] if session.policy.order else None
        by_priority = self.by == "priority" or first is None
        now = session.now
        running_keys: dict[str, float] = {}  # first order key of each running job, at now
        # Kept across cycles where they cannot have changed (`core.running_ranks`).
        kept = None if by_priority or first is None else self._kept_ranks(session, first)

        def running_key(r: RunningJob) -> float:
            assert first is not None
            if now - r.started_s < self.min_run_s:
                return -INFINITE  # too fresh to stop
            k = first.key(r.job, r.attained_at(now), time_left_s(r, now))
            if self.count_lost_work:
                k -= LEAST_WORK_LOST.key(r, now)
            return k

        def rank_of(r: RunningJob) -> float:
            k = running_keys.get(r.id)
            if k is None:
                k = kept.key(r, now, running_key) if kept is not None else running_key(r)
                running_keys[r.id] = k
            return k

        def top_rank(pool: Sequence[RunningJob]) -> float:
            if kept is None:
                return max(map(rank_of, pool), default=-INFINITE)
            kept.sync(session.snapshot.running, now, running_key)  # the pool is among them
            return kept.top(now, running_key)

        size_key = getattr(first, "size_key", None)

        def eligible_for(pj: PendingJob) -> Eligibility:
            mine = first.key(pj.job, pj.attained_gpu_s, pj.estimate_s) if first is not None else 0.0
            # The bar a victim's key must clear; with `factor`, above the job's own key by it.
            # An order with an aging term (qssf's `aging`) applies the factor to the size part
            # of the key only: the age part is a shift, the same for the job and its victims.
            size = size_key(pj.job, pj.estimate_s) if size_key is not None else mine
            if size == mine or not (size < INFINITE and mine < INFINITE):
                bar = mine * self.factor if mine > 0 else mine
            else:
                bar = (size * self.factor if size > 0 else size) + (mine - size)

            def eligible(p: PendingJob, r: RunningJob) -> bool:
                if self.scope == "queue" and r.job.queue != p.job.queue:
                    return False
                if by_priority:
                    return r.job.priority < p.job.priority
                return rank_of(r) > bar

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
        run(
            session,
            eligible_for,
            shrinkable,
            "preempted",
            stable=True,
            shapes=shapes,
            top_rank=None if by_priority else top_rank,
        )

    def _kept_ranks(self, session: Session, first: JobOrder) -> KeptRanks | None:
        """The rank keys kept across cycles for this policy and action, when they can be:
        the first order says how its keys move (`running_ranks.moves_of`), and neither
        `min_run_s` nor `count_lost_work` makes them move with time otherwise."""
        moves = moves_of(first)
        if moves is None or self.min_run_s > 0 or self.count_lost_work:
            return None
        policy, memo = session.policy, session.arrays.memo
        slot = ("running-ranks", id(policy), id(self))
        kept = memo.get(slot)
        if not (isinstance(kept, KeptRanks) and kept.owns(policy, self)):
            kept = KeptRanks((policy, self), *moves)
            memo[slot] = kept
        return kept


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

        run(session, eligible_for, shrinkable, "reclaimed", stable=False)

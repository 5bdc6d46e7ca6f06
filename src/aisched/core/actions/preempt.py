"""preempt and reclaim: stop running work so that a blocked job can start.

preempt works inside a queue (or the whole cluster, `scope: cluster`): victims must rank
strictly below the blocked job, by priority (`by: priority`) or by the policy's first job-order
key (`by: order`: Tiresias' LAS queue, or shortest-remaining-time first, where a running job's
estimate is the time to its expected end). reclaim works across queues: a queue within its
guarantee takes back capacity that queues outside it borrowed beyond theirs, whatever the
priorities. The guarantee may be the job's queue's or, where that has none or no room left, the
nearest one above it that has room (a parent's usage counts its children's, so its guarantee is
theirs to reclaim for, from queues outside the parent). A job that may start with fewer tasks
(an elastic one) takes back room for as many of its first tasks as the guarantee holds, at
least its minimum, never more (`guarantee_claim`). Its victims are counted together, each
lowering its queues' usage for the next (`keeping_guarantees`), so no queue is taken below its
own guarantee, a parent included, which would let its requeued jobs reclaim in turn, but by one
whole job that holds some of what it borrowed (a queue guaranteed 4 GPUs whose one job holds 8
gives that job up, as in Volcano and Kueue; it never gave back what it borrowed otherwise).
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
elastic jobs of queues that borrow, of the tasks their queue borrowed (down to its guarantee).
Never below `min_available`, never a job placed this cycle or already terminating; surplus
tasks are taken in victim order, each job's last ranks first.

Under `by: order` the blocked job is judged by its runtime bound (upper estimate), as running
jobs are (their expected end is their runtime bound): `bound: upper`, the default. Judging the
two sides alike is what keeps two jobs from evicting each other in turn at one instant: with the
median on one side and the upper bound on the other, A (median 1 h, bound 3 h) evicts B (2 h
left to its bound), and B, requeued with a 1.5 h median, evicts A back, for ever. `bound:
estimate` (the median) is refused unless `min_run_s` keeps a job that has just started from
being evicted at once.

With estimates that may be wrong (learned runtimes), `by: order` takes guards against evicting
for too little gain (all off by default, as the oracle bounds need none):
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from aisched.core.actions.preempt_walk import Eligibility, run
from aisched.core.eviction import Cut
from aisched.core.framework import JobOrder
from aisched.core.kept_ranks import KeptBars, KeptRanking, KeptRanks, moves_of
from aisched.core.pending import PendingQueue
from aisched.core.plugins.order import BLIND_TO_ESTIMATES, INFINITE
from aisched.core.plugins.victims import LeastWorkLost, time_left_s
from aisched.core.queues import borrowed, guarantee_claim, keeping_guarantees
from aisched.core.snapshot import ZERO, PendingJob, RunningJob, Snapshot
from aisched.core.victim_pool import VictimPool
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE

if TYPE_CHECKING:
    from aisched.core.policy import Policy
    from aisched.core.session import Session

LEAST_WORK_LOST = LeastWorkLost()

# Rounding in time arithmetic: a running job's key is read back as `expected_end - now`, which
# for the same runtime as a pending job's key can come out a few ulps above it. Ranks closer
# than this are a tie, and a tie never evicts; otherwise two jobs of equal keys evict each other
# at the same instant for ever (each, restarted, reads a hair longer than the one it evicted).
_TIE_RELATIVE = 1e-9
_TIE_ABSOLUTE = 1e-6


def above_noise(bar: float) -> float:
    """The bar raised past rounding noise: a victim's rank must clear it by more than that."""
    if bar == INFINITE or bar == -INFINITE:
        return bar
    return bar + max(abs(bar) * _TIE_RELATIVE, _TIE_ABSOLUTE)


@dataclass(frozen=True, slots=True)
class Preempt:
    by: str = "priority"
    scope: str = "queue"
    factor: float = 1.0
    min_run_s: float = 0.0
    count_lost_work: bool = False
    bound: str = "upper"
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
        if self.by == "order" and self.bound == "estimate" and not self.min_run_s > 0:
            # The median against running jobs' upper bounds: two jobs evict each other in
            # turn at one instant, and nothing stops them but a minimum run.
            raise ValueError(
                "bound: estimate judges a waiting job by its median and running ones by their "
                "upper bound, so two jobs can evict each other for ever; give min_run_s "
                "(seconds a job runs before it may be evicted) with it, or leave bound at upper"
            )
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
        # Ranks kept across cycles while they are known (`core.kept_ranks`).
        kept = (
            None
            if by_priority or first is None
            else self._kept_ranking(session.policy, session.arrays.memo, first)
        )
        running_key = self._running_key(first, now)

        def rank_of(r: RunningJob) -> float:
            k = running_keys.get(r.id)
            if k is None:
                k = kept.running.key(r, now, running_key) if kept is not None else running_key(r)
                running_keys[r.id] = k
            return k

        def eligible_for(pj: PendingJob) -> Eligibility:
            bar = kept.bars.bar(pj) if kept is not None else self._bar(first, pj)

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

        ranks = (
            None
            if by_priority
            else _Ranks(session, kept, running_key, rank_of, self.scope == "cluster")
        )
        # Blocked jobs in candidate order (`shape_walk`) come in order of the first order key,
        # which is the rank under `by: order`: the walk may stop once every shape has failed.
        shapes = None
        if (
            not by_priority
            and self.scope == "cluster"
            and session.blocked_in_order
            and self._bar_follows_order(first)
        ):
            shapes = session.blocked_shapes
        elif kept is not None and ranks is not None and ranks.nothing_to_try():
            return  # out of order, the walk would look at every blocked job to learn it
        run(
            session,
            eligible_for,
            shrinkable,
            "preempted",
            stable=True,
            shapes=shapes,
            ranking=ranks,
        )

    def _bar(self, first: JobOrder | None, pj: PendingJob) -> float:
        """The bar a victim's rank key must be above for `pj` to evict it (`by: order`)."""
        # With `bound: upper` the blocked job is judged by its runtime bound, as a running job
        # is (its expected end comes from that bound): like against like.
        est = pj.runtime_bound_s if self.bound == "upper" else pj.estimate_s
        mine = first.key(pj.job, pj.attained_gpu_s, est) if first is not None else 0.0
        # The bar a victim's key must clear; with `factor`, above the job's own key by it.
        # An order that says how its key follows from a size (qssf, with its aging) takes the
        # factor on the size, before the aging applies: the age is no part of the gain.
        size_key = getattr(first, "size_key", None)
        key_of_size = getattr(first, "key_of_size", None)
        if size_key is not None and key_of_size is not None:
            size = size_key(pj.job, est)
            return above_noise(float(key_of_size(size * self.factor if size > 0 else size, pj.job)))
        return above_noise(mine * self.factor if mine > 0 else mine)

    def _bar_follows_order(self, first: JobOrder | None) -> bool:
        """Whether the bars of the blocked jobs rise with their first order key, as the walk's
        early stop over shapes needs: not when the bar is taken from another estimate than the
        order's (`bound: upper`, unless the order reads no estimate: las, fifo, ...), nor
        when `factor` scales the size under a linear aging term (the age is then a shift the
        factor does not scale; the log form of halving turns the factor into a shift too, which
        keeps the order), nor under qssf's bands (ordered by submission within a band, where
        the bar follows the size)."""
        if self.bound != "estimate" and type(first) not in BLIND_TO_ESTIMATES:
            return False
        if getattr(first, "bucket", False):
            return False
        return self.factor == 1.0 or not getattr(first, "aging", 0.0)

    def _running_key(self, first: JobOrder | None, now: float) -> Callable[[RunningJob], float]:
        """A running job's rank key at `now` (`by: order`): its first order key read with its
        time left, less what evicting it costs; -inf while it is too fresh to stop."""
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

        return running_key

    def nobody_to_evict(
        self, policy: Policy, snapshot: Snapshot, pending: PendingQueue, now: float
    ) -> bool:
        """Whether, whatever allocate leaves blocked, no pending job could evict or shrink
        anyone at `now`, known cheaply from the kept ranks: no running job ranks above the
        lowest bar of all pending jobs, and none could be shrunk. False when that cannot be
        known so (by priority, or ranks that are not kept). Lets a caller skip a cycle."""
        first = policy.order[0] if policy.order else None
        if self.by == "priority" or first is None:
            return False
        kept = self._kept_ranking(policy, snapshot.arrays.memo, first)
        if kept is None:
            return False
        running_key = self._running_key(first, now)
        found = _top_over_lowest(kept, snapshot, now, running_key, pending.jobs(), pending)
        return found is not None and found[0] <= found[1]

    def _kept_ranking(
        self, policy: Policy, memo: dict[object, object], first: JobOrder
    ) -> KeptRanking | None:
        """The ranks kept across cycles for this policy and action, when they can be: the
        first order says how its keys move (`kept_ranks.moves_of`), and no minimum run nor
        `count_lost_work` makes them move with time otherwise (`restart_cost_s` does not: a
        constant taken off the size keeps a key that falls falling)."""
        moves = moves_of(first)
        if moves is None or self.min_run_s > 0 or self.min_run_checkpoints > 0:
            return None
        if self.count_lost_work:
            return None
        slot = ("kept-ranking", id(policy), id(self))
        kept = memo.get(slot)
        if not (isinstance(kept, KeptRanking) and kept.owns(policy, self)):
            kept = KeptRanking(
                (policy, self), KeptRanks(*moves), KeptBars(partial(self._bar, first))
            )
            memo[slot] = kept
        return kept


def _top_over_lowest(
    kept: KeptRanking,
    snapshot: Snapshot,
    now: float,
    running_key: Callable[[RunningJob], float],
    pending: tuple[PendingJob, ...],
    queue: PendingQueue | None,
) -> tuple[float, float] | None:
    """From the kept ranks, the lowest bar of the `pending` jobs (those of `queue`, when
    given) and the highest running rank key, exact when above that bar (at most it
    otherwise); None when some running job could be shrunk (a bar then says too little)."""
    kept.running.sync(snapshot.running, now, running_key, snapshot.changes)
    if kept.running.shrinkable:
        return None
    kept.bars.sync(pending, queue)
    low = kept.bars.lowest_of_all()
    return kept.running.top(now, running_key, low), low


class _Ranks:
    """The walk's `Ranking` for preempt `by: order` in one cycle: from the ranks kept across
    cycles when there are some, else from every possible victim's key, computed once."""

    def __init__(
        self,
        session: Session,
        kept: KeptRanking | None,
        running_key: Callable[[RunningJob], float],
        rank_of: Callable[[RunningJob], float],
        whole_cluster: bool,
    ) -> None:
        self._session, self._kept = session, kept
        self._running_key, self._rank_of = running_key, rank_of
        self._whole_cluster = whole_cluster  # scope: cluster, so the rank alone decides
        self._top: float | None = None
        # The last `below`: its top, the jobs it was asked of, and the positions it found.
        self._below: tuple[float, list[PendingJob], list[int]] | None = None

    def top(self, above: float) -> float:
        session, kept = self._session, self._kept
        if kept is None:
            if self._top is None:
                keys = map(self._rank_of, VictimPool(session).jobs)
                self._top = max(keys, default=-INFINITE)
            return self._top
        # The snapshot's running jobs hold every possible victim (and perhaps more).
        snapshot = session.snapshot
        kept.running.sync(snapshot.running, session.now, self._running_key, snapshot.changes)
        return kept.running.top(session.now, self._running_key, above)

    def may_shrink(self) -> bool:
        kept = self._kept
        if kept is None:
            return True
        snapshot = self._session.snapshot
        kept.running.sync(snapshot.running, self._session.now, self._running_key, snapshot.changes)
        return kept.running.shrinkable > 0

    def above(self, pool: VictimPool, rank: float) -> list[RunningJob] | None:
        if not self._whole_cluster:
            return None  # a victim must be in the blocked job's queue too
        if self._kept is None:
            rank_of = self._rank_of
            return [r for r in pool.jobs if rank_of(r) > rank]
        session, running = self._session, self._kept.running
        snapshot, now = session.snapshot, session.now
        running.sync(snapshot.running, now, self._running_key, snapshot.changes)
        views = running.views_above(rank, now)
        if views is None:
            return running.above(pool.jobs, rank, now, self._running_key)
        # The table holds the snapshot's running jobs, which the pool is drawn from: the pool's
        # jobs above the rank, in another order (the walk puts candidates in victim order).
        return [r for r in views if pool.holds(r)]

    def below(self, jobs: list[PendingJob], top: float) -> list[int] | None:
        kept = self._kept
        if kept is None:
            return None
        last = self._below
        if last is not None and last[0] == top and last[1] == jobs:  # identical jobs: fast
            return last[2]
        session = self._session
        kept.bars.sync(session.pending, session.pending_queue)  # every blocked job is pending
        found = kept.bars.below(jobs, top)
        self._below = (top, list(jobs), found)
        return found

    def nothing_to_try(self) -> bool:
        """Whether no blocked job could evict or shrink anyone, from the kept ranks: nobody
        to shrink and no blocked job's bar below the highest running rank key. Then the walk
        would try nothing and decide nothing, so it need not run; else the walk reads the
        jobs found here again (`below`) rather than look for them twice."""
        kept, session = self._kept, self._session
        if kept is None:
            return False
        # Every blocked job is pending, so none has a bar below the lowest of them all; the
        # top is exact when above it, and the walk's `top` then finds it at once.
        found = _top_over_lowest(
            kept,
            session.snapshot,
            session.now,
            self._running_key,
            session.pending,
            session.pending_queue,
        )
        if found is None:
            return False
        top, low = found
        if top <= low:
            return True
        # The lowest bar is often a job placed in this cycle (a new one, which ranks first):
        # then none left blocked may be below the top either, known without reading them.
        if top <= kept.bars.lowest_without(session.bound_now):
            return True
        return not self.below(session.blocked, top)


@dataclass(frozen=True, slots=True)
class Reclaim:
    name: str = "reclaim"

    def execute(self, session: Session) -> None:
        # The queue each blocked job reclaims for (`guarantee_claim`), found when the walk
        # asks who it may evict and read back by the questions of the same visit.
        owners: dict[str, str] = {}

        def spared(pj: PendingJob) -> tuple[str, ...]:
            """The path of the queue `pj` reclaims for: the job's placement refills them, so
            victims are judged against the guarantees of the queues off it."""
            return session.queue_path(owners[pj.id])

        def eligible_for(pj: PendingJob) -> Eligibility | None:
            claim = guarantee_claim(session, pj.job)
            if claim is None:
                return None
            owner = owners[pj.id] = claim[0]
            kept = spared(pj)

            def eligible(p: PendingJob, r: RunningJob) -> bool:
                outside = owner not in session.queue_path(r.job.queue)
                return outside and borrowed(session, r.job.queue, r.usage, kept, whole=True)

            return eligible, owner, 0.0

        def shrinkable(p: PendingJob, r: RunningJob) -> bool:
            # Any elastic job of a queue above its guarantee: which of its surplus tasks may go
            # (those its queue borrowed) is `keeping_guarantees`' to say, task by task. Judged
            # by the whole job's usage, a job holding its queue's guarantee was never shrunk.
            outside = owners[p.id] not in session.queue_path(r.job.queue)
            return outside and borrowed(session, r.job.queue, ZERO, spared(p))

        def cap(taken: Job) -> Job | None:
            # An elastic job makes room for as much of itself as the guarantee holds (at least
            # its minimum), so it takes back what a job of that size would, and no more.
            claim = guarantee_claim(session, taken)
            return None if claim is None else claim[1]

        def within(pj: PendingJob, cuts: Sequence[Cut]) -> list[Cut]:
            return keeping_guarantees(session, cuts, spared(pj))

        run(session, eligible_for, shrinkable, "reclaimed", stable=False, cap=cap, within=within)

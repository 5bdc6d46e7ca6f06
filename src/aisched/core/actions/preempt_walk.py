"""The walk that preempt and reclaim share: for each blocked job in turn, who may be evicted
for it, and whether evicting (or shrinking) some of them makes room (`eviction.find_room`).

Most blocked jobs find nobody to evict, and a job finds no room where one of its shape and
group found none at a rank no higher than its own, so the walk is built to pay for what it
tries rather than for the queue or the running set:

1. The possible victims are filtered per eligibility key and put in victim order only when a
   what-if is about to take from them (`victim_pool`).
2. Under a rank (preempt: every victim's rank key must be above the blocked job's rank), a job
   ranked at or above the highest running rank key finds nobody, known without a filter.
3. When the blocked jobs come in order of rank (`shapes` given), a job whose shape has failed
   is passed over, and the walk jumps from one unsettled shape's next job to the next (a
   search in C) rather than stepping through the jobs between.
4. A lower rank may evict a superset of what a higher one may (the `Eligibility` contract), so
   a job that finds exactly as many candidates as one of the same key that failed since the
   last preemption finds the very same ones, and fails too without its what-if.

None of this changes a decision: the walk decides exactly what stepping through every
blocked job and filtering the whole sorted pool for each decided
(tests/unit/core/test_preempt_walk.py compares the two).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, overload

from aisched.core.eviction import Cut, find_room
from aisched.core.placement import placement_shape
from aisched.core.plugins.order import INFINITE
from aisched.core.queues import queue_takes
from aisched.core.reservation import allowed_nodes
from aisched.core.snapshot import PendingJob, RunningJob
from aisched.core.status import StatusCode
from aisched.core.victim_pool import InVictimOrder, VictimPool
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session

Eligible = Callable[[PendingJob, RunningJob], bool]
# Blocked jobs that may make room by eviction: those that found no room, and those kept off a
# reservation's nodes (which may find room off them).
MAY_EVICT = (StatusCode.WAIT_RESOURCES, StatusCode.WAIT_RESERVATION)
# Who may be evicted for a job; a group and a rank such that, within one group, a job of higher
# rank may evict only a subset of what a job of lower rank may (equal: the same set).
Eligibility = tuple[Eligible, Hashable, float]


class Ranking(Protocol):
    """Preemption by rank, at one cycle's time: a running job is eligible for a blocked job only
    if its rank key is above the blocked job's rank (`by: order`)."""

    def top(self, above: float) -> float:
        """At least the highest rank key of the running jobs; exact when it is above
        `above`. Called as often as the walk needs; must be cheap when nothing changed."""
        ...

    def may_shrink(self) -> bool:
        """False only when no running job could be shrunk (preemptible, not stopping, elastic
        with tasks above its minimum): the walk then looks for none."""
        ...

    def above(self, pool: VictimPool, rank: float) -> list[RunningJob] | None:
        """The jobs of `pool` whose rank key is above `rank` (in any order: the walk sorts
        candidates into victim order, and judges them by their number), when that alone says
        who is eligible; None when eligibility asks more (the walk then asks `eligible` of
        each)."""
        ...

    def below(self, jobs: list[PendingJob], top: float) -> list[int] | None:
        """The positions, in order, of the pending `jobs` whose rank (their bar) is below
        `top`, when the bars are at hand; None otherwise (the walk then visits every job)."""
        ...


def _surplus_cuts(r: RunningJob) -> list[Cut]:
    """One cut per task an elastic job could give up and still run: its tasks above
    `min_available`, the last ones first (the lowest ranks stay)."""
    surplus = len(r.tasks) - r.job.gang_min
    return [Cut(r, t) for t in reversed(r.tasks[len(r.tasks) - surplus :])]


class _Cuts(Sequence[Cut]):
    """Surplus tasks, then whole jobs in victim order, as cuts made only when read: the search
    for room reads a short prefix of a list as long as the possible victims."""

    __slots__ = ("_surplus", "_jobs")

    def __init__(self, surplus: list[Cut], jobs: Sequence[RunningJob]) -> None:
        self._surplus, self._jobs = surplus, jobs

    def __len__(self) -> int:
        return len(self._surplus) + len(self._jobs)

    @overload
    def __getitem__(self, i: int) -> Cut: ...

    @overload
    def __getitem__(self, i: slice) -> list[Cut]: ...

    def __getitem__(self, i: int | slice) -> Cut | list[Cut]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self._surplus)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._surplus[i] if i < n else Cut(self._jobs[i - n])


class _Unsettled:
    """The shapes of the blocked jobs not yet failed, and where each one's next job is.

    `next_from(i)` is the first position from `i` on whose shape is unsettled (the length
    when none is): what stepping from `i` and skipping settled shapes would reach. Positions
    found are kept per shape and looked for again only once the walk has passed them."""

    __slots__ = ("_next", "_shapes", "left")

    def __init__(self, shapes: list[Hashable]) -> None:
        self._shapes = shapes
        self._next: dict[Hashable, int] = {}
        self.left = set(shapes)

    def next_from(self, i: int) -> int:
        shapes, found = self._shapes, self._next
        n = len(shapes)
        first = n
        for shape in self.left:
            at = found.get(shape, -1)
            if at < i:
                try:
                    at = shapes.index(shape, i)
                except ValueError:
                    at = n
                found[shape] = at
            first = min(first, at)
        return first

    def reset(self) -> None:
        """Every shape is unsettled again (a preemption changed what is running)."""
        self.left = set(self._shapes)


def run(
    session: Session,
    eligible_for: Callable[[PendingJob], Eligibility | None],
    shrinkable: Eligible,
    why: str,
    stable: bool,
    shapes: list[Hashable] | None = None,
    ranking: Ranking | None = None,
    cap: Callable[[Job], Job | None] | None = None,
    within: Callable[[PendingJob, Sequence[Cut]], list[Cut]] | None = None,
) -> None:
    """Preempt for each blocked job in turn. `shrinkable(pj, r)`: whether the running elastic
    job `r` may give up its surplus tasks for `pj`; such shrinking is tried before any
    eviction, so a job is evicted only when shrinking all that may be shrunk is not enough.
    `stable`: whether a running job stays eligible after others are evicted (true for
    rank-based preemption, false for reclaim, where eviction changes which queues are
    borrowing). `shapes`: the blocked jobs' shapes, position for position, given when the
    blocked jobs come in order of rank, all in one group, with no reservation: a job whose
    shape has failed at a rank no higher than its own would find no room either, so it is
    passed over, and once every shape has failed the walk stops (work then grows with what
    preemption tries, not with the queue). `ranking`: given when eligibility goes by rank; a job
    ranked at or above the highest running rank key then finds nobody, known without the
    possible victims gathered or filtered. `cap`: what of the job (as its queue takes it) the
    action makes room for, None for nothing (reclaim: no more than the guarantee it claims).
    `within(pj, cuts)`: the cuts, in order, that may be taken together for `pj` (reclaim: none
    that takes a queue below its guarantee, counting the cuts before it); every prefix of what
    it returns, and every subset of one, must be allowed, as the search takes a prefix and then
    drops cuts from it. None: any prefix of the cuts may be taken."""
    # (shape, group) -> the lowest rank that found no room this cycle: a job of the same shape
    # and group and no lower rank may evict no more, so it finds none either, until some
    # preemption changes the state. Blocked jobs come in order, so with a rank that follows the
    # order (shortest remaining first) one failure settles the rest of its shape. While elastic
    # jobs could be shrunk, the key also holds the blocked job's priority, queue and group (what
    # shrinking depends on), so the memo never claims more than it knows.
    failed: dict[tuple[Hashable, Hashable, tuple[str, ...], Hashable], float] = {}
    # The same key -> how many candidates (and jobs to shrink) its last failed what-if had.
    failed_sizes: dict[tuple[Hashable, Hashable, tuple[str, ...], Hashable], tuple[int, int]] = {}
    # Every possible victim, built once when first needed; candidates per eligibility key are
    # filtered from it (in its order) and put in victim order only when a what-if takes from
    # them. Both are refreshed only after a preemption.
    pool: VictimPool | None = None
    started = False  # a blocked job got past the first checks (the plain walk built its pool)
    top = INFINITE  # with `ranking`: at least the highest running rank key
    by_sig: dict[Hashable, list[RunningJob]] = {}
    ordered_by_sig: dict[Hashable, InVictimOrder] = {}
    # Elastic jobs with tasks above their minimum (from `pool`).
    elastic: list[RunningJob] = []
    shrink_by: dict[Hashable, list[RunningJob]] = {}
    # The shapes not yet failed, while stopping early can be judged (see `shapes`).
    if session.reservations:
        shapes = None
    unsettled = _Unsettled(shapes) if shapes is not None else None
    blocked = list(session.blocked)
    placed = 0  # blocked jobs placed so far: session.blocked is `blocked` less them
    # Out of rank order with nobody to shrink, only the jobs ranked below the highest running
    # rank key can evict anyone (the running set only shrinks as the walk goes): the walk
    # visits those alone (step 2 for the whole list at once).
    worth: Iterator[int] | None = None
    if unsettled is None and ranking is not None and not ranking.may_shrink():
        below = ranking.below(blocked, ranking.top(-INFINITE))
        if below is not None:
            worth = iter(below)
    i = -1
    while True:
        if worth is not None:
            i = next(worth, len(blocked))
        else:
            i += 1
        # Judged on the shapes left (see `shapes`); never while elastic jobs could shrink.
        if unsettled is not None and not elastic and started:
            if not unsettled.left:
                break
            i = unsettled.next_from(i)
        if i >= len(blocked):
            break
        pj = blocked[i]
        status = session.statuses.stated(pj.id)
        if status is None or status.code not in MAY_EVICT:
            continue
        taken = queue_takes(session, pj.job)
        if isinstance(taken, str):
            continue
        found_eligibility = eligible_for(pj)
        if found_eligibility is None:
            continue
        eligible, group, rank = found_eligibility
        if cap is not None:
            capped = cap(taken)
            if capped is None:
                continue
            taken = capped
        if not started:
            started = True
            if ranking is None or ranking.may_shrink():
                pool = VictimPool(session)
                elastic = [r for r in pool.jobs if r.job.elastic and len(r.tasks) > r.job.gang_min]
        if ranking is not None and rank < top:
            top = ranking.top(rank)  # exact when above this rank
        nobody_above = ranking is not None and rank >= top
        if nobody_above and unsettled is None and not elastic:
            continue  # out of order, its failure would settle no later job: nothing to note
        sig = (group, rank)
        # A job kept off reserved nodes may still make room elsewhere, never on them.
        allowed, mask_key = (
            allowed_nodes(session, pj) if status.code == StatusCode.WAIT_RESERVATION else (None, ())
        )
        shrink_sig: Hashable = (pj.job.priority, pj.job.queue, group) if elastic else None
        memo_key = (placement_shape(session, taken), group, mask_key, shrink_sig)
        if memo_key in failed and rank >= failed[memo_key]:
            continue
        cands = by_sig.get(sig)
        if cands is None:
            if nobody_above:
                cands = by_sig[sig] = []
            else:
                if pool is None:
                    pool = VictimPool(session)
                found = ranking.above(pool, rank) if ranking is not None else None
                if found is None:
                    found = [r for r in pool.jobs if eligible(pj, r)]
                cands = by_sig[sig] = found
        shrinks: list[RunningJob] = []
        if elastic:
            assert pool is not None  # built with `elastic`
            got = shrink_by.get(shrink_sig)
            if got is None:
                got = shrink_by[shrink_sig] = pool.ordered(
                    [r for r in elastic if shrinkable(pj, r)]
                )
            shrinks = got
        if not cands and not shrinks:
            failed[memo_key] = rank
            if unsettled is not None and not elastic:  # keyed by shape alone, then
                unsettled.left.discard(memo_key[0])
            continue
        assert pool is not None  # candidates or elastic jobs were found in it
        # A higher rank of this key found no room among as many candidates: among a superset
        # of them as many is the same set, so the what-if would fail again. Step 4.
        sizes = (len(cands), len(shrinks))
        if failed_sizes.get(memo_key) == sizes:
            failed[memo_key] = rank
            if unsettled is not None and not elastic:  # keyed by shape alone, then
                unsettled.left.discard(memo_key[0])
            continue
        ordered = ordered_by_sig.get(sig)
        if ordered is None:
            ordered = ordered_by_sig[sig] = InVictimOrder(pool, cands)
        # Surplus tasks first, whole jobs after: nobody is evicted while shrinking would do.
        cuts: Sequence[Cut] = _Cuts([c for r in shrinks for c in _surplus_cuts(r)], ordered)
        if within is not None:
            cuts = within(pj, cuts)
        room = find_room(session, taken, cuts, allowed, mask_key or None)
        if room is None:
            failed[memo_key] = rank
            failed_sizes[memo_key] = sizes
            if unsettled is not None and not elastic:  # keyed by shape alone, then
                unsettled.left.discard(memo_key[0])
            continue
        failed.clear()
        failed_sizes.clear()
        if unsettled is not None:
            unsettled.reset()
        session.blocked_in_order = False  # no longer the candidates less the placed
        gone = {v.id for v in room.evicted} | {r.id for r, _ in room.shrunk}
        pool.drop(gone)  # the highest rank key can only have fallen: `top` stays a bound
        elastic = [r for r in elastic if r.id not in gone]
        shrink_by.clear()
        if stable:
            for key, cs in by_sig.items():
                by_sig[key] = [r for r in cs if r.id not in gone]
            for key, order in ordered_by_sig.items():
                ordered_by_sig[key] = order.without(gone)
        else:
            by_sig.clear()
            ordered_by_sig.clear()
        for v in room.evicted:
            session.preempt(v, pj.id, f"{why} for {pj.id}")
        for r, keep in room.shrunk:
            session.shrink(r, keep, pj.id, f"shrunk for {pj.id}")
        # By position, not `remove`: equal-looking jobs would be compared field by field.
        at = i - placed
        assert session.blocked[at] is pj
        del session.blocked[at]
        placed += 1
        session.bind(
            pj,
            room.tasks,
            after=tuple(v.id for v in room.evicted) + tuple(r.id for r, _ in room.shrunk),
        )

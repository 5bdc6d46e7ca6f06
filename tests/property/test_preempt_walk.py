"""The preemption walk's work-saving paths decide exactly what the plain walk decided.

The plain walk (`plain_walk` below, the walk as it was before issue 16's preemption work) steps
through every blocked job, sorts every possible victim by victim key and filters the whole
sorted pool for each job it tries, and its what-if search (`plain_find_room`) places the job
again for every question. The walk of `core.actions.preempt_walk` sorts only the candidates a
what-if takes from, knows without a filter when nobody ranks above a job, jumps over settled
shapes, reads ranks kept across cycles (`core.kept_ranks`) and skips a cycle's walk when
nobody could evict anyone, and `eviction.find_room` reuses the placement it found (its first
what-if kept as it stands when one victim makes room). Both are
run on the same input and must give the same decisions and statuses: one cycle on the drawn
scenarios of test_core_properties, and whole replays, where the kept ranks live across
thousands of cycles.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_core_properties import SETTINGS, Scenario, cycle, scenarios

import aisched.core.actions.preempt as preempt_mod
from aisched.core.actions.preempt_walk import MAY_EVICT, Eligibility, Eligible, Ranking
from aisched.core.eviction import Cut, Room, _plan, _take
from aisched.core.framework import victim_key, victim_keys
from aisched.core.placement import place_job, placement_shape
from aisched.core.plugins.victims import LeastWorkLost, LongestRemaining, LowestPriority, Newest
from aisched.core.policy import preset
from aisched.core.queues import queue_takes
from aisched.core.reservation import allowed_nodes
from aisched.core.session import Session
from aisched.core.snapshot import BoolArray, PendingJob, RunningJob
from aisched.core.statement import Statement
from aisched.core.status import StatusCode
from aisched.core.victim_pool import InVictimOrder, VictimPool
from aisched.model.job import Job
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.traces import synthetic_cluster, synthetic_trace

PREEMPTING = ("priority", "las", "qssf", "srtf-oracle", "default")


def plain_walk(
    session: Session,
    eligible_for: Callable[[PendingJob], Eligibility | None],
    shrinkable: Eligible,
    why: str,
    stable: bool,
    shapes: list[Hashable] | None = None,
    ranking: Ranking | None = None,  # not used: the plain walk filters for every job
    cap: Callable[[Job], Job | None] | None = None,
    within: Callable[[PendingJob, Sequence[Cut]], list[Cut]] | None = None,
) -> None:
    """The walk before issue 16's preemption work, step for step (with reclaim's victims
    counted together, `within`)."""
    failed: dict[tuple[Hashable, Hashable, tuple[str, ...], Hashable], float] = {}
    pool: list[RunningJob] | None = None
    by_sig: dict[Hashable, list[RunningJob]] = {}
    elastic: list[RunningJob] = []
    shrink_by: dict[Hashable, list[RunningJob]] = {}
    if session.reservations:
        shapes = None
    unsettled = set(shapes) if shapes is not None else None
    for i, pj in enumerate(list(session.blocked)):
        if unsettled is not None and not elastic and pool is not None:
            if not unsettled:
                break
            assert shapes is not None
            if shapes[i] not in unsettled:
                continue
        status = session.statuses.get(pj.id)
        if status is None or status.code not in MAY_EVICT:
            continue
        taken = queue_takes(session, pj.job)
        if isinstance(taken, str):
            continue
        found = eligible_for(pj)
        if found is None:
            continue
        eligible, group, rank = found
        if cap is not None:
            capped = cap(taken)
            if capped is None:
                continue
            taken = capped
        sig = (group, rank)
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
        shrink_sig: Hashable = (pj.job.priority, pj.job.queue, group) if elastic else None
        memo_key = (placement_shape(session, taken), group, mask_key, shrink_sig)
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
            if unsettled is not None and not elastic:
                unsettled.discard(memo_key[0])
            continue
        surplus = [Cut(r, t) for r in shrinks for t in reversed(r.tasks[r.job.gang_min :])]
        cuts = surplus + [Cut(r) for r in cands]
        if within is not None:
            cuts = within(pj, cuts)
        room = plain_find_room(session, taken, cuts, allowed, mask_key or None)
        if room is None:
            failed[memo_key] = rank
            if unsettled is not None and not elastic:
                unsettled.discard(memo_key[0])
            continue
        failed.clear()
        if unsettled is not None and shapes is not None:
            unsettled = set(shapes)
        session.blocked_in_order = False
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


def plain_find_room(
    session: Session,
    job: Job,
    cuts: Sequence[Cut],
    allowed: BoolArray | None = None,
    mask_key: Hashable = None,
) -> Room | None:
    """`eviction.find_room` before issue 16's preemption work: every placement searched
    (with the whole jobs not needed spared, last taken first)."""

    def fits(prefix: Sequence[Cut]) -> bool:
        st = Statement(session)
        _take(session, st, prefix)
        placed = place_job(session, st, job, allowed, ("evict", len(prefix), mask_key))
        st.discard()
        return not isinstance(placed, str)

    if not cuts:
        return None
    n = len(cuts)
    lo, hi = 1, 1
    while not fits(cuts[:hi]):
        if hi == n:
            return None
        lo, hi = hi + 1, min(hi * 2, n)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(cuts[:mid]):
            hi = mid
        else:
            lo = mid + 1
    prefix = list(cuts[:lo])
    st = Statement(session)
    _take(session, st, prefix)
    res = place_job(session, st, job, allowed, ("evict-final", lo, mask_key))
    st.discard()
    if isinstance(res, str):
        return None
    used = {t.node for t in res}
    needed = [
        c
        for c in prefix
        if any(t.node in used for t in (c.job.tasks if c.task is None else (c.task,)))
    ]
    for c in [c for c in reversed(needed) if c.task is None and c is not prefix[-1]]:
        without = [k for k in needed if k is not c]
        if fits(without):
            needed = without
    st = Statement(session)
    _take(session, st, needed)
    final = place_job(session, st, job, allowed, ("evict-needed", len(needed), mask_key))
    if isinstance(final, str):
        st.discard()
        needed = prefix
        st = Statement(session)
        _take(session, st, needed)
        final = place_job(session, st, job, allowed, ("evict-final", lo, mask_key))
        if isinstance(final, str):
            st.discard()
            return None
    st.commit()
    evicted, shrunk = _plan(needed)
    return Room(tuple(evicted), tuple(shrunk), final)


@contextmanager
def walking_plainly() -> Iterator[None]:
    """The plain walk in place of the kept one, and no rank keys kept across cycles."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preempt_mod, "run", plain_walk)
        mp.setattr(preempt_mod, "moves_of", lambda order: None)
        yield


@SETTINGS
@given(policy=st.sampled_from(PREEMPTING), scn=scenarios())
def test_one_cycle_decides_as_the_plain_walk(policy: str, scn: Scenario) -> None:
    fast = cycle(scn, policy, validate=True)
    with walking_plainly():
        plain = cycle(scn, policy, validate=True)
    assert fast.decisions == plain.decisions
    assert fast.diagnostics == plain.diagnostics


def replay(policy: str, seed: int, queues: int) -> SimResult:
    # Busy enough that a queue builds up and preemption happens on two 8-GPU nodes.
    trace = synthetic_trace(250, seed=seed, arrival_rate_per_h=90.0, num_queues=queues)
    config = SimConfig(validate=True, checkpoint_interval_s=600.0)
    name, _, sampled = policy.partition("+")
    chosen = preset(name)
    if sampled:  # a node sample: placement then depends on the placements before it
        chosen = replace(chosen, node_sample=int(sampled))
    return simulate(trace, synthetic_cluster(2), chosen, config)


@pytest.mark.parametrize("policy", ["las", "srtf-oracle", "qssf", "priority", "las+8"])
@pytest.mark.parametrize(("seed", "queues"), [(1, 1), (2, 1), (3, 2)])
def test_replays_decide_as_the_plain_walk(policy: str, seed: int, queues: int) -> None:
    fast = replay(policy, seed, queues)
    with walking_plainly():
        plain = replay(policy, seed, queues)
    assert fast.log == plain.log
    assert fast.jobs == plain.jobs
    if policy != "priority":
        assert fast.stats["preemptions"] > 0  # the walk was put to work


@SETTINGS
@given(scn=scenarios())
def test_victim_keys_in_one_pass_are_the_keys_one_by_one(scn: Scenario) -> None:
    selectors = (LeastWorkLost(), Newest(), LongestRemaining(), LowestPriority())
    # Also with periodic checkpoints in place of a known last one (none, or none yet at now).
    running = list(scn.running) + [
        replace(r, last_checkpoint_s=None, checkpoint_interval_s=interval)
        for r in scn.running
        for interval in (0.0, 7.0, 100.0)
    ]
    assert victim_keys(selectors, running, scn.now) == [
        victim_key(selectors, r, scn.now) for r in running
    ]


@SETTINGS
@given(
    scn=scenarios(),
    selectors=st.lists(
        st.sampled_from((LeastWorkLost(), Newest(), LongestRemaining(), LowestPriority())),
        max_size=3,
    ),
    read=st.lists(st.integers(0, 40), max_size=6),
    gone=st.sets(st.integers(0, 40), max_size=4),
)
def test_victim_order_read_lazily_is_the_sorted_order(
    scn: Scenario, selectors: list[object], read: list[int], gone: set[int]
) -> None:
    # The first job found in one pass (ties on the first selector's key, LowestPriority's
    # above all, broken by whole keys), the rest sorted when read, before and after some go.
    policy = replace(preset("las"), victims=tuple(selectors))  # type: ignore[arg-type]
    session = Session(scn.snapshot(), policy, scn.now, scn.pending)
    pool = VictimPool(session)
    jobs = pool.jobs
    want = sorted(jobs, key=lambda r: victim_key(policy.victims, r, scn.now))
    lazy = InVictimOrder(pool, jobs)
    assert len(lazy) == len(want)
    if want:
        assert lazy[0] is want[0]
    for i in read:
        if i < len(want):
            assert lazy[i] is want[i]
    ids = {jobs[i].id for i in gone if i < len(jobs)}
    left = lazy.without(ids)
    assert [left[i] for i in range(len(left))] == [r for r in want if r.id not in ids]
    fresh = InVictimOrder(pool, jobs).without(ids)  # never sorted before some went
    assert [fresh[i] for i in range(len(fresh))] == [r for r in want if r.id not in ids]


@SETTINGS
@given(
    scn=scenarios(),
    changes=st.lists(st.sampled_from(("kept", "evicted", "shrunk", "dropped", "earlier"))),
    read_first=st.booleans(),
)
def test_victim_pool_holds_exactly_its_jobs(
    scn: Scenario, changes: list[str], read_first: bool
) -> None:
    # `holds` (what candidates read from the kept ranks are checked with) agrees with `jobs`,
    # whether the list was read before this walk evicted and shrank some jobs or only after;
    # with a job shrunk by an earlier action (marked terminating before the pool was made) and
    # jobs dropped from the pool alone. `changes[k]` says what befalls the k-th running job.
    session = Session(scn.snapshot(), preset("las"), scn.now, scn.pending)
    every = list(session.running.values())
    befall = list(zip(changes, every, strict=False))
    for change, r in befall:
        if change == "earlier":
            session.running[r.id] = replace(r, terminating=True)
    pool = VictimPool(session)
    if read_first:
        assert len(pool.jobs) <= len(every)
    dropped = set()
    for change, r in befall:
        if change == "evicted":
            del session.running[r.id]
        elif change == "shrunk":  # it goes on smaller, marked terminating
            session.running[r.id] = replace(r, terminating=True)
        if change in ("evicted", "shrunk", "dropped"):
            dropped.add(r.id)
    pool.drop(dropped)
    members = {id(r) for r in pool.jobs}
    assert members == {
        id(r)
        for r in session.running.values()
        if r.job.preemptible and not r.terminating and r.id not in dropped
    }
    for r in every + list(session.running.values()):
        assert pool.holds(r) == (id(r) in members)

"""Running jobs' rank keys kept across cycles (`core.kept_ranks`) equal their recomputation.

Random event sequences (jobs start with some attained service and an expected end, jobs end,
time moves on: by small steps, onto the instants where a key changes, past expected ends)
are played against a `KeptRanks` table; after every sync, `top` must be the highest key
computed afresh and `key` the key computed afresh, for `las` (keys kept exactly between steps
of attained service) and for `qssf` and `sjf` (kept as upper bounds while time left shrinks).
Also the promises the table rests on: the orders listed as falling are keyed by their estimate
alone and never fall as it grows; `las` is keyed by attained service alone, fixed below the
step it names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from aisched.core.decisions import TaskBinding
from aisched.core.demotion import demotion_at
from aisched.core.framework import JobOrder
from aisched.core.kept_ranks import (
    _FALLING_ORDERS,
    KeptBars,
    KeptRanks,
    Moves,
    moves_of,
    shrinkable,
)
from aisched.core.pending import PendingQueue
from aisched.core.plugins.order import Las, PredictedGpuTime, ShortestFirst
from aisched.core.plugins.victims import time_left_s
from aisched.core.policy import preset
from aisched.core.snapshot import PendingJob, RunningChanges, RunningJob
from aisched.testing import job

ORDERS: dict[str, JobOrder] = {
    "las": Las(),
    "las-fine": Las(thresholds_gpu_s=(10.0, 100.0, 1000.0)),
    "qssf": PredictedGpuTime(),
    "qssf-aging": PredictedGpuTime(aging=0.1),
    "sjf": ShortestFirst(),
    "sjf-gpu": ShortestFirst(by="gpu_time"),
}
GPU_MILLI = (1000, 2000, 4000, 8000, 500, 0)
SETTINGS = settings(max_examples=150, deadline=None)


@dataclass(frozen=True)
class Start:
    gpu_milli: int
    attained_gpu_s: float
    runtime_s: float | None
    started_ago_s: float


@dataclass(frozen=True)
class End:
    which: int


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class ToNextChange:
    """Time moves to the instant some running job's key next changes (or a hair before)."""

    which: int
    early: bool


EVENTS = st.one_of(
    st.builds(
        Start,
        st.sampled_from(GPU_MILLI),
        st.sampled_from((0.0, 0.0, 1000.0, 3599.0, 3600.0, 35_000.0, 1e5)),
        st.sampled_from((None, 0.0, 60.0, 3600.0, 1e5)),
        st.sampled_from((0.0, 0.0, 10.0, 1800.0)),
    ),
    st.builds(End, st.integers(0, 50)),
    st.builds(Wait, st.sampled_from((0.0, 1e-9, 1.0, 59.0, 600.0, 3600.0, 40_000.0))),
    st.builds(ToNextChange, st.integers(0, 50), st.booleans()),
)


def view(i: int, e: Start, now: float) -> RunningJob:
    b = job(f"j{i}").submitted(float(i)).estimate(7200.0)
    gpus = e.gpu_milli // 1000
    if gpus > 1 and i % 3 == 0:  # an elastic gang of 1-GPU tasks, some of it shrinkable
        b.task(gpus, gpu=1).elastic()
        tasks = tuple(TaskBinding("main", t, "n0", (t,), 1000) for t in range(gpus - i % 2))
    elif gpus:
        b.task(gpu=gpus)
        tasks = (TaskBinding("main", 0, "n0", tuple(range(gpus)), 1000),)
    elif e.gpu_milli:
        b.task(gpu_milli=e.gpu_milli)
        tasks = (TaskBinding("main", 0, "n0", (0,), e.gpu_milli),)
    else:
        b.task(cpu=1)
        tasks = (TaskBinding("main", 0, "n0", (), 0, 1000),)
    started = now - e.started_ago_s
    end = None if e.runtime_s is None else started + e.runtime_s
    return RunningJob(b.build(), tasks, started, e.attained_gpu_s, end)


def rank_key(order: JobOrder, r: RunningJob, now: float) -> float:
    """The key preempt `by: order` gives a running job (no min_run_s, no lost work)."""
    if now - r.started_s < 0.0:
        return -math.inf
    return order.key(r.job, r.attained_at(now), time_left_s(r, now))


class Log:
    """A caller's log of the running set (`Snapshot.changes`), started again as a new list
    past `limit` entries, as `Holdings` keeps one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: list[tuple[RunningJob, bool]] = []

    def note(self, r: RunningJob, added: bool) -> None:
        if len(self.entries) >= self.limit:
            self.entries = []
        self.entries.append((r, added))

    def changes(self) -> RunningChanges:
        return RunningChanges(self.entries, len(self.entries))


@SETTINGS
@given(
    name=st.sampled_from(sorted(ORDERS)),
    events=st.lists(EVENTS, max_size=40),
    follow=st.booleans(),
    limit=st.sampled_from((3, 1000)),
    every=st.sampled_from((1, 4)),
)
def test_kept_keys_equal_keys_computed_afresh(
    name: str, events: list[object], follow: bool, limit: int, every: int
) -> None:
    """With `follow` the table follows the caller's log (across its restarts), else it
    compares whole running sets; either way it holds exactly what is running. It is synced
    after every event, or after every fourth (a log may then start again in between)."""
    order = ORDERS[name]
    moves = moves_of(order)
    assert moves is not None
    kept = KeptRanks(*moves)
    running: list[RunningJob] = []
    log = Log(limit)
    now, serial = 1000.0, 0
    for n, e in enumerate(events):
        if isinstance(e, Start):
            running.append(view(serial, e, now))
            log.note(running[-1], True)
            serial += 1
        elif isinstance(e, End) and running:
            log.note(running.pop(e.which % len(running)), False)
        elif isinstance(e, Wait):
            now += e.seconds
        elif isinstance(e, ToNextChange) and running:
            r = running[e.which % len(running)]
            at = demotion_at(preset("las"), r, now) if name.startswith("las") else r.expected_end_s
            if at is not None and at > now:
                now = math.nextafter(at, -math.inf) if e.early else at

        def compute(r: RunningJob, now: float = now) -> float:
            return rank_key(order, r, now)

        if n % every:
            continue
        kept.sync(tuple(running), now, compute, log.changes() if follow else None)
        keys = sorted(map(compute, running))
        for above in keys[len(keys) // 2 :: 2]:  # a bound at least the top, exact above it
            bound = kept.top(now, compute, above)
            assert bound >= keys[-1] and (bound <= above or bound == keys[-1])
            assert kept.above(running, above, now, compute) == [
                r for r in running if compute(r) > above
            ]
            found = kept.views_above(above, now)
            if kept.moves is Moves.STEPS:  # the same views, read from the values above
                assert found is not None
                assert sorted(map(id, found)) == sorted(
                    id(r) for r in running if compute(r) > above
                )
            else:
                assert found is None
        assert kept.top(now, compute) == max(keys, default=-math.inf)
        for r in running:
            assert kept.key(r, now, compute) == compute(r)
        assert set(kept.entries) == {id(r) for r in running}
        assert kept.shrinkable == sum(map(shrinkable, running))


FALLING = sorted(name for name, o in ORDERS.items() if type(o) in _FALLING_ORDERS)
assert {type(ORDERS[name]) for name in FALLING} == set(_FALLING_ORDERS), "an order is untested"


@SETTINGS
@given(
    name=st.sampled_from(FALLING),
    gpu_milli=st.sampled_from((500, 1000, 2000, 8000)),
    estimates=st.tuples(*[st.one_of(st.none(), st.floats(0.0, 1e7))] * 2),
    attained=st.tuples(*[st.floats(0.0, 1e7)] * 2),
)
def test_falling_orders_key_by_estimate_alone_never_falling_as_it_grows(
    name: str,
    gpu_milli: int,
    estimates: tuple[float | None, float | None],
    attained: tuple[float, float],
) -> None:
    order = ORDERS[name]
    j = job("j").task(gpu_milli=gpu_milli).estimate(600.0).submitted(5.0).build()
    a, b = estimates
    assert order.key(j, attained[0], a) == order.key(j, attained[1], a)
    if a is not None and b is not None and a <= b:
        assert order.key(j, 0.0, a) <= order.key(j, 0.0, b)


@SETTINGS
@given(
    thresholds=st.lists(st.floats(1.0, 1e6), min_size=1, max_size=4, unique=True).map(sorted),
    attained=st.floats(0.0, 2e6),
    more=st.floats(0.0, 2e6),
)
def test_las_keys_by_attained_service_alone_fixed_below_its_next_step(
    thresholds: list[float], attained: float, more: float
) -> None:
    las = Las(thresholds_gpu_s=tuple(thresholds))
    j = job("j").task(gpu=1).build()
    step = las.next_change_gpu_s(attained)
    later = attained + more
    if step is None or later < step:
        assert las.key(j, later, None) == las.key(j, attained, 3600.0)
    else:
        assert las.key(j, later, None) > las.key(j, attained, None)


@SETTINGS
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(("add", "drop", "same")), st.integers(0, 30)), max_size=40
    )
)
def test_kept_bars_equal_bars_computed_afresh(steps: list[tuple[str, int]]) -> None:
    def bar_of(pj: PendingJob) -> float:
        return float(pj.job.priority) + pj.attained_gpu_s

    kept = KeptBars(bar_of)
    pending: tuple[PendingJob, ...] = ()
    made = 0
    for what, n in steps:
        if what == "add":
            j = job(f"p{made}").task(gpu=1).priority(n % 7).build()
            pending = (*pending, PendingJob(j, attained_gpu_s=float(n % 3)))
            made += 1
        elif what == "drop" and pending:
            k = n % len(pending)
            pending = pending[:k] + pending[k + 1 :]
        else:
            pending = tuple(pending)[::-1][::-1]  # equal jobs, maybe a new tuple
        kept.sync(pending)
        assert set(kept.entries) == {id(pj) for pj in pending}
        assert kept.lowest_of_all() == min(map(bar_of, pending), default=math.inf)
        for pj in pending:
            assert kept.bar(pj) == bar_of(pj)
        _assert_below(kept, bar_of, list(pending)[n % 3 :], n)
        _assert_lowest_without(kept, bar_of, pending, n)


@SETTINGS
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(("add", "drop", "again", "plain")), st.integers(0, 30)),
        max_size=40,
    )
)
def test_kept_bars_follow_a_pending_queues_log(steps: list[tuple[str, int]]) -> None:
    """Synced from the queue's log (or, now and then, from a plain tuple), the table holds
    exactly the queue's jobs, and the lowest bar of all is theirs."""

    def bar_of(pj: PendingJob) -> float:
        return float(pj.job.priority) + pj.attained_gpu_s

    kept = KeptBars(bar_of)
    queue = PendingQueue()
    made = 0
    for what, n in steps:
        ids = list(queue.keys())
        if what == "add" or not ids:
            j = job(f"p{made}").task(gpu=1).priority(n % 7).build()
            queue[j.id] = PendingJob(j, attained_gpu_s=float(n % 3))
            made += 1
        elif what == "drop":
            queue.pop(ids[n % len(ids)])
        elif what == "again":  # set again in place, seen afresh (as a requeue is)
            old = queue.get(ids[n % len(ids)])
            assert old is not None
            queue[old.id] = PendingJob(old.job, attained_gpu_s=float(n % 5))
        pending = queue.jobs()
        kept.sync(pending, None if what == "plain" else queue)
        assert set(kept.entries) == {id(pj) for pj in pending}
        assert kept.lowest_of_all() == min(map(bar_of, pending), default=math.inf)
        for pj in pending:
            assert kept.bar(pj) == bar_of(pj)
        _assert_below(kept, bar_of, list(pending)[::-1], n)
        _assert_lowest_without(kept, bar_of, pending, n)


def _assert_below(
    kept: KeptBars, bar_of: Callable[[PendingJob], float], jobs: list[PendingJob], n: int
) -> None:
    """`below` finds, in order, the positions of the jobs (some of those synced, and one that
    is not) whose bar is under each of several tops."""
    stranger = PendingJob(job(f"x{n}").task(gpu=1).priority(n % 7).build())
    jobs = [*jobs[: n % 4], stranger, *jobs[n % 4 :]]
    for top in (-math.inf, 0.5, 2.0, float(n % 9), math.inf):
        want = [k for k, pj in enumerate(jobs) if bar_of(pj) < top]
        assert kept.below(jobs, top) == want


def _assert_lowest_without(
    kept: KeptBars, bar_of: Callable[[PendingJob], float], pending: tuple[PendingJob, ...], n: int
) -> None:
    """The lowest bar of the jobs synced, some of the lowest and some others left out."""
    by_bar = sorted(pending, key=bar_of)
    for left_out in (set(), {pj.id for pj in by_bar[: n % 4]}, {pj.id for pj in pending[::2]}):
        want = min((bar_of(pj) for pj in pending if pj.id not in left_out), default=math.inf)
        assert kept.lowest_without(left_out) == want

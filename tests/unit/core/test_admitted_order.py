"""The kept admitted order (`core.admitted`) equals one computed afresh, whatever sequence of
arrivals, departures and cycles led to it: followed from a `PendingQueue`'s log, compared from
a plain sequence, across the log's generations, and with cycles skipped in between. And the
queue itself: a dict of its jobs in insertion order with a log of every change, and a count of
its jobs per shape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from aisched.core import admitted as admitted_mod
from aisched.core import pending as pending_mod
from aisched.core.admitted import AdmittedOrder, Member
from aisched.core.pending import PendingQueue
from aisched.core.snapshot import PendingJob
from aisched.testing import job

QUEUES = ("a", "b", "c")


class Borrower:
    """Stands for a cycle's statuses: what it was lent must not change while it lives."""

    def __init__(self) -> None:
        self.members: Mapping[str, Member] = {}

    def know_members(self, members: Mapping[str, Member]) -> None:
        self.members = members


def judge(pj: PendingJob) -> Member:
    j = pj.job
    refused = "too large" if j.num_gpus > 6 else None
    return Member(pj, (float(j.priority), *j.tie_break), refused, j.num_gpus)


def make(n: int, gpus: int, queue: int, priority: int) -> PendingJob:
    return (
        job(f"j{n}")
        .task(gpu=gpus)
        .queue(QUEUES[queue])
        .priority(priority)
        .submitted(float(n % 7))
        .pending()
    )


def expected(jobs: tuple[PendingJob, ...]) -> dict[str, object]:
    members = [judge(pj) for pj in jobs]
    admitted = sorted((m for m in members if m.refusal is None), key=lambda m: m.key)
    by_queue: dict[str, tuple[list[str], dict[Hashable, list[object]]]] = {}
    for m in admitted:
        ids, shapes = by_queue.setdefault(m.pj.job.queue, ([], {}))
        ids.append(m.pj.id)
        shapes.setdefault(m.shape, []).append(m.key)
    return {
        "order": [m.pj.id for m in admitted],
        "shapes": [m.shape for m in admitted],
        "refused": sorted(m.pj.id for m in members if m.refusal is not None),
        "by_queue": by_queue,
        "by_id": {m.pj.id: m.key for m in members},
    }


def kept_view(kept: AdmittedOrder) -> dict[str, object]:
    assert kept.keys == sorted(kept.keys)
    return {
        "order": [pj.id for pj in kept.jobs],
        "shapes": list(kept.shapes),
        "refused": sorted(m.pj.id for m in kept.refused.values()),
        "by_queue": {
            q: ([pj.id for pj in ix.jobs], {s: list(k) for s, k in ix.shape_keys.items()})
            for q, ix in kept.by_queue.items()
        },
        "by_id": {i: m.key for i, m in kept.by_id.items()},
    }


# One step: what (add a job, remove the pending job at some position, set a pending job
# again in place as a new view of it, or run a cycle), a position, the new job's GPUs, queue
# and priority, and whether the cycle follows the queue's log or gets a copy of its jobs.
Step = tuple[str, int, int, int, int, bool]
steps = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "remove", "replace", "cycle"]),
        st.integers(0, 1000),
        st.integers(1, 8),
        st.integers(0, 2),
        st.integers(0, 2),
        st.booleans(),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    steps=steps,
    log_limit=st.sampled_from([4, 16, 8192]),
    rebuild_at=st.sampled_from([2, admitted_mod.REBUILD_AT]),
)
def test_the_kept_order_equals_one_computed_afresh(
    steps: list[Step], log_limit: int, rebuild_at: int
) -> None:
    queue = PendingQueue()
    kept = AdmittedOrder(("policy", "queues"))
    lent: list[tuple[dict[str, object], Borrower]] = []
    n = 0
    original = pending_mod.LOG_LIMIT, admitted_mod.REBUILD_AT
    pending_mod.LOG_LIMIT = log_limit  # a short log: generations roll over mid-sequence
    admitted_mod.REBUILD_AT = rebuild_at  # a low bar: whole rebuilds between small steps
    try:
        for what, at, gpus, q, prio, follow in steps:
            ids = [pj.id for pj in queue.jobs()]
            if what == "add":
                n += 1
                queue[f"j{n}"] = make(n, gpus, q, prio)
            elif what == "remove" and ids:
                assert queue.pop(ids[at % len(ids)]) is not None
            elif what == "replace" and ids:
                old = queue.get(ids[at % len(ids)])
                assert old is not None
                queue[old.id] = PendingJob(old.job, attained_gpu_s=old.attained_gpu_s + 1)
            elif what == "cycle":
                jobs = queue.jobs()
                kept.update(jobs, judge, queue if follow else None)
                assert kept_view(kept) == expected(jobs)
                borrower = Borrower()
                kept.lend_members(borrower)
                lent.append(({i: m.key for i, m in borrower.members.items()}, borrower))
            assert shapes_of(queue) == Counter(pj.job.shape_id for pj in queue.jobs())
        kept.update(queue.jobs(), judge, queue)
        assert kept_view(kept) == expected(queue.jobs())
    finally:
        pending_mod.LOG_LIMIT, admitted_mod.REBUILD_AT = original
    # What was lent to a cycle's statuses never changed afterwards.
    for frozen, borrower in lent:
        assert {i: m.key for i, m in borrower.members.items()} == frozen


def shapes_of(queue: PendingQueue) -> Counter[int]:
    """The queue's own count of jobs per shape, keyed by the shape of the job it names."""
    return Counter({j.shape_id: n for n, j in queue.shapes()})


def test_a_pending_queue_is_an_ordered_dict_with_a_log_of_changes() -> None:
    queue = PendingQueue()
    a, b, c = (job(x).pending() for x in "abc")
    queue["a"], queue["b"], queue["c"] = a, b, c
    assert queue.jobs() == (a, b, c) and list(queue) == [a, b, c]
    assert "b" in queue and len(queue) == 3
    b2 = PendingJob(b.job, attained_gpu_s=5.0)
    queue["b"] = b2  # in place, as a dict keeps a key's position
    assert queue.pop("a") is a and queue.pop("a") is None
    assert queue.jobs() == (b2, c)
    assert list(queue.newest_first()) == [c, b2]
    assert queue.log == [(a, True), (b, True), (c, True), (b, False), (b2, True), (a, False)]


def test_a_job_filed_under_another_id_is_refused() -> None:
    queue = PendingQueue()
    try:
        queue["x"] = job("y").pending()
    except ValueError as e:
        assert "filed under" in str(e)
    else:
        raise AssertionError("expected a ValueError")


def test_a_table_nobody_borrows_any_more_is_changed_in_place_without_a_copy() -> None:
    queue = PendingQueue()
    kept = AdmittedOrder(("policy", "queues"))
    queue["j1"] = make(1, 1, 0, 0)
    kept.update(queue.jobs(), judge, queue)
    borrower = Borrower()
    kept.lend_members(borrower)
    table = kept.by_id
    del borrower  # the cycle's result is dropped before the next cycle, as the simulator does
    queue["j2"] = make(2, 1, 0, 0)
    kept.update(queue.jobs(), judge, queue)
    assert kept.by_id is table and set(table) == {"j1", "j2"}

"""Reclaim takes a queue below its guarantee by one borrowing job at most, counting its
victims together; a parent's guarantee is reclaimed for its children; an elastic job of a
borrowing queue gives back what its queue borrowed; and an eviction takes only the jobs the
blocked one needs (docs/policies.md, "Actions")."""

from __future__ import annotations

from dataclasses import replace

from helpers import running, summary

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind, Preempt, Shrink
from aisched.core.policy import preset
from aisched.core.snapshot import PendingJob, RunningJob, snapshot_of
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import cluster, job, node

TEAMS = QueueTree(
    (
        Queue("teama", guarantee=Resources(gpu=4)),
        Queue("teamb", guarantee=Resources(gpu=4)),
        Queue("scratch", limit=Resources(gpu=3)),
    )
)


def one_gpu(name: str, queue: str, gpu: int, started_s: float) -> RunningJob:
    return running(job(name).task(gpu=1).queue(queue).build(), ("n1", (gpu,)), started_s=started_s)


def borrowed_node() -> list[RunningJob]:
    """teama runs five 1-GPU jobs (one borrowed) and scratch three; teama's started last, so
    they come first in victim order (newest, least work lost)."""
    teama = [one_gpu(f"a{i}", "teama", i, started_s=100.0) for i in range(5)]
    scratch = [one_gpu(f"s{i}", "scratch", 5 + i, started_s=0.0) for i in range(3)]
    return teama + scratch


def gpus_of(jobs: list[RunningJob], queue: str) -> int:
    return sum(int(r.usage[2]) // 1000 for r in jobs if r.job.queue == queue)


def test_reclaim_takes_no_queue_below_its_guarantee() -> None:
    run = borrowed_node()
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, TEAMS)
    pending = [job("b").task(gpu=2).queue("teamb").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    evicted = {d.job_id for d in result.decisions if isinstance(d, Preempt)}
    # Only teama's borrowed GPU may go; the other GPU comes from scratch, which is owed none.
    assert len(evicted) == 2
    assert len([j for j in evicted if j.startswith("a")]) == 1
    left = [r for r in run if r.id not in evicted]
    assert gpus_of(left, "teama") == 4
    assert [d.job_id for d in result.decisions if isinstance(d, Bind)] == ["b"]


def test_reclaim_cascade_stops_when_victims_come_back() -> None:
    """Cycle after cycle, the victims' capacity frees, they are requeued and may reclaim in
    turn: the first reclaim leaves every queue at or above its guarantee, so nobody else is
    evicted and the requeued jobs wait."""
    now = 200.0
    run = borrowed_node()
    pending = [job("b").task(gpu=2).queue("teamb").submitted(now).pending()]
    evictions = 0
    for cycle in range(6):
        snap = snapshot_of(cluster(node("n1").gpus(8)), run, TEAMS)
        result = run_cycle(snap, pending, preset("priority"), now, validate=True)
        evicted = {d.job_id for d in result.decisions if isinstance(d, Preempt)}
        evictions += len(evicted)
        by_id = {r.id: r for r in run}
        # Back in the queue, as the loop requeues a preempted job; their capacity frees.
        requeued = [PendingJob(replace(by_id[j].job, submit_time_s=now)) for j in sorted(evicted)]
        run = [r for r in run if r.id not in evicted]
        bound = {d.job_id: d.tasks for d in result.decisions if isinstance(d, Bind)}
        run += [RunningJob(p.job, bound[p.id], now) for p in pending if p.id in bound]
        pending = [p for p in pending if p.id not in bound] + requeued
        assert gpus_of(run, "teama") >= 4, cycle
        now += 1.0
    assert evictions == 2
    assert gpus_of(run, "teamb") == 2 and gpus_of(run, "teama") >= 4


def test_reclaim_shrinks_what_an_elastic_job_borrowed() -> None:
    """teama's elastic job holds all 8 GPUs (guarantee 4, minimum 2): teamb's 4-GPU job is
    owed its guarantee, and gets it by shrinking the elastic job to teama's guarantee."""
    el = job("el").task(8, gpu=1).min_available(2).elastic().queue("teama").build()
    big = running(el, *(("n1", (i,)) for i in range(8)))
    snap = snapshot_of(cluster(node("n1").gpus(8)), [big], TEAMS)
    pending = [job("b").task(gpu=4).queue("teamb").pending()]
    result = run_cycle(snap, pending, preset("priority"), 10.0, validate=True)
    assert summary(result) == [
        ("shrink", "el", "b", "n1:0", "n1:1", "n1:2", "n1:3"),
        ("bind", "b", "n1:4,5,6,7"),
    ]
    assert not any(isinstance(d, Preempt) for d in result.decisions)
    assert [len(d.keep) for d in result.decisions if isinstance(d, Shrink)] == [4]


def test_preempt_evicts_only_the_jobs_the_blocked_one_needs() -> None:
    """low1 comes first in victim order but freeing it with big4 is more than needed: big4
    alone (with the idle GPU 7) makes room, so low1 keeps running."""
    run = [
        running(job("low1").task(gpu=1).priority(-100).build(), ("n1", (0,))),
        running(job("big4").task(gpu=4).priority(0).build(), ("n1", (1, 2, 3, 4))),
        running(job("keep").task(gpu=2).priority(200).build(), ("n1", (5, 6))),
    ]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, QueueTree())
    pending = [job("hi").task(gpu=4).priority(100).pending()]
    result = run_cycle(snap, pending, preset("priority"), 10.0, validate=True)
    assert [d.job_id for d in result.decisions if isinstance(d, Preempt)] == ["big4"]
    bound = [d for d in result.decisions if isinstance(d, Bind)]
    assert [d.job_id for d in bound] == ["hi"]
    assert 0 not in {g for t in bound[0].tasks for g in t.gpus}


# A parent guaranteed 4 GPUs of 8, with two children that have no guarantee of their own;
# a child of research that has one; and a top-level queue owed nothing.
NESTED = QueueTree(
    (
        Queue("org", guarantee=Resources(gpu=4)),
        Queue("train", parent="org"),
        Queue("serve", parent="org"),
        Queue("research"),
        Queue("vision", parent="research", guarantee=Resources(gpu=2)),
        Queue("nlp", parent="research"),
        Queue("scratch"),
        Queue("teamb", guarantee=Resources(gpu=4)),
    )
)


def test_a_child_reclaims_for_its_parents_guarantee_from_outside_the_parent() -> None:
    """train has no guarantee, its parent org has 4 GPUs: scratch borrowed 7 of the 8 beside
    serve's one, so train's 2-GPU job takes 2 back from scratch, not serve's (inside org). Only
    the leaf's own guarantee counted: train, guaranteed nothing, reclaimed nothing."""
    run = [one_gpu("v0", "serve", 0, started_s=100.0)]  # newest: first in victim order
    run += [one_gpu(f"s{i}", "scratch", 1 + i, started_s=0.0) for i in range(7)]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, NESTED)
    pending = [job("t").task(gpu=2).queue("train").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    evicted = sorted(d.job_id for d in result.decisions if isinstance(d, Preempt))
    assert len(evicted) == 2 and all(j.startswith("s") for j in evicted)
    assert [d.job_id for d in result.decisions if isinstance(d, Bind)] == ["t"]


def test_a_child_reclaims_no_more_than_its_parents_guarantee_has_room_for() -> None:
    """org holds 3 of its 4 GPUs (serve's): train's 2-GPU job would take it past its
    guarantee, so it reclaims nothing; a 1-GPU job does."""
    run = [one_gpu(f"v{i}", "serve", i, started_s=0.0) for i in range(3)]
    run += [one_gpu(f"s{i}", "scratch", 3 + i, started_s=0.0) for i in range(5)]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, NESTED)
    two = [job("t").task(gpu=2).queue("train").submitted(200).pending()]
    result = run_cycle(snap, two, preset("priority"), 200.0, validate=True)
    assert not any(isinstance(d, Preempt | Bind) for d in result.decisions)
    one = [job("t").task(gpu=1).queue("train").submitted(200).pending()]
    result = run_cycle(snap, one, preset("priority"), 200.0, validate=True)
    assert [d.job_id[0] for d in result.decisions if isinstance(d, Preempt)] == ["s"]
    assert [d.job_id for d in result.decisions if isinstance(d, Bind)] == ["t"]


def test_reclaim_takes_no_parent_below_its_guarantee() -> None:
    """org's 4 GPUs run in train, which has no guarantee of its own: they are org's guarantee,
    not borrowed. teamb's 4-GPU job takes scratch's 4, though train's jobs, the newest, come
    first in victim order. Judged by the leaf alone, train's jobs were all borrowed."""
    run = [one_gpu(f"t{i}", "train", i, started_s=100.0) for i in range(4)]
    run += [one_gpu(f"s{i}", "scratch", 4 + i, started_s=0.0) for i in range(4)]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, NESTED)
    pending = [job("b").task(gpu=4).queue("teamb").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    evicted = sorted(d.job_id for d in result.decisions if isinstance(d, Preempt))
    assert evicted == ["s0", "s1", "s2", "s3"]
    assert [d.job_id for d in result.decisions if isinstance(d, Bind)] == ["b"]


def test_a_childs_own_guarantee_still_reclaims_from_its_siblings() -> None:
    """vision is guaranteed 2 GPUs inside research (none): nlp, its sibling, borrowed them,
    and vision's job takes them back from nlp as from any queue outside vision."""
    run = [one_gpu(f"n{i}", "nlp", i, started_s=100.0) for i in range(8)]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, NESTED)
    pending = [job("v").task(gpu=2).queue("vision").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    assert len([d for d in result.decisions if isinstance(d, Preempt)]) == 2
    assert [d.job_id for d in result.decisions if isinstance(d, Bind)] == ["v"]


def test_reclaim_evicts_the_one_job_that_holds_what_its_queue_borrowed() -> None:
    """teama (guaranteed 4) runs one 8-GPU job: 4 of its GPUs are borrowed, but evicting it
    takes teama below its guarantee. teamb's 4-GPU job, owed its guarantee, evicts it, as
    Volcano's and Kueue's reclaim evict a borrowing queue's job; judged only by what teama
    keeps after it, nothing was ever taken and teamb waited for as long as the job ran."""
    big = running(job("big").task(gpu=8).queue("teama").build(), ("n1", tuple(range(8))))
    snap = snapshot_of(cluster(node("n1").gpus(8)), [big], TEAMS)
    pending = [job("b").task(gpu=4).queue("teamb").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    assert summary(result) == [("preempt", "big", "b"), ("bind", "b", "n1:0,1,2,3")]
    # Requeued, big reclaims nothing back: teamb holds no more than its guarantee.
    (bind,) = [d for d in result.decisions if isinstance(d, Bind)]
    b = RunningJob(pending[0].job, bind.tasks, 200.0)
    snap = snapshot_of(cluster(node("n1").gpus(8)), [b], TEAMS)
    again = [PendingJob(replace(big.job, submit_time_s=201.0))]
    result = run_cycle(snap, again, preset("priority"), 201.0, validate=True)
    assert summary(result) == []


def test_reclaim_takes_a_queue_below_its_guarantee_by_one_job_at_most() -> None:
    """teama (guaranteed 4) runs two 3-GPU jobs beside 2 idle GPUs, 2 of its 6 borrowed:
    one job may go (x, the newest), and then teama holds 3, under its guarantee, so y stays.
    teamb's 6-GPU job would need both, and takes nothing; its 4-GPU job takes x."""
    run = [
        running(job("x").task(gpu=3).queue("teama").build(), ("n1", (0, 1, 2)), started_s=1.0),
        running(job("y").task(gpu=3).queue("teama").build(), ("n1", (3, 4, 5))),
    ]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, TEAMS)
    pending = [job("b").task(gpu=6).queue("teamb").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    assert not any(isinstance(d, Preempt | Bind) for d in result.decisions)
    pending = [job("b").task(gpu=4).queue("teamb").submitted(200).pending()]
    result = run_cycle(snap, pending, preset("priority"), 200.0, validate=True)
    assert [d.job_id for d in result.decisions if isinstance(d, Preempt)] == ["x"]
    assert [d.job_id for d in result.decisions if isinstance(d, Bind)] == ["b"]


def test_the_placed_jobs_reason_names_its_victims_in_the_order_of_their_ids() -> None:
    """Victim order takes job 10 first (the lowest priority); the reason names 2 before 10,
    as every listing of ids does (it said `preempting 10, 2`)."""
    run = [
        running(job("10").task(gpu=4).priority(-10).build(), ("n1", (0, 1, 2, 3))),
        running(job("2").task(gpu=4).priority(0).build(), ("n1", (4, 5, 6, 7))),
    ]
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, QueueTree())
    pending = [job("30").task(gpu=8).priority(100).pending()]
    result = run_cycle(snap, pending, preset("priority"), 10.0, validate=True)
    assert [d.job_id for d in result.decisions if isinstance(d, Preempt)] == ["10", "2"]
    assert result.diagnostics["30"].reason == "placed after preempting 2, 10"

"""Reclaim's queue arithmetic over a queue tree (`core.queues`): which guarantee a blocked job
reclaims for (`guarantee_claim`), and which victims keep every queue, a parent included, at or
above its guarantee (`borrowed`, `keeping_guarantees`). A parent's usage counts its children's,
so its guarantee is theirs: reclaim reads it as the usage does."""

from __future__ import annotations

from aisched.core.decisions import TaskBinding
from aisched.core.eviction import Cut
from aisched.core.policy import preset
from aisched.core.queues import (
    borrowed,
    borrowed_usage,
    guarantee_claim,
    keeping_guarantees,
)
from aisched.core.session import Session, usage_along_paths
from aisched.core.snapshot import ZERO, RunningJob, snapshot_of
from aisched.model.job import Job
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import cluster, job, node, pending

TREE = QueueTree(
    (
        Queue("org", guarantee=Resources(gpu=4)),
        Queue("team", parent="org", guarantee=Resources(gpu=2)),
        Queue("train", parent="org"),
        Queue("scratch"),
    )
)


def one_gpu(name: str, queue: str, gpu: int) -> RunningJob:
    j = job(name).task(gpu=1).queue(queue).build()
    return RunningJob(j, (TaskBinding("g0", 0, "n1", (gpu,), 1000),), 0.0)


def session_of(run: list[RunningJob], blocked: Job) -> Session:
    snap = snapshot_of(cluster(node("n1").gpus(8)), run, TREE)
    return Session(snap, preset("priority"), 0.0, pending(blocked))


def test_a_job_claims_its_own_queues_guarantee_first_then_the_nearest_above_with_room() -> None:
    two = job("t").task(gpu=2).queue("team").build()
    assert guarantee_claim(session_of([], two), two) == ("team", two)
    # team holds its 2: org has 2 left, which team's job may claim.
    full = [one_gpu(f"m{i}", "team", i) for i in range(2)]
    assert guarantee_claim(session_of(full, two), two) == ("org", two)
    # train has no guarantee: org's is its to claim; not once org is full.
    mine = job("x").task(gpu=2).queue("train").build()
    assert guarantee_claim(session_of([], mine), mine) == ("org", mine)
    org_full = [one_gpu(f"m{i}", "team", i) for i in range(4)]
    assert guarantee_claim(session_of(org_full, mine), mine) is None
    # A queue with no guarantee on its path claims none.
    other = job("s").task(gpu=1).queue("scratch").build()
    assert guarantee_claim(session_of([], other), other) is None


def test_an_elastic_job_claims_as_many_tasks_as_the_guarantee_holds() -> None:
    el = job("e").task(6, gpu=1).min_available(1).elastic().queue("train").build()
    claim = guarantee_claim(session_of([one_gpu("m0", "team", 0)], el), el)
    assert claim is not None
    assert (claim[0], claim[1].num_tasks) == ("org", 3)


def test_a_childs_work_within_its_parents_guarantee_is_not_borrowed() -> None:
    """train (no guarantee) runs 5 GPUs of org's 4: one is borrowed, whoever reclaims; the
    queues of the reclaiming one's path are not judged (its job refills them)."""
    run = [one_gpu(f"t{i}", "train", i) for i in range(5)]
    s = session_of(run, job("b").task(gpu=1).build())
    gpu = (0.0, 0.0, 1000.0)
    assert borrowed(s, "train", gpu)
    assert not borrowed(s, "train", (0.0, 0.0, 2000.0))
    assert borrowed(s, "train", (0.0, 0.0, 2000.0), spared=("org", "team"))
    assert borrowed(s, "train", ZERO)
    cuts = [Cut(r) for r in run]
    assert keeping_guarantees(s, cuts) == cuts[:1]
    assert keeping_guarantees(s, cuts, spared=("org", "team")) == cuts


def test_one_whole_job_holding_what_its_queue_borrowed_may_take_it_below_its_guarantee() -> None:
    """org (guaranteed 4) holds 5 in train: a whole job of 2 GPUs holds the borrowed one and
    may go, org then at 3; nothing more after it, whole or not."""
    run = [one_gpu(f"t{i}", "train", i) for i in range(5)]
    s = session_of(run, job("b").task(gpu=1).build())
    two = (0.0, 0.0, 2000.0)
    assert not borrowed(s, "train", two)
    assert borrowed(s, "train", two, whole=True)
    at_guarantee = session_of(run[:4], job("b").task(gpu=1).build())
    assert not borrowed(at_guarantee, "train", (0.0, 0.0, 1000.0), whole=True)
    cuts = [Cut(r) for r in run]
    assert keeping_guarantees(s, cuts) == cuts[:1]


def test_the_borrowed_amount_shown_per_queue_is_what_reclaim_may_take() -> None:
    """The dashboard said a queue's borrowed GPUs were its usage above its own guarantee: train
    (none of its own) showed all 5 it runs as borrowed, where reclaim may take 4 of them, org
    (guaranteed 4, holding 8) keeping its 4."""
    run = [
        *(one_gpu(f"t{i}", "train", i) for i in range(5)),
        one_gpu("m0", "team", 5),
        *(one_gpu(f"s{i}", "scratch", 6 + i) for i in range(2)),
    ]
    s = session_of(run, job("b").task(gpu=1).build())
    by_user = {(r.job.queue, r.job.user): ZERO for r in run}
    for r in run:
        key = (r.job.queue, r.job.user)
        by_user[key] = (0.0, 0.0, by_user[key][2] + 1000.0)
    used = usage_along_paths(TREE, by_user)
    assert {q: u[2] / 1000 for q, u in used.items()} == {
        "org": 6.0,
        "train": 5.0,
        "team": 1.0,
        "scratch": 2.0,
    }
    shown = {q: b[2] / 1000 for q, b in borrowed_usage(TREE, used).items()}
    # org holds 6 of its 4; team is within its own 2; scratch has no guarantee on its path.
    assert shown == {"org": 2.0, "team": 0.0, "train": 2.0, "scratch": 2.0}
    for q, gpus in shown.items():
        # Reclaim may take that much and, short of all the queue runs, not one GPU more.
        assert borrowed(s, q, (0.0, 0.0, gpus * 1000)) or gpus == 0
        if gpus < used[q][2] / 1000:
            assert not borrowed(s, q, (0.0, 0.0, (gpus + 1) * 1000))

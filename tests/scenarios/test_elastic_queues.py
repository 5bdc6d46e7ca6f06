"""Scenario table for elastic jobs under queue limits: a job that may start with fewer tasks
(`min_available`) is charged for the tasks placed, so it starts with as many as its queue and
the cluster take, at least its minimum, its last tasks left out; it waits for its queue only
when not even its minimum fits there. Reclaim judges such a job the same way: it takes back
room for as many of its tasks as its queue's guarantee holds, at least its minimum."""

from __future__ import annotations

import pytest
from helpers import QueueCase, check_queue_case, running

from aisched.core.cycle import never_runs, run_cycle
from aisched.core.policy import preset
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import JobBuilder, cluster, job, node

QUEUES = QueueTree(
    (
        Queue("default"),
        Queue("capped", limit=Resources(gpu=4)),
        Queue("strict", guarantee=Resources(gpu=3), borrowing=False),
        Queue("org", limit=Resources(gpu=5)),
        Queue("team", parent="org"),
        Queue("owned", guarantee=Resources(gpu=4)),
    )
)


def el(name: str, tasks: int, min_tasks: int, queue: str, gpu: int = 1) -> JobBuilder:
    return job(name).task(tasks, gpu=gpu).min_available(min_tasks).elastic().queue(queue)


def holding(
    name: str, gpus: int, queue: str, first: int = 0, end_s: float | None = None
) -> RunningJob:
    """A running one-task job of `queue` on n1's GPUs `first`.. `first + gpus - 1`."""
    held = tuple(range(first, first + gpus))
    built = job(name).task(gpu=gpus).queue(queue).build()
    return running(built, ("n1", held), expected_end_s=end_s)


CASES = [
    QueueCase(
        "an elastic job whose maximum is above its queue's limit starts at the limit",
        [el("e", 8, 2, "capped")],
        [("bind", "e", "n1:0", "n1:1", "n1:2", "n1:3")],
        {"e": StatusCode.PLACED},
    ),
    QueueCase(
        "an elastic job takes what its queue has left, above its minimum",
        [el("e", 4, 1, "capped")],
        [("bind", "e", "n1:2", "n1:3")],
        {"e": StatusCode.PLACED},
        [holding("r", 2, "capped")],
    ),
    QueueCase(
        "an elastic job waits for its queue when not even its minimum fits",
        [el("e", 4, 2, "capped")],
        [],
        {"e": StatusCode.WAIT_QUEUE},
        [holding("r", 3, "capped")],
    ),
    QueueCase(
        "the queue and the cluster both bound the start: the smaller holds",
        [el("e", 4, 1, "capped", gpu=2)],
        [("bind", "e", "n1:4,5")],
        {"e": StatusCode.PLACED},
        [holding("r", 2, "capped"), holding("o", 2, "default", first=2)],
        gpus=6,
    ),
    QueueCase(
        "a queue that may not borrow takes an elastic job up to its guarantee",
        [el("e", 4, 1, "strict")],
        [("bind", "e", "n1:0", "n1:1", "n1:2")],
        {"e": StatusCode.PLACED},
    ),
    QueueCase(
        "a parent queue's limit cuts a child queue's elastic job",
        [el("e", 4, 1, "team")],
        [("bind", "e", "n1:4")],
        {"e": StatusCode.PLACED},
        [holding("r", 4, "org")],
    ),
    QueueCase(
        "a job behind a cut elastic job sees the queue as the cut job left it",
        [el("e", 4, 1, "capped"), job("w").task(gpu=1).queue("capped").submitted(1)],
        [("bind", "e", "n1:1", "n1:2", "n1:3")],
        {"e": StatusCode.PLACED, "w": StatusCode.WAIT_QUEUE},
        [holding("r", 1, "capped")],
    ),
    QueueCase(
        "with backfill, a blocked head job does not keep a cut elastic job from its holes",
        [job("big").task(gpu=8), el("e", 4, 1, "capped").time_limit(10).submitted(1)],
        [("reserve", "big", "n1"), ("bind", "e", "n1:2", "n1:3")],
        {"big": StatusCode.RESERVED, "e": StatusCode.PLACED},
        [holding("r", 2, "capped", end_s=100)],
        policy="fifo-backfill",
    ),
    QueueCase(
        "an elastic job larger than its queue's guarantee reclaims room for its minimum",
        [el("e", 8, 2, "owned")],
        [("preempt", "d0", "e"), ("preempt", "d1", "e"), ("bind", "e", "n1:0", "n1:1")],
        {"e": StatusCode.PREEMPTING},
        [holding(f"d{i}", 1, "default", first=i) for i in range(8)],
        policy="priority",
    ),
    QueueCase(
        "an elastic job reclaiming takes no more tasks than its queue's guarantee holds",
        [el("e", 8, 1, "owned")],
        [("preempt", "d", "e"), ("bind", "e", "n1:2", "n1:3")],
        {"e": StatusCode.PREEMPTING},
        [holding("o", 2, "owned"), holding("d", 6, "default", first=2)],
        policy="priority",
    ),
    QueueCase(
        "an elastic job whose minimum is above what its guarantee has left reclaims nothing",
        [el("e", 8, 2, "owned")],
        [],
        {"e": StatusCode.WAIT_RESOURCES},
        [holding("o", 3, "owned")] + [holding(f"d{i}", 1, "default", first=i) for i in range(3, 8)],
        policy="priority",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_elastic_queue_scenarios(case: QueueCase) -> None:
    check_queue_case(case, QUEUES)


def test_the_cut_job_keeps_its_first_tasks_and_the_queue_counts_them() -> None:
    snap = snapshot_of(cluster(node("n1").gpus(8)), [holding("r", 1, "capped")], QUEUES)
    pj = el("e", 6, 2, "capped").pending()
    result = run_cycle(snap, [pj], preset("fifo"), 0.0, validate=True)
    (bind,) = result.binds
    assert [(t.group, t.index) for t in bind.tasks] == [("g0", 0), ("g0", 1), ("g0", 2)]
    # The next cycle counts the three tasks running, not the six asked for: one more 1-GPU
    # job of the queue still waits, since the queue is at its limit.
    after = snapshot_of(
        cluster(node("n1").gpus(8)),
        [holding("r", 1, "capped"), RunningJob(pj.job, bind.tasks, 0.0)],
        QUEUES,
    )
    late = job("late").task(gpu=1).queue("capped").pending()
    again = run_cycle(after, [late], preset("fifo"), 1.0, validate=True)
    assert again.binds == ()
    assert again.diagnostics["late"].reason == "queue capped would exceed its GPU limit"


def test_an_elastic_job_is_refused_only_when_its_minimum_is_above_the_limit() -> None:
    snap = snapshot_of(cluster(node("n1").gpus(8)), (), QUEUES)
    policy = preset("fifo")
    assert never_runs(snap, policy, el("e", 8, 4, "capped").build()) is None
    assert never_runs(snap, policy, el("e", 8, 5, "capped").build()) == (
        "needs more GPU than queue capped's limit"
    )

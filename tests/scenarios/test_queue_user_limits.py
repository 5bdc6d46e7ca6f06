"""Scenario table for a queue's per-user limit (`user_limit`, Slurm's QOS MaxTRESPerUser):
what one user's running jobs in a queue, and the queues under it, may hold together. A job
that would take its user past it waits for its queue (naming the queue, the user and the
resource) while other users' jobs go on; an elastic job starts cut to what its user has left;
a job held by its own user's limit evicts nobody."""

from __future__ import annotations

import pytest
from helpers import QueueCase, check_queue_case, running

from aisched.core.cycle import never_runs, run_cycle
from aisched.core.policy import preset
from aisched.core.queues import tasks_to_regrow
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import JobBuilder, cluster, job, node

QUEUES = QueueTree(
    (
        Queue("default"),
        Queue("team", user_limit=Resources(gpu=2)),
        Queue("org", user_limit=Resources(gpu=2)),
        Queue("a", parent="org"),
        Queue("b", parent="org"),
        Queue("owned", guarantee=Resources(gpu=4), user_limit=Resources(gpu=2)),
    )
)


def one(name: str, user: str, queue: str = "team", gpu: int = 1) -> JobBuilder:
    return job(name).task(gpu=gpu).queue(queue).user(user)


def holding(name: str, user: str, gpus: int, queue: str = "team", first: int = 0) -> RunningJob:
    """A running one-task job of `user` in `queue` on n1's GPUs `first`.. `first + gpus - 1`."""
    built = job(name).task(gpu=gpus).queue(queue).user(user).priority(0).build()
    return running(built, ("n1", tuple(range(first, first + gpus))))


CASES = [
    QueueCase(
        "a user at the limit waits while another user of the queue starts",
        [one("a3", "alice").submitted(0), one("b1", "bob").submitted(1)],
        [("bind", "b1", "n1:2")],
        {"a3": StatusCode.WAIT_QUEUE, "b1": StatusCode.PLACED},
        [holding("a1", "alice", 2)],
    ),
    QueueCase(
        "the jobs bound in one cycle count against their user's limit",
        [one("a1", "alice"), one("a2", "alice").submitted(1), one("a3", "alice").submitted(2)],
        [("bind", "a1", "n1:0"), ("bind", "a2", "n1:1")],
        {"a3": StatusCode.WAIT_QUEUE},
    ),
    QueueCase(
        "an elastic job starts cut to what its user has left",
        [job("e").task(4, gpu=1).min_available(1).elastic().queue("team").user("alice")],
        [("bind", "e", "n1:1")],
        {"e": StatusCode.PLACED},
        [holding("a1", "alice", 1)],
    ),
    QueueCase(
        "an elastic job waits when not even its minimum fits under its user's limit",
        [job("e").task(4, gpu=1).min_available(2).elastic().queue("team").user("alice")],
        [],
        {"e": StatusCode.WAIT_QUEUE},
        [holding("a1", "alice", 1)],
    ),
    QueueCase(
        "a parent queue's user limit counts the user's jobs in every queue under it",
        [one("x", "alice", "b"), one("y", "bob", "b").submitted(1)],
        [("bind", "y", "n1:2")],
        {"x": StatusCode.WAIT_QUEUE},
        [holding("a1", "alice", 2, "a")],
    ),
    QueueCase(
        "the limit is per queue: the same user may still run in another queue",
        [one("x", "alice", "default")],
        [("bind", "x", "n1:2")],
        {"x": StatusCode.PLACED},
        [holding("a1", "alice", 2)],
    ),
    QueueCase(
        "a high-priority job held by its own user's limit preempts nobody",
        [one("hi", "alice").priority(10)],
        [],
        {"hi": StatusCode.WAIT_QUEUE},
        [holding("a1", "alice", 2), holding("b1", "bob", 2, first=2)],
        policy="priority",
        gpus=4,
    ),
    QueueCase(
        "a job within its queue's guarantee but held by its user's limit reclaims nothing",
        [one("x", "alice", "owned")],
        [],
        {"x": StatusCode.WAIT_QUEUE},
        [holding("a1", "alice", 2, "owned"), holding("d1", "dave", 2, "default", first=2)],
        policy="priority",
        gpus=4,
    ),
    QueueCase(
        "a job within its user's limit still preempts a lower-priority job of its queue",
        [one("hi", "bob").priority(10)],
        [("preempt", "a1", "hi"), ("bind", "hi", "n1:0")],
        {"hi": StatusCode.PREEMPTING},
        [
            holding("a1", "alice", 2),
            holding("b1", "bob", 1, first=2),
            holding("c", "carol", 1, first=3),
        ],
        policy="priority",
        gpus=4,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_user_limit_scenarios(case: QueueCase) -> None:
    check_queue_case(case, QUEUES)


def test_the_wait_reason_names_the_queue_the_user_and_the_resource() -> None:
    snap = snapshot_of(cluster(node("n1").gpus(8)), [holding("a1", "alice", 2, "a")], QUEUES)
    result = run_cycle(snap, [one("x", "alice", "b").pending()], preset("fifo"), 0.0)
    assert (
        result.diagnostics["x"].reason == "user alice would exceed queue org's per-user GPU limit"
    )


def test_a_job_whose_minimum_alone_is_above_the_user_limit_is_refused() -> None:
    snap = snapshot_of(cluster(node("n1").gpus(8)), (), QUEUES)
    policy = preset("fifo")
    assert never_runs(snap, policy, one("x", "alice", gpu=3).build()) == (
        "needs more GPU than queue team's per-user limit"
    )
    elastic = job("e").task(8, gpu=1).min_available(2).elastic().queue("team").user("alice")
    assert never_runs(snap, policy, elastic.build()) is None


def test_an_elastic_job_regrows_only_within_its_users_limit() -> None:
    # Alice's elastic job holds 1 task of 4 and her other job 1 GPU: given back, her limit of
    # 2 takes it back with 1 task only (no grow); bob's jobs in the queue do not count.
    el = job("e").task(4, gpu=1).min_available(1).elastic().queue("team").user("alice").build()
    mine = running(el, ("n1", (0,)))
    held = [mine, holding("a1", "alice", 1, first=1), holding("b1", "bob", 2, first=2)]
    n1 = cluster(node("n1").gpus(8))
    assert tasks_to_regrow(snapshot_of(n1, held, QUEUES), mine) == 1
    alone = [mine, holding("b1", "bob", 2, first=2)]
    assert tasks_to_regrow(snapshot_of(n1, alone, QUEUES), mine) == 2

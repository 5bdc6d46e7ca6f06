"""Scenario table for shrinking elastic jobs: before preempt (or reclaim) evicts anyone for a
blocked job, running elastic jobs of equal or lower priority give up their tasks above
`min_available`; whole jobs are evicted only when that is not enough."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from helpers import running, summary

from aisched.core.cycle import run_cycle
from aisched.core.policy import preset
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.model.queue import Queue, QueueTree
from aisched.testing import JobBuilder, NodeBuilder, cluster, job, node


@dataclass
class Case:
    name: str
    nodes: list[NodeBuilder]
    jobs: list[JobBuilder]
    running: list[RunningJob]
    want: list[tuple[str, ...]]
    want_status: dict[str, StatusCode] = field(default_factory=dict)
    policy: str = "priority"
    queues: QueueTree = field(default_factory=QueueTree)


def at(n: int, node_name: str = "n1", per: int = 2, first: int = 0) -> list[tuple[str, tuple]]:
    """`n` placements of `per` GPUs each on one node, from GPU `first` on."""
    return [(node_name, tuple(range(first + i * per, first + (i + 1) * per))) for i in range(n)]


def el(name: str, tasks: int, min_tasks: int, priority: int, queue: str = "default") -> JobBuilder:
    return (
        job(name)
        .task(tasks, gpu=2)
        .min_available(min_tasks)
        .elastic()
        .priority(priority)
        .queue(queue)
    )


CASES = [
    Case(
        "an elastic job at its max shrinks for an equal-priority job instead of being evicted",
        [node("n1").gpus(8)],
        [job("new").task(gpu=4).priority(5)],
        [running(el("el", 4, 1, 5).build(), *at(4))],
        [("shrink", "el", "new", "n1:0,1", "n1:2,3"), ("bind", "new", "n1:4,5,6,7")],
        {"new": StatusCode.PREEMPTING},
    ),
    Case(
        "a higher-priority job shrinks a lower-priority elastic job rather than evict it",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=2).priority(10)],
        [running(el("el", 4, 1, 1).build(), *at(4))],
        [("shrink", "el", "hi", "n1:0,1", "n1:2,3", "n1:4,5"), ("bind", "hi", "n1:6,7")],
        {"hi": StatusCode.PREEMPTING},
    ),
    Case(
        "shrinking is preferred to evicting a lower-priority job that would free as much",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=2).priority(10)],
        [
            running(el("el", 3, 1, 5).build(), *at(3)),
            running(job("lo").task(gpu=2).priority(0).build(), *at(1, first=6)),
        ],
        [("shrink", "el", "hi", "n1:0,1", "n1:2,3"), ("bind", "hi", "n1:4,5")],
    ),
    Case(
        "shrinking is not enough: shrink, then evict the lowest-priority job",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=4).priority(10)],
        [
            running(el("el", 3, 2, 1).build(), *at(3)),
            running(job("lo").task(gpu=2).priority(0).build(), *at(1, first=6)),
        ],
        [
            ("preempt", "lo", "hi"),
            ("shrink", "el", "hi", "n1:0,1", "n1:2,3"),
            ("bind", "hi", "n1:4,5,6,7"),
        ],
        {"hi": StatusCode.PREEMPTING},
    ),
    Case(
        "never below min_available: an equal-priority job waits",
        [node("n1").gpus(8)],
        [job("eq").task(gpu=4).priority(5)],
        [running(el("el", 4, 3, 5).build(), *at(4))],
        [],
        {"eq": StatusCode.WAIT_RESOURCES},
    ),
    Case(
        "never below min_available: a higher-priority job evicts the elastic job whole",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=4).priority(10)],
        [running(el("el", 4, 3, 1).build(), *at(4))],
        [("preempt", "el", "hi"), ("bind", "hi", "n1:0,1,2,3")],
        {"hi": StatusCode.PREEMPTING},
    ),
    Case(
        "an elastic job already at its minimum is not shrunk",
        [node("n1").gpus(8)],
        [job("eq").task(gpu=2).priority(5)],
        [running(el("el", 4, 4, 5).build(), *at(4))],
        [],
        {"eq": StatusCode.WAIT_RESOURCES},
    ),
    Case(
        "a higher-priority elastic job is not shrunk",
        [node("n1").gpus(8)],
        [job("lo").task(gpu=2).priority(1)],
        [running(el("el", 4, 1, 5).build(), *at(4))],
        [],
        {"lo": StatusCode.WAIT_RESOURCES},
    ),
    Case(
        "a non-elastic job of equal priority is neither shrunk nor evicted",
        [node("n1").gpus(8)],
        [job("eq").task(gpu=2).priority(5)],
        [running(job("gang").task(4, gpu=2).priority(5).build(), *at(4))],
        [],
        {"eq": StatusCode.WAIT_RESOURCES},
    ),
    Case(
        "a non-elastic lower-priority gang is evicted whole, never shrunk",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=2).priority(10)],
        [running(job("gang").task(4, gpu=2).priority(1).build(), *at(4))],
        [("preempt", "gang", "hi"), ("bind", "hi", "n1:0,1")],
        {"hi": StatusCode.PREEMPTING},
    ),
    Case(
        # a is first in victim order (lower priority), but shrinking it frees only two GPUs on
        # n1: the job goes to n2, and a is left alone.
        "only elastic jobs with a task on a node the placement uses are shrunk",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("new").task(gpu=4).priority(5)],
        [
            running(el("a", 4, 3, 1).build(), *at(4)),
            running(el("b", 4, 2, 2).build(), *at(4, "n2")),
        ],
        [("shrink", "b", "new", "n2:0,1", "n2:2,3"), ("bind", "new", "n2:4,5,6,7")],
        {"new": StatusCode.PREEMPTING},
    ),
    Case(
        "preempt shrinks only inside the job's queue",
        [node("n1").gpus(8)],
        [job("new").task(gpu=4).priority(5).queue("prod")],
        [running(el("el", 4, 1, 1, queue="research").build(), *at(4))],
        [],
        {"new": StatusCode.WAIT_RESOURCES},
        queues=QueueTree((Queue("research"), Queue("prod"))),
    ),
    Case(
        "a policy without preemption never shrinks",
        [node("n1").gpus(8)],
        [job("new").task(gpu=4).priority(5)],
        [running(el("el", 4, 1, 1).build(), *at(4))],
        [],
        {"new": StatusCode.WAIT_RESOURCES},
        policy="fifo",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_shrink_scenarios(case: Case) -> None:
    snap = snapshot_of(cluster(*case.nodes), case.running, case.queues)
    pending = [j.pending() for j in case.jobs]
    result = run_cycle(snap, pending, preset(case.policy), 0.0, validate=True)
    assert summary(result) == case.want
    got = {k: result.diagnostics[k].code for k in case.want_status}
    assert got == case.want_status
    for d in result.shrinks:
        r = next(r for r in case.running if r.id == d.job_id)
        assert r.job.gang_min <= d.tasks < len(r.tasks)


def test_the_beneficiary_says_whom_it_waits_for() -> None:
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [
            running(el("el", 3, 2, 1).build(), *at(3)),
            running(job("lo").task(gpu=2).priority(0).build(), *at(1, first=6)),
        ],
    )
    pj = job("hi").task(gpu=4).priority(10).pending()
    result = run_cycle(snap, [pj], preset("priority"), 0.0, validate=True)
    assert result.binds[0].after == ("lo", "el")
    assert result.diagnostics["hi"].reason == "placed after preempting lo and shrinking el"
    assert result.stats.shrunk == 1 and result.stats.preempted == 1
    assert result.shrinks[0].tasks == 2

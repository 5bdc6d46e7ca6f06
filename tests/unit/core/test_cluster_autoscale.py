"""Cluster autoscaling decisions: which pool grows by how much for the pending gangs, and which
idle nodes go. Scenario tables: pools and pending jobs in, the whole plan out."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from aisched.core.cluster_autoscale import (
    IdleNode,
    NodeFree,
    PoolState,
    ScaleUp,
    plan_scale_down,
    plan_scale_up,
)
from aisched.model.cluster import NodePool, TopologyLevel
from aisched.model.job import Job
from aisched.testing import job, node
from aisched.testing.builders import JobBuilder


def pool(
    name: str,
    gpus: int = 8,
    *,
    max_nodes: int = 4,
    min_nodes: int = 0,
    model: str = "A100",
    cpus: float = 64,
    cost: float | None = None,
    idle_s: float = 600.0,
) -> NodePool:
    template = node(name).gpus(gpus, model=model).cpus(cpus).mem_gib(512).build()
    return NodePool(
        name,
        template,
        max_nodes=max_nodes,
        min_nodes=min_nodes,
        scale_down_idle_s=idle_s,
        cost_per_node_hour=cost,
    )


A8 = pool("a8")  # 8-GPU nodes, at most 4
S2 = pool("s2", gpus=2, max_nodes=8)  # 2-GPU nodes, at most 8


def g(job_id: str, tasks: int, gpu: int) -> JobBuilder:
    return job(job_id).gang(tasks, gpu=gpu, cpu=4, mem_gib=16)


@dataclass(frozen=True)
class Case:
    name: str
    pools: tuple[PoolState, ...]
    jobs: tuple[Job, ...]
    want: tuple[ScaleUp, ...]
    want_unhelped: dict[str, str] = field(default_factory=dict)


SCALE_UP_CASES = [
    Case(
        "one 8-GPU gang of 2 tasks: two nodes",
        (PoolState(A8, nodes=0),),
        (g("j1", 2, 8).build(),),
        (ScaleUp("a8", 2, ("j1",)),),
    ),
    Case(
        "small jobs share a new node",
        (PoolState(A8, nodes=1),),
        (g("j1", 1, 4).build(), g("j2", 1, 2).build(), g("j3", 1, 2).build()),
        (ScaleUp("a8", 1, ("j1", "j2", "j3")),),
    ),
    Case(
        "nodes already provisioning serve the gang: nothing more",
        (PoolState(A8, nodes=0, provisioning=2),),
        (g("j1", 2, 8).build(),),
        (),
    ),
    Case(
        "provisioning nodes serve the first gang, the second gets new ones",
        (PoolState(A8, nodes=0, provisioning=1),),
        (g("j1", 1, 8).build(), g("j2", 1, 8).build()),
        (ScaleUp("a8", 1, ("j2",)),),
    ),
    Case(
        "max respected: the first gang takes the last nodes, the second waits",
        (PoolState(A8, nodes=2),),
        (g("j1", 2, 8).build(), g("j2", 2, 8).build()),
        (ScaleUp("a8", 2, ("j1",)),),
        {"j2": "every node pool that could hold it is at its maximum"},
    ),
    Case(
        "a pool at its maximum adds nothing",
        (PoolState(A8, nodes=4),),
        (g("j1", 1, 1).build(),),
        (),
        {"j1": "every node pool is at its maximum"},
    ),
    Case(
        "a gang bigger than the pool at max: no growth at all",
        (PoolState(A8, nodes=0),),
        (g("huge", 5, 8).build(),),
        (),
        {"huge": "larger than any node pool can hold at its maximum"},
    ),
    Case(
        "a task bigger than the template: no growth",
        (PoolState(A8, nodes=0),),
        (g("wide", 1, 16).build(),),
        (),
        {"wide": "larger than any node pool can hold at its maximum"},
    ),
    Case(
        "a too-big gang does not stop the jobs after it",
        (PoolState(A8, nodes=0),),
        (g("huge", 5, 8).build(), g("j2", 1, 8).build()),
        (ScaleUp("a8", 1, ("j2",)),),
        {"huge": "larger than any node pool can hold at its maximum"},
    ),
    Case(
        "without costs the smallest node that fits: 2-GPU nodes for a 2-GPU job",
        (PoolState(A8, nodes=0), PoolState(S2, nodes=0)),
        (g("j1", 1, 2).build(),),
        (ScaleUp("s2", 1, ("j1",)),),
    ),
    Case(
        "an 8-GPU task only fits the 8-GPU pool",
        (PoolState(A8, nodes=0), PoolState(S2, nodes=0)),
        (g("j1", 1, 8).build(),),
        (ScaleUp("a8", 1, ("j1",)),),
    ),
    Case(
        "with costs the cheapest: one 8-GPU node (3/h) beats four 2-GPU nodes (4 x 1/h)",
        (PoolState(pool("a8", cost=3.0), nodes=0), PoolState(pool("s2", 2, cost=1.0), nodes=0)),
        (g("j1", 4, 2).build(),),
        (ScaleUp("a8", 1, ("j1",)),),
    ),
    Case(
        "with costs the cheapest: a 2-GPU node (1/h) for a 2-GPU job",
        (PoolState(pool("a8", cost=3.0), nodes=0), PoolState(pool("s2", 2, cost=1.0), nodes=0)),
        (g("j1", 1, 2).build(),),
        (ScaleUp("s2", 1, ("j1",)),),
    ),
    Case(
        "GPU model required: only the pool of that model",
        (PoolState(A8, nodes=0), PoolState(pool("v8", model="V100"), nodes=0)),
        (g("j1", 1, 1).models("V100").build(),),
        (ScaleUp("v8", 1, ("j1",)),),
    ),
    Case(
        "GPU model no pool has: nothing",
        (PoolState(A8, nodes=0),),
        (g("j1", 1, 1).models("H100").build(),),
        (),
        {"j1": "no node pool has GPU model H100"},
    ),
    Case(
        "must pack on one node: one node for two 4-GPU tasks",
        (PoolState(A8, nodes=0),),
        (g("j1", 2, 4).pack(TopologyLevel.NODE).build(),),
        (ScaleUp("a8", 1, ("j1",)),),
    ),
    Case(
        "spread over nodes: one node per task",
        (PoolState(A8, nodes=0),),
        (g("j1", 3, 1).spread(TopologyLevel.NODE).build(),),
        (ScaleUp("a8", 3, ("j1",)),),
    ),
    Case(
        "min_available: only the tasks that must start together",
        (PoolState(A8, nodes=0),),
        (g("j1", 4, 8).min_available(2).build(),),
        (ScaleUp("a8", 2, ("j1",)),),
    ),
    Case(
        "CPU memory, not GPUs, is what runs out",
        (PoolState(pool("c", gpus=0, cpus=8, max_nodes=10), nodes=0),),
        (job("j1").gang(5, cpu=3, mem_gib=1).build(),),
        (ScaleUp("c", 3, ("j1",)),),
    ),
    Case(
        "free room on a present node counts: a 2-node gang next to a free node asks for one",
        (PoolState(A8, nodes=1, free=(NodeFree(64_000, 512 * 1024, (1000,) * 8, (0,) * 8),)),),
        (g("j1", 2, 8).build(),),
        (ScaleUp("a8", 1, ("j1",)),),
    ),
    Case(
        "a half-full present node takes the 4-GPU job, the 8-GPU one needs a node",
        (PoolState(A8, nodes=1, free=(NodeFree(8_000, 64 * 1024, (1000,) * 4, (0,) * 4),)),),
        (g("j1", 1, 8).build(), g("j2", 1, 4).build()),
        (ScaleUp("a8", 1, ("j1",)),),
    ),
    Case("nothing pending, nothing added", (PoolState(A8, nodes=0),), (), ()),
]


@pytest.mark.parametrize("case", SCALE_UP_CASES, ids=lambda c: c.name)
def test_scale_up(case: Case) -> None:
    plan = plan_scale_up(case.jobs, case.pools)
    assert plan.scale_ups == case.want
    assert dict(plan.unhelped) == case.want_unhelped


def test_repeated_plans_for_a_too_big_gang_never_grow_the_pool() -> None:
    # The caller asks again every cycle; growth must stop at what the gang could ever use.
    huge = g("huge", 5, 8).build()
    state = PoolState(A8, nodes=0)
    for _ in range(10):
        plan = plan_scale_up((huge,), (state,))
        state = PoolState(A8, nodes=state.nodes + state.provisioning, provisioning=plan.count("a8"))
    assert state.nodes + state.provisioning == 0


def test_repeated_plans_for_one_gang_ask_once() -> None:
    gang = g("j1", 2, 8).build()
    state = PoolState(A8, nodes=0)
    asked = []
    for _ in range(5):
        plan = plan_scale_up((gang,), (state,))
        asked.append(plan.count("a8"))
        state = PoolState(A8, nodes=0, provisioning=state.provisioning + plan.count("a8"))
    assert asked == [2, 0, 0, 0, 0]


@dataclass(frozen=True)
class DownCase:
    name: str
    pools: tuple[PoolState, ...]
    idle: tuple[IdleNode, ...]
    now: float
    want: tuple[str, ...]


IDLE_A8 = pool("a8", idle_s=600.0, min_nodes=1)

SCALE_DOWN_CASES = [
    DownCase(
        "idle for the idle time: removed",
        (PoolState(IDLE_A8, nodes=3),),
        (IdleNode("a8-0002", "a8", 100.0),),
        700.0,
        ("a8-0002",),
    ),
    DownCase(
        "idle for less: kept",
        (PoolState(IDLE_A8, nodes=3),),
        (IdleNode("a8-0002", "a8", 100.0),),
        699.0,
        (),
    ),
    DownCase(
        "min kept: of three idle nodes two go, the longest idle first",
        (PoolState(IDLE_A8, nodes=3),),
        (
            IdleNode("a8-0000", "a8", 50.0),
            IdleNode("a8-0001", "a8", 0.0),
            IdleNode("a8-0002", "a8", 10.0),
        ),
        1000.0,
        ("a8-0001", "a8-0002"),
    ),
    DownCase(
        "at min: nothing goes however long it idles",
        (PoolState(IDLE_A8, nodes=1),),
        (IdleNode("a8-0000", "a8", 0.0),),
        1e9,
        (),
    ),
    DownCase(
        "provisioning nodes do not count towards the min",
        (PoolState(IDLE_A8, nodes=1, provisioning=3),),
        (IdleNode("a8-0000", "a8", 0.0),),
        1e9,
        (),
    ),
    DownCase(
        "each pool its own idle time",
        (PoolState(IDLE_A8, nodes=2), PoolState(pool("s2", 2, idle_s=60.0), nodes=1)),
        (IdleNode("a8-0001", "a8", 0.0), IdleNode("s2-0000", "s2", 0.0)),
        100.0,
        ("s2-0000",),
    ),
]


@pytest.mark.parametrize("case", SCALE_DOWN_CASES, ids=lambda c: c.name)
def test_scale_down(case: DownCase) -> None:
    assert plan_scale_down(case.idle, case.pools, case.now) == case.want

"""Autoscaling node pools in the simulator: nodes asked for when gangs wait, joining after the
provisioning delay, removed after the idle time (never below min), and node-hours reported for
autoscaled and fixed clusters alike."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from aisched.core.policy import load_policy
from aisched.model.cluster import Cluster, NodePool
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import Trace, TraceJob, synthetic_trace
from aisched.testing import job, node

VALIDATE = SimConfig(validate=True)


def pool(
    *,
    max_nodes: int = 4,
    min_nodes: int = 0,
    delay_s: float = 100.0,
    idle_s: float = 300.0,
    cost: float | None = None,
    gpus: int = 8,
) -> NodePool:
    template = node("gpu").gpus(gpus, model="A100").cpus(64).mem_gib(512).rack("gpu-rack").build()
    return NodePool(
        "gpu",
        template,
        max_nodes=max_nodes,
        min_nodes=min_nodes,
        provisioning_delay_s=delay_s,
        scale_down_idle_s=idle_s,
        cost_per_node_hour=cost,
    )


def autoscaled(p: NodePool) -> Cluster:
    return Cluster(tuple(p.node(i) for i in range(p.min_nodes)), node_pools=(p,))


def gang(job_id: str, submit: float, duration: float, tasks: int = 1, gpus: int = 8) -> TraceJob:
    b = job(job_id).gang(tasks, gpu=gpus, cpu=4, mem_gib=16).submitted(submit)
    return TraceJob(b.build(), duration)


def run(jobs: Sequence[TraceJob], c: Cluster, config: SimConfig = VALIDATE) -> SimResult:
    return simulate(Trace("t", tuple(jobs)), c, load_policy("fifo"), config)


def test_a_gang_gets_nodes_after_the_delay_and_they_go_after_the_idle_time() -> None:
    r = run([gang("j1", 0.0, 1000.0, tasks=2)], autoscaled(pool()))
    assert r.log == (
        (0.0, "scale-up", "gpu", ("gpu-0000", "gpu-0001")),
        (100.0, "join", "gpu-0000", ()),
        (100.0, "join", "gpu-0001", ()),
        (100.0, "bind", "j1", ("gpu-0000", "gpu-0001")),
        (1100.0, "finish", "j1", ()),
    )
    m = compute_metrics(r)
    assert m.jobs_finished == 1 and m.jobs_rejected == 0
    # Billed from the request at 0 to the end of the window (the last finish): 2 × 1100 s.
    assert m.node_hours == pytest.approx(2 * 1100 / 3600)
    assert (m.peak_nodes, m.nodes_added) == (2, 2)
    # Utilisation counts only the GPUs present: 16 GPUs busy for 1000 of their 1000 s.
    assert m.gpu_utilisation == pytest.approx(1.0)


def test_idle_nodes_are_removed_and_the_min_is_kept() -> None:
    # Two jobs far apart: the pool shrinks to its minimum of 1 in between, then grows again.
    p = pool(min_nodes=1, idle_s=300.0)
    r = run([gang("a", 0.0, 500.0, tasks=2), gang("b", 5000.0, 500.0, tasks=2)], autoscaled(p))
    kinds = [(t, k, j) for t, k, j, _ in r.log]
    assert kinds == [
        (0.0, "scale-up", "gpu"),  # one more node: the min node holds one task
        (100.0, "join", "gpu-0001"),
        (100.0, "bind", "a"),
        (600.0, "finish", "a"),
        (900.0, "remove", "gpu-0000"),  # both idle since 600 (gpu-0000 longest by name): one goes
        (5000.0, "scale-up", "gpu"),
        (5100.0, "join", "gpu-0002"),
        (5100.0, "bind", "b"),
        (5600.0, "finish", "b"),
    ]
    m = compute_metrics(r)
    assert (m.nodes_added, m.nodes_removed, m.jobs_finished) == (2, 1, 2)
    # Nodes billed: 1 on [0, 0] then 2 until 900, 1 until 5000, 2 until 5600.
    assert m.node_hours == pytest.approx((2 * 900 + 1 * 4100 + 2 * 600) / 3600)


def test_min_nodes_are_there_from_the_start_and_never_removed() -> None:
    p = pool(min_nodes=2, idle_s=10.0)
    r = run([gang("a", 0.0, 100.0), gang("b", 1000.0, 100.0)], autoscaled(p))
    assert [k for _, k, _, _ in r.log] == ["bind", "finish", "bind", "finish"]
    m = compute_metrics(r)
    assert (m.nodes_added, m.nodes_removed) == (0, 0)
    assert m.node_hours == pytest.approx(2 * 1100 / 3600)


def test_a_gang_too_big_for_the_pool_at_max_is_rejected_and_adds_nothing() -> None:
    r = run([gang("huge", 0.0, 100.0, tasks=5), gang("ok", 10.0, 100.0)], autoscaled(pool()))
    huge = next(j for j in r.jobs if j.job_id == "huge")
    assert huge.rejected is not None and "never fit" in huge.rejected
    assert [k for _, k, _, _ in r.log] == ["reject", "scale-up", "join", "bind", "finish"]
    assert r.log[1][3] == ("gpu-0000",)


def test_max_is_respected_while_gangs_queue() -> None:
    jobs = [gang(f"j{i}", 0.0, 1000.0, tasks=2) for i in range(4)]
    r = run(jobs, autoscaled(pool(max_nodes=4)))
    m = compute_metrics(r)
    assert m.jobs_finished == 4
    assert m.peak_nodes == 4
    assert m.nodes_added == 4  # the last two gangs run on the nodes the first two leave


def test_cost_is_node_hours_times_the_price() -> None:
    r = run([gang("j1", 0.0, 3500.0)], autoscaled(pool(cost=2.5)))
    m = compute_metrics(r)
    assert m.node_hours == pytest.approx(1.0)
    assert m.cost == pytest.approx(2.5)


def test_a_fixed_cluster_reports_its_node_hours_too() -> None:
    c = Cluster((node("n1").gpus(8).build(), node("n2").gpus(8).build()))
    m = compute_metrics(run([gang("j1", 100.0, 3600.0)], c))
    assert m.node_hours == pytest.approx(2.0)
    assert m.cost is None and m.peak_nodes == 2 and m.nodes_added == 0


def test_an_autoscaled_cluster_finishes_a_trace_with_fewer_node_hours_than_fixed_at_max() -> None:
    # A bursty trace: the autoscaled pool follows the load, the fixed one pays for idle nodes.
    trace = synthetic_trace(200, seed=3)
    p = pool(max_nodes=8, delay_s=120.0, idle_s=600.0)
    auto = compute_metrics(simulate(trace, autoscaled(p), load_policy("fifo"), VALIDATE))
    fixed_cluster = autoscaled(p).at_max()
    fixed = compute_metrics(simulate(trace, fixed_cluster, load_policy("fifo"), VALIDATE))
    assert auto.jobs_finished == fixed.jobs_finished == len(trace)
    assert fixed.nodes_added == 0 and fixed.peak_nodes == 8
    assert auto.node_hours < 0.9 * fixed.node_hours
    assert auto.peak_nodes <= 8

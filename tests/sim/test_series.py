"""Plot series of a run: binned step functions, arrived demand, per-queue allocation."""

from __future__ import annotations

import numpy as np
import pytest

from aisched.core.policy import load_policy
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.metrics import allocated_gpu_s, compute_metrics
from aisched.sim.series import binned_mean, compute_series, step_from_changes
from aisched.sim.traces import Trace, TraceJob, synthetic_trace
from aisched.spec.cluster import resolve_cluster
from aisched.testing import cluster, job, node


def arr(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float64)


def test_binned_mean_weights_each_value_by_how_long_it_held() -> None:
    got = binned_mean(arr(0, 10), arr(2, 0), arr(0, 5, 10, 20))
    assert got.tolist() == [2.0, 2.0, 0.0]
    spike = binned_mean(arr(0, 1, 2), arr(0, 4, 0), arr(0, 10))
    assert spike.tolist() == [pytest.approx(0.4)]
    before_and_after = binned_mean(arr(5), arr(3), arr(0, 5, 10, 15))
    assert before_and_after.tolist() == [0.0, 3.0, 3.0]


def test_step_from_changes_sums_the_changes_in_time_order() -> None:
    times, values = step_from_changes([(10.0, -2.0), (0.0, 2.0), (5.0, 1.0)])
    assert (times.tolist(), values.tolist()) == ([0.0, 5.0, 10.0], [2.0, 3.0, 1.0])


def tj(job_id: str, submit: float, duration: float, gpus: int, queue: str) -> TraceJob:
    return TraceJob(job(job_id).task(gpu=gpus).submitted(submit).queue(queue).build(), duration)


def test_two_queues_on_one_node_by_hand() -> None:
    # a (4 GPUs, q1) runs 0-100; b (8, q2) arrives at 10 and waits for the whole node until
    # 100; c (4, q1) arrives at 20 and fits beside a at once (its own queue's order): 20-70.
    trace = Trace(
        "t", (tj("a", 0, 100, 4, "q1"), tj("b", 10, 50, 8, "q2"), tj("c", 20, 50, 4, "q1"))
    )
    r = simulate(trace, cluster(node("n1").gpus(8)), load_policy("fifo"), SimConfig(validate=True))
    assert [(e[0], e[2]) for e in r.log if e[1] == "bind"] == [(0, "a"), (20, "c"), (100, "b")]
    s = compute_series(r, bins=15)  # bins of 10 s over [0, 150]
    assert s.bin_edges_s.tolist() == [10.0 * i for i in range(16)]
    assert s.allocated_gpus.tolist() == [4, 4, 8, 8, 8, 8, 8, 4, 4, 4, 8, 8, 8, 8, 8]
    # Arrived and unfinished: a; a+b; a+b+c; a+b once c ends; b alone once a ends.
    assert s.demand_gpus.tolist() == [4, 12, 16, 16, 16, 16, 16, 12, 12, 12, 8, 8, 8, 8, 8]
    assert s.pending_jobs.tolist() == [0] + [1] * 9 + [0] * 5
    by_queue = {q.queue: q for q in s.queues}
    assert by_queue["q1"].allocated_gpus.tolist() == [4, 4, 8, 8, 8, 8, 8, 4, 4, 4, 0, 0, 0, 0, 0]
    assert by_queue["q2"].allocated_gpus.tolist() == [0] * 10 + [8] * 5
    assert by_queue["q2"].demand_gpus.tolist() == [0] + [8] * 14


def synthetic_run(policy: str) -> SimResult:
    trace = synthetic_trace(300, seed=5)
    return simulate(trace, resolve_cluster("small"), load_policy(policy), SimConfig())


@pytest.mark.parametrize("policy", ["fifo", "las"])
def test_series_agree_with_the_figures(policy: str) -> None:
    r = synthetic_run(policy)
    s = compute_series(r)
    m = compute_metrics(r)
    widths = np.diff(s.bin_edges_s)
    start = min(j.submit_s for j in r.jobs)
    end = start + s.bin_edges_s[-1]
    assert float((s.allocated_gpus * widths).sum()) == pytest.approx(
        allocated_gpu_s(r.timeline, start, end, r.end_s)
    )
    assert np.all(s.demand_gpus >= s.allocated_gpus - 1e-9)  # running jobs have all arrived
    assert np.all(s.allocated_gpus <= s.capacity_gpus + 1e-9)
    assert float(np.median(s.jct_quantiles_s)) == pytest.approx(m.median_jct_s)
    assert s.jct_quantiles_s[-1] == pytest.approx(max(
        j.finish_s - j.submit_s for j in r.jobs if j.finish_s is not None
    ))  # fmt: skip
    assert len(s.queues) >= 2  # the synthetic trace has several queues
    total = sum(q.allocated_gpus for q in s.queues)
    assert np.allclose(total, s.allocated_gpus)


def test_autoscaled_runs_have_node_series_that_add_up_to_the_node_hours() -> None:
    from test_cluster_autoscaling import autoscaled, gang, pool
    from test_cluster_autoscaling import run as run_pools

    r = run_pools([gang("j1", 0.0, 1000.0, tasks=2), gang("j2", 5000.0, 500.0)], autoscaled(pool()))
    s = compute_series(r)
    assert s.autoscaled and s.billed_nodes.max() <= 2.0 and s.present_gpus.max() <= 16.0
    widths = np.diff(s.bin_edges_s)
    node_hours = float((s.billed_nodes * widths).sum()) / 3600.0
    assert node_hours == pytest.approx(compute_metrics(r).node_hours, rel=1e-6)
    # Nodes that never change (a pool that never had to grow) make no node series.
    steady = compute_series(run_pools([gang("j1", 0.0, 1000.0)], autoscaled(pool(min_nodes=1))))
    assert not steady.autoscaled

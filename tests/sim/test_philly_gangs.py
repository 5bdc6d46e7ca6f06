"""A Philly job asking for more GPUs than a node has runs as a gang over several nodes.

The trace records GPU counts for 8-GPU servers. On a cluster of 4-GPU nodes its 8-GPU jobs were
refused as never fitting; `fit_gangs_to` splits them into 2 x 4 (as Tiresias and Helios replay
them). The whole week of VC 6214e9 (8,562 jobs) is replayed by benchmarks/bench_philly_week.py;
here its 61 multi-GPU jobs and its first 400 replay under `fifo` and `fifo-strict`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from aisched.core.policy import preset
from aisched.model.resources import Resources
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import Trace, find_traces_dir, fit_gangs_to, load_philly, split_gpus
from aisched.spec.cluster import resolve_cluster

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from bench_philly_week import CLUSTER, write_week  # noqa: E402


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    try:
        find_traces_dir()
    except FileNotFoundError as e:
        pytest.skip(f"public traces not available (set AISCHED_TRACES): {e}")
    path = tmp_path_factory.mktemp("philly") / "philly.csv"
    assert write_week(path) == 8562
    return load_philly(path)


def test_split_gpus_for_smaller_servers() -> None:
    assert [split_gpus(n, 4) for n in (1, 4, 6, 8, 12, 16, 5)] == [
        (1, 1),
        (1, 4),
        (3, 2),
        (2, 4),
        (3, 4),
        (4, 4),
        (5, 1),
    ]


def test_on_4_gpu_nodes_the_8_gpu_jobs_become_gangs_of_2_by_4(week: Trace) -> None:
    cluster = resolve_cluster(str(CLUSTER))
    fitted, split = fit_gangs_to(week, cluster)
    assert split == 58
    shapes = sorted(
        {(g.replicas, g.request) for tj in fitted.jobs for g in tj.job.groups},
        key=lambda s: (s[1].gpu, s[0]),
    )
    assert shapes == [
        (1, Resources(milli_cpu=3000, mem_mib=12288, gpu=1)),
        (1, Resources(milli_cpu=6000, mem_mib=24576, gpu=2)),
        (1, Resources(milli_cpu=12000, mem_mib=49152, gpu=4)),
        (2, Resources(milli_cpu=12000, mem_mib=49152, gpu=4)),
    ]
    # On 8-GPU nodes nothing changes.
    assert fit_gangs_to(week, resolve_cluster("philly")) == (week, 0)


@pytest.mark.parametrize("policy", ["fifo", "fifo-strict"])
def test_every_job_of_the_week_sample_finishes_on_16_nodes_of_4_gpus(
    week: Trace, policy: str
) -> None:
    cluster = resolve_cluster(str(CLUSTER))
    fitted, _ = fit_gangs_to(week, cluster)
    big = [tj for tj in fitted.jobs if tj.job.total_request.gpu > 1]
    chosen = {tj.job.id: tj for tj in (*fitted.jobs[:400], *big)}
    sample = sorted(chosen.values(), key=lambda tj: (tj.job.submit_time_s, tj.job.id))
    assert len(big) == 61 and sample[0].job.submit_time_s == 0.0
    result = simulate(Trace("week", tuple(sample)), cluster, preset(policy), SimConfig())
    m = compute_metrics(result)
    assert (m.jobs_submitted, m.jobs_finished, m.jobs_rejected, m.jobs_unfinished) == (
        len(sample),
        len(sample),
        0,
        0,
    )

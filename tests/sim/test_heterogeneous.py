"""GPU models that differ in speed: runtimes in the simulator follow the model a job gets, and
the `hetero` preset sends long jobs to fast GPUs and short ones to slow GPUs."""

from __future__ import annotations

import pytest

from aisched.core.policy import load_policy
from aisched.model.gpu_speed import GpuSpeeds
from aisched.sim.engine import JobRecord, SimConfig, SimResult, simulate
from aisched.sim.traces import Trace, TraceJob
from aisched.testing import cluster, job, node

SPEEDS = GpuSpeeds((("A100", 2.0), ("T4", 0.5)))
# Node names put the slow node first, so a score that cannot tell them apart picks it.
TWO_MODELS = cluster(node("a-t4").gpus(1, model="T4"), node("b-a100").gpus(1, model="A100"))


def trace(*jobs: tuple[str, float, float]) -> Trace:
    return Trace(
        "t",
        tuple(
            TraceJob(job(j).task(gpu=1).submitted(at).estimate(dur).build(), dur)
            for j, at, dur in jobs
        ),
    )


def run(policy: str, t: Trace, speeds: GpuSpeeds | None = SPEEDS) -> SimResult:
    config = SimConfig(validate=True, gpu_speeds=speeds)
    return simulate(t, TWO_MODELS, load_policy(policy), config)


def rec(r: SimResult, job_id: str) -> JobRecord:
    return next(x for x in r.jobs if x.job_id == job_id)


def nodes_of(r: SimResult) -> dict[str, str]:
    return {entry[2]: entry[3][0] for entry in r.log if entry[1] == "bind"}


def test_runtime_follows_the_gpu_model() -> None:
    r = run("fifo", trace(("long", 0.0, 7200.0)))
    assert nodes_of(r) == {"long": "a-t4"}
    assert rec(r, "long").finish_s == 14400.0  # 7200 s of work at half speed


def test_without_a_speed_table_every_model_runs_at_trace_speed() -> None:
    r = run("fifo", trace(("long", 0.0, 7200.0)), speeds=None)
    assert rec(r, "long").finish_s == 7200.0


@pytest.mark.parametrize(
    ("policy", "want_nodes", "want_finish"),
    [
        ("fifo", {"long": "a-t4", "short": "b-a100"}, {"long": 14400.0, "short": 30.0}),
        ("hetero", {"long": "b-a100", "short": "a-t4"}, {"long": 3600.0, "short": 120.0}),
    ],
)
def test_hetero_gives_the_fast_gpu_to_the_long_job(
    policy: str, want_nodes: dict[str, str], want_finish: dict[str, float]
) -> None:
    r = run(policy, trace(("long", 0.0, 7200.0), ("short", 0.0, 60.0)))
    assert nodes_of(r) == want_nodes
    assert {j: rec(r, j).finish_s for j in want_finish} == want_finish


def test_preempted_work_is_counted_at_the_speed_it_ran() -> None:
    speeds = GpuSpeeds((("T4", 0.5),))
    c = cluster(node("n").gpus(1, model="T4"))
    low = job("low").task(gpu=1).estimate(7200).build()
    high = job("high").task(gpu=1).priority(10).submitted(3600).estimate(60).build()
    t = Trace("t", (TraceJob(low, 7200.0), TraceJob(high, 60.0)))
    config = SimConfig(
        validate=True, gpu_speeds=speeds, checkpoint_interval_s=1800.0, restart_cost_s=0.0
    )
    r = simulate(t, c, load_policy("priority"), config)
    # low ran 3600 s at half speed (1800 s of work, checkpointed), waited 120 s for high, then
    # did the other 5400 s of work at half speed: 3720 + 10800.
    assert rec(r, "low").finish_s == 3720.0 + 10800.0
    assert rec(r, "high").finish_s == 3600.0 + 120.0

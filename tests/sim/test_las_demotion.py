"""2D-LAS re-ranks at each demotion instant: when a running job's attained GPU-service
crosses a threshold of the `las` order (3,600 and 36,000 GPU-s in the preset), the simulator
runs a cycle at that instant, so a waiting job of a higher queue preempts it then, not at the
next arrival or finish."""

from __future__ import annotations

from aisched.core.policy import preset
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.traces import Trace, TraceJob
from aisched.testing import cluster, job, node

CONFIG = SimConfig(checkpoint_interval_s=600.0, restart_cost_s=0.0, validate=True)


def trace(*jobs: tuple[str, float, float, int]) -> Trace:
    return Trace(
        "t",
        tuple(
            TraceJob(job(i).task(gpu=gpus).submitted(at).build(), duration)
            for i, at, duration, gpus in jobs
        ),
    )


def test_a_demotion_lets_the_waiting_job_preempt_at_that_instant() -> None:
    # a runs alone on the one GPU; b arrives in the same queue (both under 3,600 GPU-s), so
    # it waits. At t=3600 a has received 3,600 GPU-s and drops a queue: b preempts it then.
    # Nothing else happens until a's end at 10,000, which is when b started before.
    one_gpu = cluster(node("n1").gpus(1))
    r = simulate(
        trace(("a", 0.0, 10_000.0, 1), ("b", 100.0, 500.0, 1)), one_gpu, preset("las"), CONFIG
    )
    assert r.log == (
        (0.0, "bind", "a", ("n1",)),
        (3600.0, "preempt", "a", ("b", "preempted for b")),
        (3600.0, "bind", "b", ("n1",)),
        (4100.0, "finish", "b", ()),
        (4100.0, "bind", "a", ("n1",)),
        (10_500.0, "finish", "a", ()),  # the 3,600 s it had are checkpointed; 6,400 s to go
    )  # fmt: skip


def test_the_demotion_instant_is_the_threshold_over_the_gpus_held() -> None:
    # On 2 GPUs, a reaches 3,600 GPU-s at t=1800.
    two_gpus = cluster(node("n1").gpus(2))
    r = simulate(
        trace(("a", 0.0, 10_000.0, 2), ("b", 100.0, 500.0, 2)), two_gpus, preset("las"), CONFIG
    )
    assert r.log[1:3] == (
        (1800.0, "preempt", "a", ("b", "preempted for b")),
        (1800.0, "bind", "b", ("n1",)),
    )  # fmt: skip


def test_fit_first_fifo_has_no_demotions() -> None:
    one_gpu = cluster(node("n1").gpus(1))
    r = simulate(
        trace(("a", 0.0, 10_000.0, 1), ("b", 100.0, 500.0, 1)), one_gpu, preset("fifo"), CONFIG
    )
    assert r.log == (
        (0.0, "bind", "a", ("n1",)),
        (10_000.0, "finish", "a", ()),
        (10_000.0, "bind", "b", ("n1",)),
        (10_500.0, "finish", "b", ()),
    )  # fmt: skip

"""A service in the simulator: its replicas play the service's failures (`fail_after_s`), are
retried under their own restart policy, and one that fails for good is replaced after the
crash loop's wait, as the live service's autoscaler replaces it (`lifecycle.services`)."""

from __future__ import annotations

import math
from dataclasses import replace

from aisched.core.policy import preset
from aisched.model.job import JobKind
from aisched.model.service import ServiceSpec
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.traces import Trace, TraceJob
from aisched.testing import cluster, job, node


def service_trace(fail_after_s: tuple[float, ...], replicas: int = 1) -> Trace:
    svc = job("1").name("svc").task(1, gpu=1).kind(JobKind.SERVICE).backoff(10).build()
    svc = replace(
        svc,
        max_retries=1,
        service=ServiceSpec(min_replicas=replicas, max_replicas=replicas),
    )
    return Trace("services", (TraceJob(svc, math.inf, fail_after_s=fail_after_s),))


def run(trace: Trace) -> list[tuple[float, str, str, tuple[str, ...]]]:
    config = SimConfig(checkpoint_interval_s=math.inf, max_backoff_s=60.0, validate=True)
    result = simulate(
        trace, cluster(node("n0").gpus(4).cpus(32).mem_gib(128)), preset("fifo"), config
    )
    return [e for e in result.log if e[1] != "reserve"]


def test_a_replica_that_fails_for_good_is_replaced_after_the_crash_loops_wait() -> None:
    """The simulator's replicas never failed, and had they, one that failed for good was
    not replaced: the service ran short of its minimum for the rest of the run, where the
    live service asks for a new one in its place."""
    log = run(service_trace((100.0, 100.0, 100.0)))
    fail = "a task failed; no retries left (1)"
    assert log == [
        (0.0, "service", "1", ("2",)),
        (0.0, "bind", "2", ("n0",)),
        (100.0, "retry", "2", ("a task failed; retry 1 of 1 in 10s",)),
        (110.0, "bind", "2", ("n0",)),
        (210.0, "fail", "2", (fail,)),
        # The first replica of a run waits the service's backoff (10 s), then starts; it
        # plays the failures its predecessor did not reach: one, retried, then it serves.
        (210.0, "replace", "1", ("2", "3", f"replica 2 failed: {fail}")),
        (220.0, "bind", "3", ("n0",)),
        (320.0, "retry", "3", ("a task failed; retry 1 of 1 in 10s",)),
        (330.0, "bind", "3", ("n0",)),
    ]


def test_replicas_failing_in_a_row_wait_longer_each_time() -> None:
    log = run(service_trace((50.0,) * 4))
    replaced = [(t, detail[:2]) for t, kind, _, detail in log if kind == "replace"]
    binds = [(t, job_id) for t, kind, job_id, _ in log if kind == "bind"]
    # Each replica fails twice (50 s, a 10 s retry, 50 s); the waits before its replacement
    # double: 10 s, then 20 s; the third plays no failure left and serves.
    assert replaced == [(110.0, ("2", "3")), (230.0, ("3", "4"))]
    assert binds == [
        (0.0, "2"),
        (60.0, "2"),
        (120.0, "3"),
        (180.0, "3"),
        (250.0, "4"),
    ]

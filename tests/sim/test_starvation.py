"""A large gang is not starved by a stream of small jobs when backfill holds a reservation.

Two 8-GPU nodes; one-GPU jobs of 1,000 s arrive every 100 s, more than enough to keep every GPU
busy for ever. A 16-GPU gang arrives at t=50. Greedy FIFO keeps filling each freed GPU with the
next small job, so the gang never finds two empty nodes while the stream lasts; with backfill it
holds a reservation and starts once the jobs already running have ended.
"""

from __future__ import annotations

from aisched.core.policy import preset
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.traces import Trace, TraceJob
from aisched.testing import cluster, job, node

STREAM_END_S = 20_000.0


def stream_trace() -> Trace:
    jobs = [TraceJob(job("gang").gang(2, gpu=8).submitted(50.0).build(), 500.0)]
    t = 0.0
    i = 0
    while t < STREAM_END_S:
        jobs.append(TraceJob(job(f"s{i:04d}").task(gpu=1).submitted(t).build(), 1000.0))
        t += 100.0
        i += 1
    return Trace("stream", tuple(sorted(jobs, key=lambda tj: (tj.job.submit_time_s, tj.job.id))))


def gang_start(policy: str) -> float | None:
    c = cluster(node("n1").gpus(8), node("n2").gpus(8))
    result = simulate(stream_trace(), c, preset(policy), SimConfig(validate=True))
    return next(r.first_start_s for r in result.jobs if r.job_id == "gang")


def test_greedy_fifo_starves_the_gang_while_the_stream_lasts() -> None:
    start = gang_start("fifo")
    assert start is not None and start > STREAM_END_S


def test_backfill_reservation_starts_the_gang_when_running_jobs_end() -> None:
    start = gang_start("fifo-backfill")
    # At t=50 the running small jobs all end by t=1050; none started after the reservation
    # may sit on its nodes, since small jobs carry no runtime bound.
    assert start is not None and start <= 1050.0

"""Metrics from hand-made results, so every figure can be checked by hand."""

from __future__ import annotations

import json

import pytest

from aisched.sim.engine import JobRecord, SimConfig, SimResult
from aisched.sim.metrics import PolicyMetrics, allocated_gpu_s, compute_metrics


def record(
    job_id: str,
    submit: float,
    start: float | None,
    finish: float | None,
    *,
    queue: str = "q",
    gpus: float = 1.0,
    preemptions: int = 0,
    restarts: int = 0,
    rejected: str | None = None,
) -> JobRecord:
    ran = 0.0 if start is None else ((finish if finish is not None else start) - start)
    return JobRecord(
        job_id=job_id,
        queue=queue,
        user="u",
        priority=0,
        submit_s=submit,
        duration_s=ran,
        gpus=gpus,
        first_start_s=start,
        finish_s=finish,
        preemptions=preemptions,
        restarts=restarts,
        gpu_s=gpus * ran,
        rejected=rejected,
    )


def result(
    jobs: tuple[JobRecord, ...],
    timeline: tuple[tuple[float, float, int, int], ...] = (),
    capacity: float = 4.0,
    end: float = 0.0,
) -> SimResult:
    return SimResult(
        trace_name="t",
        policy_name="p",
        config=SimConfig(),
        capacity_gpus=capacity,
        jobs=jobs,
        log=(),
        timeline=timeline,
        end_s=end,
        cycles=3,
        wall_s=0.5,
        cycle_wall_s=0.25,
    )


def test_job_times_and_counts() -> None:
    jobs = (
        record("a", 0.0, 0.0, 100.0, queue="x"),  # jct 100, wait 0
        record("b", 10.0, 50.0, 310.0, queue="x", preemptions=1, restarts=1),  # jct 300, wait 40
        record("c", 20.0, 40.0, 220.0, queue="y"),  # jct 200, wait 20
        record("d", 30.0, None, None, queue="y"),  # never started
        record("e", 40.0, None, None, queue="y", rejected="never fits"),
    )
    m = compute_metrics(result(jobs, end=400.0))
    assert (m.jobs_submitted, m.jobs_finished, m.jobs_rejected, m.jobs_unfinished) == (5, 3, 1, 1)
    assert m.avg_jct_s == pytest.approx(200.0)
    assert m.median_jct_s == pytest.approx(200.0)
    assert m.p95_jct_s == pytest.approx(290.0)  # linear between 200 and 300
    assert m.p99_jct_s == pytest.approx(298.0)
    assert m.avg_queueing_s == pytest.approx(20.0)
    assert m.median_queueing_s == pytest.approx(20.0)
    assert m.makespan_s == pytest.approx(310.0)
    assert (m.preemptions, m.restarts) == (1, 1)
    assert [(q.queue, q.jobs, q.finished) for q in m.queues] == [("x", 2, 2), ("y", 3, 1)]
    x, y = m.queues
    assert x.avg_jct_s == pytest.approx(200.0)
    assert x.avg_queueing_s == pytest.approx(20.0)
    assert y.avg_jct_s == pytest.approx(200.0)
    assert x.gpu_hours == pytest.approx((100.0 + 260.0) / 3600.0)


def test_utilisation_integrates_the_timeline_over_the_window() -> None:
    # 2 GPUs over [0, 50], 4 over [50, 100], 0 after; capacity 4; window [0, 100].
    timeline = ((0.0, 2.0, 1, 0), (50.0, 4.0, 2, 0), (100.0, 0.0, 0, 0))
    jobs = (record("a", 0.0, 0.0, 100.0, gpus=2.0), record("b", 0.0, 50.0, 100.0, gpus=2.0))
    m = compute_metrics(result(jobs, timeline, capacity=4.0, end=100.0))
    assert m.gpu_utilisation == pytest.approx((2 * 50 + 4 * 50) / (4 * 100))


def test_allocated_gpu_s_clips_to_the_window_and_holds_the_last_sample() -> None:
    timeline = ((0.0, 2.0, 1, 0), (10.0, 3.0, 2, 0))
    assert allocated_gpu_s(timeline, 5.0, 20.0, 30.0) == pytest.approx(2 * 5 + 3 * 10)
    assert allocated_gpu_s(timeline, 0.0, 100.0, 30.0) == pytest.approx(2 * 10 + 3 * 20)
    assert allocated_gpu_s((), 0.0, 10.0, 10.0) == 0.0


def test_nothing_finished_gives_none_not_zero() -> None:
    m = compute_metrics(result((record("a", 0.0, None, None),), end=50.0))
    assert m.avg_jct_s is None and m.p99_jct_s is None and m.avg_queueing_s is None
    assert m.makespan_s == 0.0
    assert m.gpu_utilisation == 0.0


def test_empty_result() -> None:
    m = compute_metrics(result(()))
    assert m.jobs_submitted == 0 and m.gpu_utilisation is None and m.queues == ()


def test_to_dict_is_plain_json() -> None:
    m = compute_metrics(result((record("a", 0.0, 0.0, 10.0, queue="x"),), end=10.0))
    d = m.to_dict()
    again = json.loads(json.dumps(d))
    assert again["policy"] == "p"
    assert again["queues"] == [
        {
            "queue": "x",
            "jobs": 1,
            "finished": 1,
            "avg_jct_s": 10.0,
            "avg_queueing_s": 0.0,
            "gpu_hours": 10.0 / 3600.0,
        }
    ]
    assert set(d) == set(PolicyMetrics.__dataclass_fields__)

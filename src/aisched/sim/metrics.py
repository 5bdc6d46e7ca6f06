"""Figures of one simulation run: job completion time, queueing delay, utilisation, preemptions.

Everything is computed from a `SimResult` alone, so the figures of a stored result can be
recomputed. Definitions:

- JCT = finish − submit, over finished jobs; queueing delay = first start − submit, over jobs
  that started at least once. Rejected and unfinished jobs are counted but give no times.
- makespan = last finish − first submit (0 when nothing finished).
- GPU utilisation = allocated GPU-seconds / capacity GPU-seconds over [first submit, last
  finish] (the end of the run when nothing finished); a GPU share counts as gpu_milli / 1000.
  With autoscaling the capacity is that of the nodes present at each moment.
- node-hours = billed nodes integrated over the same window (a node is billed from the moment
  it is asked for until it is removed; a fixed cluster's nodes all the time), and cost = the
  nodes' cost per node-hour integrated likewise (None when no node has a cost). Peak nodes is
  the most billed at once.
- restarts = starts after a preemption; a job preempted at the end of a run has no restart.

- runtime estimates (over jobs that finished and had one when they arrived): the median
  absolute error |estimate − true runtime|, the median ratio max(est/true, true/est), and the
  share of jobs whose true runtime was at most the upper estimate.
- ETAs (over jobs that had to wait, got an ETA in their first cycle, and started): the median
  absolute error |ETA − first start|, and the share that started within an hour of their ETA.

An average of nothing is None, not 0, so "no data" never reads as "instant".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from aisched.sim.engine import JobRecord, NodeSample, Sample, SimResult

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    queue: str
    jobs: int
    finished: int
    avg_jct_s: float | None
    avg_queueing_s: float | None
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class PolicyMetrics:
    policy: str
    trace: str
    jobs_submitted: int
    jobs_finished: int
    jobs_rejected: int
    jobs_unfinished: int
    avg_jct_s: float | None
    median_jct_s: float | None
    p95_jct_s: float | None
    p99_jct_s: float | None
    avg_queueing_s: float | None
    median_queueing_s: float | None
    makespan_s: float
    gpu_utilisation: float | None
    gpu_hours: float
    capacity_gpus: float
    preemptions: int
    restarts: int
    cycles: int
    wall_s: float
    queues: tuple[QueueMetrics, ...]
    estimated_jobs: int = 0
    estimate_mdae_s: float | None = None
    estimate_median_ratio: float | None = None
    estimate_under_upper: float | None = None
    eta_jobs: int = 0
    eta_mdae_s: float | None = None
    eta_within_1h: float | None = None
    node_hours: float = 0.0
    cost: float | None = None
    peak_nodes: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready values; queues as a list of mappings."""
        out = asdict(self)
        out["queues"] = [asdict(q) for q in self.queues]
        return out


def compute_metrics(result: SimResult) -> PolicyMetrics:
    jobs = result.jobs
    jct = _jct(jobs)
    wait = _wait(jobs)
    finishes = [j.finish_s for j in jobs if j.finish_s is not None]
    first_submit = min((j.submit_s for j in jobs), default=0.0)
    last_finish = max(finishes) if finishes else None
    makespan = last_finish - first_submit if last_finish is not None else 0.0
    window_end = last_finish if last_finish is not None else result.end_s
    nodes = result.nodes_timeline
    if len(nodes) > 1:  # capacity changed during the run
        capacity_gpu_s = _integral(nodes, 2, first_submit, window_end)
    else:
        capacity_gpu_s = result.capacity_gpus * (window_end - first_submit)
    utilisation = (
        allocated_gpu_s(result.timeline, first_submit, window_end, result.end_s) / capacity_gpu_s
        if capacity_gpu_s > 0
        else None
    )
    rejected = sum(1 for j in jobs if j.rejected is not None)
    return PolicyMetrics(
        policy=result.policy_name,
        trace=result.trace_name,
        jobs_submitted=len(jobs),
        jobs_finished=len(finishes),
        jobs_rejected=rejected,
        jobs_unfinished=len(jobs) - len(finishes) - rejected,
        avg_jct_s=_mean(jct),
        median_jct_s=_pct(jct, 50),
        p95_jct_s=_pct(jct, 95),
        p99_jct_s=_pct(jct, 99),
        avg_queueing_s=_mean(wait),
        median_queueing_s=_pct(wait, 50),
        makespan_s=makespan,
        gpu_utilisation=utilisation,
        gpu_hours=sum(j.gpu_s for j in jobs) / 3600.0,
        capacity_gpus=result.capacity_gpus,
        preemptions=sum(j.preemptions for j in jobs),
        restarts=sum(j.restarts for j in jobs),
        cycles=result.cycles,
        wall_s=result.wall_s,
        queues=queue_metrics(jobs),
        **estimate_metrics(jobs),
        **eta_metrics(jobs),
        node_hours=_integral(nodes, 1, first_submit, window_end) / 3600.0,
        cost=_integral(nodes, 3, first_submit, window_end) / 3600.0 if result.priced else None,
        peak_nodes=max((s[1] for s in nodes), default=0),
        nodes_added=int(result.stats.get("nodes_added", 0)),
        nodes_removed=int(result.stats.get("nodes_removed", 0)),
    )


def _integral(samples: Sequence[NodeSample], col: int, start_s: float, end_s: float) -> float:
    """Integral of column `col` of a step function over [start_s, end_s]; the last sample holds
    to `end_s` (and the first reaches back to `start_s`)."""
    total = 0.0
    for i, sample in enumerate(samples):
        t = start_s if i == 0 else sample[0]
        nxt = samples[i + 1][0] if i + 1 < len(samples) else end_s
        lo, hi = max(t, start_s), min(nxt, end_s)
        if hi > lo:
            total += float(sample[col]) * (hi - lo)
    return total


def estimate_metrics(jobs: Sequence[JobRecord]) -> dict[str, Any]:
    done = [j for j in jobs if j.finish_s is not None and j.estimate_s is not None]
    if not done:
        return {}
    est = np.array([j.estimate_s for j in done], dtype=np.float64)
    true = np.array([j.duration_s for j in done], dtype=np.float64)
    ratio = np.maximum(est / true, true / est)
    uppers = [(j.duration_s, j.estimate_upper_s) for j in done if j.estimate_upper_s is not None]
    return {
        "estimated_jobs": len(done),
        "estimate_mdae_s": float(np.median(np.abs(est - true))),
        "estimate_median_ratio": float(np.median(ratio)),
        "estimate_under_upper": (
            sum(1 for t, u in uppers if u is not None and t <= u) / len(uppers) if uppers else None
        ),
    }


def eta_metrics(jobs: Sequence[JobRecord]) -> dict[str, Any]:
    pairs = [(j.eta_s, j.first_start_s) for j in jobs if j.eta_s is not None]
    errs = np.array([abs(s - e) for e, s in pairs if s is not None], dtype=np.float64)
    if not errs.size:
        return {}
    return {
        "eta_jobs": int(errs.size),
        "eta_mdae_s": float(np.median(errs)),
        "eta_within_1h": float((errs <= 3600.0).mean()),
    }


def queue_metrics(jobs: Sequence[JobRecord]) -> tuple[QueueMetrics, ...]:
    by_queue: dict[str, list[JobRecord]] = defaultdict(list)
    for j in jobs:
        by_queue[j.queue].append(j)
    out = []
    for name in sorted(by_queue):
        js = by_queue[name]
        jct = _jct(js)
        wait = _wait(js)
        out.append(
            QueueMetrics(
                queue=name,
                jobs=len(js),
                finished=len(jct),
                avg_jct_s=_mean(jct),
                avg_queueing_s=_mean(wait),
                gpu_hours=sum(j.gpu_s for j in js) / 3600.0,
            )
        )
    return tuple(out)


def allocated_gpu_s(
    timeline: Sequence[Sample], start_s: float, end_s: float, run_end_s: float
) -> float:
    """Integral of allocated GPUs over [start_s, end_s]; the last sample holds to `run_end_s`."""
    total = 0.0
    for i, (t, gpus, _, _) in enumerate(timeline):
        nxt = timeline[i + 1][0] if i + 1 < len(timeline) else max(run_end_s, t)
        lo, hi = max(t, start_s), min(nxt, end_s)
        if hi > lo:
            total += gpus * (hi - lo)
    return total


def _jct(jobs: Sequence[JobRecord]) -> FloatArray:
    return np.array(
        [j.finish_s - j.submit_s for j in jobs if j.finish_s is not None], dtype=np.float64
    )


def _wait(jobs: Sequence[JobRecord]) -> FloatArray:
    return np.array(
        [j.first_start_s - j.submit_s for j in jobs if j.first_start_s is not None],
        dtype=np.float64,
    )


def _mean(a: FloatArray) -> float | None:
    return float(a.mean()) if a.size else None


def _pct(a: FloatArray, q: float) -> float | None:
    return float(np.percentile(a, q)) if a.size else None

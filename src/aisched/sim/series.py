"""Time series and distributions of one simulation run, for plots: what the report draws.

Everything is computed from a `SimResult` alone (like `aisched.sim.metrics`) and is bounded in
size whatever the length of the trace: step functions are averaged over a fixed number of time
bins (time-weighted, so a short spike counts for its duration), distributions are kept as
quantiles. Times are virtual seconds from the run's first submission.

- allocated GPUs: the engine's timeline; pending jobs likewise.
- arrived demand: the GPUs of every job that has arrived and not finished (running or
  waiting); a job the cluster could never run is left out. Demand above capacity is the queue.
- per queue: allocation rebuilt from the decision log (bind adds the job's GPUs, preempt and
  finish give them back), and the arrived demand of the queue's jobs.
- nodes (autoscaling pools only): the billed nodes and the GPUs on present nodes, from the
  engine's node timeline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from aisched.sim.engine import JobRecord, SimResult

FloatArray = npt.NDArray[np.float64]
BINS = 300
QUANTILES = np.linspace(0.0, 1.0, 201)
SHOWN_QUEUES = 6  # the queues with the most GPU-hours get their own series; the rest are summed
OTHER_QUEUES = "(other queues)"


@dataclass(frozen=True)
class QueueSeries:
    queue: str
    allocated_gpus: FloatArray
    demand_gpus: FloatArray


@dataclass(frozen=True)
class PolicySeries:
    """Plot-ready series of one run; `bin_edges_s` has one more entry than each binned series."""

    policy: str
    capacity_gpus: float
    jct_quantiles_s: FloatArray  # at QUANTILES, over finished jobs; empty when none finished
    queueing_quantiles_s: FloatArray  # at QUANTILES, over jobs that started
    bin_edges_s: FloatArray
    allocated_gpus: FloatArray
    demand_gpus: FloatArray
    pending_jobs: FloatArray
    queues: tuple[QueueSeries, ...] = field(default=())
    # With autoscaling pools: billed nodes and GPUs on present nodes; empty for a fixed cluster.
    billed_nodes: FloatArray = field(default_factory=lambda: np.zeros(0))
    present_gpus: FloatArray = field(default_factory=lambda: np.zeros(0))

    @property
    def autoscaled(self) -> bool:
        return self.present_gpus.size > 0


def compute_series(result: SimResult, bins: int = BINS) -> PolicySeries:
    jobs = result.jobs
    start = min((j.submit_s for j in jobs), default=0.0)
    last = max((j.finish_s for j in jobs if j.finish_s is not None), default=start)
    end = max(last, result.end_s, start + 1.0)
    edges = np.linspace(start, end, bins + 1)
    tl = result.timeline
    times = np.array([s[0] for s in tl], dtype=np.float64)
    allocated = binned_mean(times, np.array([s[1] for s in tl], dtype=np.float64), edges)
    pending = binned_mean(times, np.array([s[3] for s in tl], dtype=np.float64), edges)
    jct = [j.finish_s - j.submit_s for j in jobs if j.finish_s is not None]
    wait = [j.first_start_s - j.submit_s for j in jobs if j.first_start_s is not None]
    nt = result.nodes_timeline
    billed = present = np.zeros(0)
    if len(nt) > 1:  # the nodes changed: an autoscaled cluster
        nt_times = np.array([n[0] for n in nt], dtype=np.float64)
        billed = binned_mean(nt_times, np.array([n[1] for n in nt], dtype=np.float64), edges)
        present = binned_mean(nt_times, np.array([n[2] for n in nt], dtype=np.float64), edges)
    return PolicySeries(
        policy=result.policy_name,
        capacity_gpus=result.capacity_gpus,
        jct_quantiles_s=_quantiles(jct),
        queueing_quantiles_s=_quantiles(wait),
        bin_edges_s=edges - start,
        allocated_gpus=allocated,
        demand_gpus=_demand(jobs, edges),
        pending_jobs=pending,
        queues=_queue_series(result, edges),
        billed_nodes=billed,
        present_gpus=present,
    )


def binned_mean(times: FloatArray, values: FloatArray, edges: FloatArray) -> FloatArray:
    """Time-weighted mean over each bin of a step function: `values[i]` holds from `times[i]`
    (sorted) until the next time, the last value for ever after; 0 before the first time."""
    if times.size == 0:
        return np.zeros(edges.size - 1)
    area_at = np.concatenate(([0.0], np.cumsum(values[:-1] * np.diff(times))))
    idx = np.searchsorted(times, edges, side="right") - 1
    safe = np.clip(idx, 0, None)
    area = np.where(idx >= 0, area_at[safe] + values[safe] * (edges - times[safe]), 0.0)
    return np.asarray(np.diff(area) / np.diff(edges), dtype=np.float64)


def step_from_changes(changes: Iterable[tuple[float, float]]) -> tuple[FloatArray, FloatArray]:
    """(time, delta) pairs to a step function's (times, values)."""
    pairs = sorted(changes)
    if not pairs:
        return np.zeros(0), np.zeros(0)
    arr = np.array(pairs, dtype=np.float64)
    return arr[:, 0], np.cumsum(arr[:, 1])


def _quantiles(values: Sequence[float]) -> FloatArray:
    if not values:
        return np.zeros(0)
    return np.asarray(np.quantile(np.array(values, dtype=np.float64), QUANTILES), dtype=np.float64)


def _demand_changes(jobs: Iterable[JobRecord]) -> list[tuple[float, float]]:
    out = []
    for j in jobs:
        if j.rejected is not None:
            continue
        out.append((j.submit_s, j.gpus))
        if j.finish_s is not None:
            out.append((j.finish_s, -j.gpus))
    return out


def _demand(jobs: Iterable[JobRecord], edges: FloatArray) -> FloatArray:
    return binned_mean(*step_from_changes(_demand_changes(jobs)), edges)


def _queue_series(result: SimResult, edges: FloatArray) -> tuple[QueueSeries, ...]:
    by_id = {j.job_id: j for j in result.jobs}
    hours: dict[str, float] = defaultdict(float)
    for j in result.jobs:
        hours[j.queue] += j.gpu_s
    if len(hours) < 2:
        return ()  # one queue: the totals already say it all
    ranked = sorted(hours, key=lambda q: (-hours[q], q))
    shown = set(ranked[:SHOWN_QUEUES])

    def group(queue: str) -> str:
        return queue if queue in shown else OTHER_QUEUES

    alloc: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for time_s, kind, job_id, _detail in result.log:
        rec = by_id.get(job_id)
        if rec is None:
            continue
        if kind == "bind":
            alloc[group(rec.queue)].append((time_s, rec.gpus))
        elif kind in ("preempt", "finish"):
            alloc[group(rec.queue)].append((time_s, -rec.gpus))
    jobs_of: dict[str, list[JobRecord]] = defaultdict(list)
    for j in result.jobs:
        jobs_of[group(j.queue)].append(j)
    names = [q for q in ranked[:SHOWN_QUEUES]] + (
        [OTHER_QUEUES] if len(ranked) > SHOWN_QUEUES else []
    )
    return tuple(
        QueueSeries(
            queue=name,
            allocated_gpus=binned_mean(*step_from_changes(alloc[name]), edges),
            demand_gpus=_demand(jobs_of[name], edges),
        )
        for name in names
    )

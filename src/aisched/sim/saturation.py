"""Fill-the-cluster runs: the experiment of the FGD paper (Weng et al., USENIX ATC '23).

Tasks arrive one at a time in trace order and never leave. Each arrival gets one scheduling
cycle of the real core; a task that does not fit then is counted as failed and dropped (no
queueing, no retry), as in the paper's simulator. The list is replayed from the top (ids
suffixed `~2`, `~3`, ...) until the GPU demand that has arrived reaches the largest target
share of the cluster's GPU capacity.

At each target (say 90 % of capacity arrived) the run records the GPU allocated and the GPU
demand of the tasks that failed, both as shares of capacity. The failed share is the paper's
"unallocated GPU": GPU that was asked for, and was free somewhere, but in pieces no task fit.

The task mix the fragmentation score sees is the tally of task shapes arrived so far.

Unallocated GPU alone would reward a placement that keeps GPU nodes' GPUs free by failing the
CPU-only tasks (it counts no CPU): each point also counts the CPU-only tasks that failed and
the CPU cores they asked for, to be reported beside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind
from aisched.core.policy import Policy
from aisched.core.snapshot import (
    ZERO,
    FreeState,
    PendingJob,
    RunningJob,
    Snapshot,
    Usage,
    add_usage,
    build_arrays,
    validate_free,
)
from aisched.core.taskmix import TaskMix, TaskMixTally
from aisched.model.cluster import Cluster
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE
from aisched.sim.engine import SimulationError, queues_for

DEFAULT_TARGETS = (0.90, 0.95, 1.00)
MAX_PASSES = 20  # replays of the list; a list with almost no GPU demand must still end


@dataclass(frozen=True, slots=True)
class SaturationPoint:
    """The cluster when the arrived GPU demand first reached `target` of capacity."""

    target: float
    arrived: int  # tasks arrived so far
    arrived_gpus: float
    allocated_gpus: float
    failed_gpus: float  # GPU demand of the tasks that did not fit
    capacity_gpus: float
    failed_cpu_only: int = 0  # tasks asking for no GPU that did not fit
    failed_cpu_only_cores: float = 0.0  # the CPU cores they asked for

    @property
    def arrived_share(self) -> float:
        """GPU demand arrived, as a share of capacity: at or past `target`."""
        return self.arrived_gpus / self.capacity_gpus if self.capacity_gpus else 0.0

    @property
    def allocated_share(self) -> float:
        return self.allocated_gpus / self.capacity_gpus if self.capacity_gpus else 0.0

    @property
    def unallocated_share(self) -> float:
        """GPU demand that arrived and was not placed, as a share of capacity."""
        return self.failed_gpus / self.capacity_gpus if self.capacity_gpus else 0.0


@dataclass(frozen=True, slots=True)
class SaturationResult:
    trace_name: str
    policy_name: str
    capacity_gpus: float
    points: tuple[SaturationPoint, ...]
    placed: int
    failed: int
    wall_s: float


def arrivals(jobs: Sequence[Job], passes: int = MAX_PASSES) -> Iterator[Job]:
    """The jobs in order, then again with ids suffixed `~2`, `~3`, ... (at most `passes`)."""
    for p in range(1, passes + 1):
        for job in jobs:
            yield job if p == 1 else replace(job, id=f"{job.id}~{p}")


def saturate(
    jobs: Sequence[Job],
    cluster: Cluster,
    policy: Policy,
    *,
    targets: Sequence[float] = DEFAULT_TARGETS,
    trace_name: str = "trace",
    validate: bool = False,
    task_mix: TaskMix | None = None,
) -> SaturationResult:
    """Fill `cluster` with `jobs` in order under `policy` until the arrived GPU demand reaches
    every share of capacity in `targets`; see the module docstring. `task_mix` fixes the mix
    the fragmentation score sees (default: the tally of the tasks arrived so far)."""
    wanted = sorted(targets)
    if not wanted or wanted[0] <= 0:
        raise ValueError(f"targets must be positive shares of capacity, got {list(targets)}")
    if not any(j.total_request.gpu_equivalent_milli for j in jobs):
        raise ValueError("the jobs ask for no GPU: nothing to saturate")
    wall0 = time.perf_counter()
    arrays = build_arrays(cluster)
    capacity = float(arrays.totals()[2])
    free = FreeState.empty(arrays)
    queues = queues_for(jobs)
    tally = TaskMixTally()
    running: list[RunningJob] = []
    usage: dict[tuple[str, str], Usage] = {}
    arrived_milli = allocated_milli = failed_milli = 0
    placed = failed = failed_cpu_only = failed_cpu_milli = 0
    points: list[SaturationPoint] = []
    for i, job in enumerate(arrivals(jobs)):
        if len(points) == len(wanted):
            break
        demand = job.total_request.gpu_equivalent_milli
        tally.add_job(job)
        mix = tally.mix() if task_mix is None else task_mix
        snapshot = Snapshot(arrays, free, tuple(running), queues, usage, task_mix=mix)
        result = run_cycle(snapshot, (PendingJob(job),), policy, float(i), validate=validate)
        bind = next((d for d in result.decisions if isinstance(d, Bind)), None)
        if bind is None:
            failed += 1
            failed_milli += demand
            if demand == 0:
                failed_cpu_only += 1
                failed_cpu_milli += job.total_request.milli_cpu
        else:
            free.take_all(arrays.index, bind.tasks)
            view = RunningJob(job, bind.tasks, float(i))
            running.append(view)
            key = (job.queue, job.account)
            usage[key] = add_usage(usage.get(key, ZERO), view.usage)
            placed += 1
            allocated_milli += sum(len(t.gpus) * t.gpu_milli for t in bind.tasks)
        if validate:
            problems = validate_free(Snapshot(arrays, free, tuple(running), queues))
            if problems:
                raise SimulationError(f"task {i} ({job.id}): {'; '.join(problems)}")
        arrived_milli += demand
        while len(points) < len(wanted) and arrived_milli >= wanted[len(points)] * capacity:
            points.append(
                SaturationPoint(
                    target=wanted[len(points)],
                    arrived=i + 1,
                    arrived_gpus=arrived_milli / GPU_MILLI_WHOLE,
                    allocated_gpus=allocated_milli / GPU_MILLI_WHOLE,
                    failed_gpus=failed_milli / GPU_MILLI_WHOLE,
                    capacity_gpus=capacity / GPU_MILLI_WHOLE,
                    failed_cpu_only=failed_cpu_only,
                    failed_cpu_only_cores=failed_cpu_milli / 1000,
                )
            )
    return SaturationResult(
        trace_name=trace_name,
        policy_name=policy.name,
        capacity_gpus=capacity / GPU_MILLI_WHOLE,
        points=tuple(points),
        placed=placed,
        failed=failed,
        wall_s=time.perf_counter() - wall0,
    )


def table_rows(results: Sequence[SaturationResult]) -> list[list[str]]:
    """One row per (policy, target): the GPU demand arrived when the target was reached (at
    or past it: tasks arrive whole), allocated and unallocated shares of GPU capacity, and how
    much less is unallocated than under bestfit at the same target (when bestfit ran)."""
    base = {p.target: p for r in results if r.policy_name == "bestfit" for p in r.points}
    rows: list[list[str]] = []
    for r in results:
        for p in r.points:
            ref = base.get(p.target)
            if ref is None or r.policy_name == "bestfit" or ref.failed_gpus == 0:
                vs = "—"
            else:
                vs = f"{(p.failed_gpus / ref.failed_gpus - 1) * 100:+.0f} %"
            rows.append(
                [
                    r.policy_name,
                    f"{p.arrived_share * 100:.2f} %",
                    f"{p.allocated_share * 100:.2f} %",
                    f"{p.unallocated_share * 100:.2f} %",
                    f"{p.failed_gpus:,.1f}",
                    vs,
                    f"{p.failed_cpu_only:,} ({p.failed_cpu_only_cores:,.0f} cores)",
                ]
            )
    return rows


TABLE_HEADER = (
    "placement",
    "GPU demand arrived",
    "GPU allocated",
    "GPU unallocated",
    "unallocated GPUs",
    "unallocated vs bestfit",
    "failed CPU-only tasks",
)

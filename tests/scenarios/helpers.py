"""Shared pieces of the scenario tables: a running-job helper, a compact decision view, and a
case of the queue tables run through one cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from aisched.core.cycle import CycleResult, run_cycle
from aisched.core.decisions import Bind, Preempt, Reserve, Shrink, TaskBinding
from aisched.core.policy import preset
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.testing import JobBuilder, cluster, node


def running(
    job: Job,
    *placements: tuple[str, tuple[int, ...]],
    started_s: float = 0.0,
    expected_end_s: float | None = None,
    checkpoint_s: float | None = None,
) -> RunningJob:
    """A running job: one task per (node, GPU indices) placement, its first group's request."""
    g = job.groups[0]
    tasks = tuple(
        TaskBinding(
            g.name,
            i,
            node,
            gpus,
            1000 if gpus else 0,
            g.request.milli_cpu,
            g.request.mem_mib,
            g.request.gpu_mem_mib,
        )
        for i, (node, gpus) in enumerate(placements)
    )
    return RunningJob(
        job, tasks, started_s, expected_end_s=expected_end_s, last_checkpoint_s=checkpoint_s
    )


def summary(result: CycleResult) -> list[tuple[str, ...]]:
    """Decisions as short tuples: ("bind", job, "node:gpus", ...), ("preempt", victim, for),
    ("shrink", job, for, "node:gpus" of each task it keeps, ...)."""
    out: list[tuple[str, ...]] = []
    for d in result.decisions:
        if isinstance(d, Bind):
            out.append(
                ("bind", d.job_id, *(f"{t.node}:{','.join(map(str, t.gpus))}" for t in d.tasks))
            )
        elif isinstance(d, Preempt):
            out.append(("preempt", d.job_id, d.for_job))
        elif isinstance(d, Shrink):
            out.append(
                (
                    "shrink",
                    d.job_id,
                    d.for_job,
                    *(f"{t.node}:{','.join(map(str, t.gpus))}" for t in d.keep),
                )
            )
        elif isinstance(d, Reserve):
            out.append(("reserve", d.job_id, *d.nodes))
    return out


@dataclass
class QueueCase:
    """A scenario on one node of `gpus` GPUs with queues: the jobs waiting, those running, and
    what one cycle of `policy` must decide (`summary`) and say of some (`want_status`)."""

    name: str
    jobs: list[JobBuilder]
    want: list[tuple[str, ...]]
    want_status: dict[str, StatusCode] = field(default_factory=dict)
    running: list[RunningJob] = field(default_factory=list)
    policy: str = "fifo"
    gpus: int = 8


def check_queue_case(case: QueueCase, queues: QueueTree) -> None:
    snap = snapshot_of(cluster(node("n1").gpus(case.gpus)), case.running, queues)
    pending = [j.pending() for j in case.jobs]
    result = run_cycle(snap, pending, preset(case.policy), 0.0, validate=True)
    assert summary(result) == case.want
    got = {k: result.diagnostics[k].code for k in case.want_status}
    assert got == case.want_status

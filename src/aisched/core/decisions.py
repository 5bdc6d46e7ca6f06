"""Decisions a cycle hands to whoever acts on them (the service's executor or the simulator).

Decisions are nouns; they say what should happen, not how. `Bind.after` lists jobs that must
have stopped (victims) or given up tasks (shrunk elastic jobs) before the bound job may start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TaskBinding:
    """One task on one node, with the concrete GPU indices it gets on that node.

    `gpu_milli` is the share taken on each listed GPU: 1000 for whole devices, less for a task
    that shares its single GPU.
    """

    group: str
    index: int
    node: str
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    milli_cpu: int = 0
    mem_mib: int = 0
    gpu_mem_mib: int = 0
    rdma: int = 0  # RDMA devices of the node it holds


@dataclass(frozen=True, slots=True)
class Bind:
    job_id: str
    tasks: tuple[TaskBinding, ...]
    after: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str
    for_job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Shrink:
    """A running elastic job goes on with fewer tasks: `keep` (at least its `min_available`)
    stay where they are, the rest are given up for `for_job`. The job keeps running; how it
    gets there (the live service and the simulator restart it from its checkpoint on `keep`)
    is for whoever acts on the decision."""

    job_id: str
    keep: tuple[TaskBinding, ...]
    for_job: str
    reason: str

    @property
    def tasks(self) -> int:
        return len(self.keep)


@dataclass(frozen=True, slots=True)
class Reserve:
    """Capacity held for a blocked job: on these nodes, from `start_s` (None: not yet known),
    the resources of `tasks` (its placement at that start; GPU indices included). Work that
    leaves those free at the start may run beside it (backfill)."""

    job_id: str
    nodes: tuple[str, ...]
    start_s: float | None
    tasks: tuple[TaskBinding, ...] = ()


Decision = Bind | Preempt | Shrink | Reserve

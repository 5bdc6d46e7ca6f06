"""The workload's task mix: how often each GPU shape of task has been seen.

The fragmentation score (FGD) judges a node's free GPU against the tasks that are likely to
come, so it needs this distribution. A shape is the GPU part of a task's request (whole GPUs or
a share of one, and the allowed GPU models); the CPU and memory of a shape are the mean of the
tasks counted under it, enough to tell how many of them a node's CPUs can still feed, and the
largest of them, which says where every task of the shape fits.

`TaskMix` is an immutable input of a cycle (`Snapshot.task_mix`). `TaskMixTally` is the counter
a caller (the simulator, the service) keeps as tasks arrive; it is plain arithmetic, no I/O.
CPU-only tasks are counted as seen but left out of the mix: they use no GPU, so they cannot tell
one node's free GPU from another's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

# (whole GPUs, share of one GPU in milli, allowed GPU models); exactly one of the first two is 0.
ShapeKey = tuple[int, int, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class TaskShape:
    """One GPU shape of task and its share of the mix (weights of a mix sum to 1)."""

    gpu: int
    gpu_milli: int
    milli_cpu: int
    mem_mib: int
    gpu_models: tuple[str, ...]
    weight: float
    # The largest CPU and memory request among the shape's tasks (0: the mean's).
    max_milli_cpu: int = 0
    max_mem_mib: int = 0

    @property
    def per_gpu_milli(self) -> int:
        """What the shape needs free on each GPU it uses: a whole GPU, or its share."""
        return GPU_MILLI_WHOLE if self.gpu else self.gpu_milli

    @property
    def num_gpus(self) -> int:
        return self.gpu if self.gpu else 1

    @property
    def fit_milli_cpu(self) -> int:
        """The CPU a node must have free for every task of the shape to fit."""
        return max(self.max_milli_cpu, self.milli_cpu)

    @property
    def fit_mem_mib(self) -> int:
        return max(self.max_mem_mib, self.mem_mib)


@dataclass(frozen=True, slots=True)
class TaskMix:
    shapes: tuple[TaskShape, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.shapes)


def shape_key(request: Resources, gpu_models: tuple[str, ...]) -> ShapeKey | None:
    """The GPU shape of one task, or None for a task that uses no GPU."""
    if request.gpu:
        return (request.gpu, 0, gpu_models)
    if request.gpu_milli:
        return (0, request.gpu_milli, gpu_models)
    return None


class TaskMixTally:
    """Counts tasks by GPU shape as they are seen; `mix()` is the normalised distribution."""

    __slots__ = ("_counts", "_cpu", "_mem", "_cpu_max", "_mem_max", "_cached")

    def __init__(self) -> None:
        self._counts: dict[ShapeKey, int] = {}
        self._cpu: dict[ShapeKey, int] = {}
        self._mem: dict[ShapeKey, int] = {}
        self._cpu_max: dict[ShapeKey, int] = {}
        self._mem_max: dict[ShapeKey, int] = {}
        self._cached: TaskMix | None = None

    def add_job(self, job: Job) -> None:
        for g in job.groups:
            self.add(g.request, job.gpu_models, g.replicas)

    def add(self, request: Resources, gpu_models: tuple[str, ...] = (), count: int = 1) -> None:
        key = shape_key(request, gpu_models)
        if key is None or count <= 0:
            return
        self._counts[key] = self._counts.get(key, 0) + count
        self._cpu[key] = self._cpu.get(key, 0) + request.milli_cpu * count
        self._mem[key] = self._mem.get(key, 0) + request.mem_mib * count
        self._cpu_max[key] = max(self._cpu_max.get(key, 0), request.milli_cpu)
        self._mem_max[key] = max(self._mem_max.get(key, 0), request.mem_mib)
        self._cached = None

    def mix(self) -> TaskMix:
        if self._cached is None:
            total = sum(self._counts.values())
            shapes = tuple(
                TaskShape(
                    gpu=key[0],
                    gpu_milli=key[1],
                    milli_cpu=self._cpu[key] // n,
                    mem_mib=self._mem[key] // n,
                    gpu_models=key[2],
                    weight=n / total,
                    max_milli_cpu=self._cpu_max[key],
                    max_mem_mib=self._mem_max[key],
                )
                # Sorted, so equal tallies give equal mixes whatever the arrival order.
                for key, n in sorted(self._counts.items())
            )
            self._cached = TaskMix(shapes)
        return self._cached


def mix_of(jobs: Iterable[Job]) -> TaskMix:
    """The mix of a set of jobs, each task counted once."""
    tally = TaskMixTally()
    for job in jobs:
        tally.add_job(job)
    return tally.mix()

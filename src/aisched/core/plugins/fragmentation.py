"""Fragmentation-aware placement, in the spirit of FGD (Weng et al., USENIX ATC '23).

A node's free GPU is a *fragment* for a task shape when that shape cannot use it: all of the
node's free GPU if the shape cannot run there at all (too few CPUs or too little memory left
for the shape's largest task, with `fit_by="largest"`, the default, or for its mean task with
`"mean"`; a GPU model it may not use; too few GPUs with room), else the free share of each GPU
that has less room than the shape needs on one GPU, and (with `feed`, the default) the free GPU
that the node's free CPU and memory cannot feed: with 20 cores left, tasks of 10 cores per GPU
can use two free GPUs however many there are. The node's expected fragmentation is that amount
averaged over the workload's task mix (`Session.task_mix`), each shape weighted by its share of
the GPU demand (`weigh_by="gpu"`, the default) or of the tasks (`"tasks"`, the paper's
weighting). The score places a task where the expected fragmentation grows least (the
"gradient" of FGD), and the same measure picks the GPU of a node that a shared-GPU task goes to.

Judging where a shape fits by its largest task keeps the nodes that only its big tasks fit
(8 GPUs and 120 cores need the 128-core nodes) for them: filling such a node with small tasks
loses the shape there, which the measure now sees. `feed=False, weigh_by="tasks",
fit_by="mean"` is the measure of the paper's simulator (`GetNodePodFrag`: a shape either fits
the node's free CPU or strands all of its free GPU), except that memory is checked too. The
defaults strand less GPU on the openb trace (docs/benchmarks.md).

Everything is numpy over (nodes, GPUs, shapes); a cycle turns the mix into arrays once.
GPU memory is not part of the measure (feasibility already checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aisched.core.snapshot import BoolArray, FloatArray, IntArray
from aisched.core.taskmix import TaskMix
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

if TYPE_CHECKING:
    from aisched.core.session import Session


@dataclass(frozen=True, slots=True, eq=False)
class MixArrays:
    """The task mix as arrays over its K shapes, and where each shape may run."""

    need: IntArray  # (K,) milli-GPU a shape needs free on each GPU it uses
    count: IntArray  # (K,) GPUs a shape uses
    cpu: IntArray  # (K,) of the mean task
    mem: IntArray  # (K,)
    fit_cpu: IntArray  # (K,) free CPU a node needs for the shape to "fit" (Measure.fit_largest)
    fit_mem: IntArray  # (K,)
    demand: FloatArray  # (K,) milli-GPU one task of the shape takes
    weight: FloatArray  # (K,) sums to 1
    allowed: BoolArray  # (N, K): the node's GPU model is allowed for the shape
    feed: bool  # count free GPU that the free CPU and memory cannot feed as fragment

    @property
    def empty(self) -> bool:
        return len(self.need) == 0


@dataclass(frozen=True, slots=True)
class Measure:
    """Which fragmentation is measured (see the module docstring): shapes weighted by their
    share of the GPU demand (`by_gpu`) or of the tasks; free GPU that free CPU and memory
    cannot feed counted (`feed`); a shape fitting where its largest task fits (`fit_largest`)
    or its mean one."""

    by_gpu: bool = True
    feed: bool = True
    fit_largest: bool = True


def mix_arrays(session: Session, measure: Measure = Measure()) -> MixArrays:
    """The session's task mix as arrays for `measure` (memoised for the cycle)."""
    mix = session.task_mix
    key = ("fgd-mix", id(mix), measure)
    hit = session.memo.get(key)
    if hit is None:
        hit = session.memo[key] = _build(session, mix, measure)
    return hit  # type: ignore[return-value]


def _build(session: Session, mix: TaskMix, measure: Measure) -> MixArrays:
    from aisched.core.placement import base_mask

    shapes = mix.shapes
    n = session.arrays.num_nodes
    allowed = np.ones((n, len(shapes)), dtype=np.bool_)
    for k, s in enumerate(shapes):
        if s.gpu_models:
            allowed[:, k] = base_mask(session, s.gpu_models)
    need = np.array([s.per_gpu_milli for s in shapes], dtype=np.int64)
    count = np.array([s.num_gpus for s in shapes], dtype=np.int64)
    demand = (need * count).astype(np.float64)
    weight = np.array([s.weight for s in shapes], dtype=np.float64)
    if measure.by_gpu and len(shapes):
        # The share of the GPU that arrives in each shape: an 8-GPU task weighs as much as
        # eight 1-GPU tasks, a 0.25 share a quarter of one.
        weight = weight * demand
        weight = weight / weight.sum()
    cpu = np.array([s.milli_cpu for s in shapes], dtype=np.int64)
    mem = np.array([s.mem_mib for s in shapes], dtype=np.int64)
    largest = measure.fit_largest
    return MixArrays(
        need=need,
        count=count,
        cpu=cpu,
        mem=mem,
        fit_cpu=np.array([s.fit_milli_cpu for s in shapes], dtype=np.int64) if largest else cpu,
        fit_mem=np.array([s.fit_mem_mib for s in shapes], dtype=np.int64) if largest else mem,
        demand=demand,
        weight=weight,
        allowed=allowed,
        feed=measure.feed,
    )


def _parts(m: MixArrays, free_gpu: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Per node and shape: free GPU too small for the shape (stranded), GPUs with room for it
    (usable); and per node the free GPU in all."""
    g = free_gpu[:, :, None]  # (N, G, 1) against (K,)
    short = g < m.need
    stranded = (g * short).sum(axis=1)
    usable = (~short & (g > 0)).sum(axis=1)
    return stranded, usable, free_gpu.sum(axis=1)


def _combine(
    m: MixArrays,
    stranded: IntArray,
    usable: IntArray,
    total: IntArray,
    free_cpu: IntArray,
    free_mem: IntArray,
    allowed: BoolArray,
) -> FloatArray:
    """Expected fragment per state: `stranded` and `usable` end in the K axis, the others
    broadcast against them (`total`, `free_cpu`, `free_mem` without it)."""
    cpu, mem = free_cpu[..., None], free_mem[..., None]
    # A shape runs on a node only where its largest task would fit: where only its smaller
    # tasks fit, the node's GPUs count as lost for the shape, so the nodes that its big tasks
    # need are kept for them.
    fits = allowed & (cpu >= m.fit_cpu) & (mem >= m.fit_mem) & (usable >= m.count)
    whole = total[..., None]
    if not m.feed:
        frag = np.where(fits, stranded, whole)
        return np.asarray(frag @ m.weight, dtype=np.float64)
    # How many tasks of each shape the free CPU and memory can still feed, as a fraction
    # (the tasks of a shape vary around its mean), and so how much of the GPU with room for
    # the shape they can use; the rest is fragment too.
    tasks = np.minimum(_ratio(cpu, m.cpu), _ratio(mem, m.mem))
    used = np.minimum(whole - stranded, tasks * m.demand)
    frag_f = np.where(fits, whole - used, whole)
    return np.asarray(frag_f @ m.weight, dtype=np.float64)


def _ratio(free: IntArray, per_task: IntArray) -> FloatArray:
    """Tasks of `per_task` each that `free` holds; inf where a shape asks for none."""
    return np.where(per_task > 0, free / np.maximum(per_task, 1), np.inf)


def fragmentation_growth(
    session: Session,
    request: Resources,
    nodes: IntArray,
    measure: Measure = Measure(),
) -> tuple[FloatArray, FloatArray | None]:
    """How much the expected fragmentation of each node in `nodes` grows if one task of
    `request` goes there: (growth per node, growth per (node, GPU) for a shared-GPU task, inf
    where the GPU has no room; None otherwise)."""
    m = mix_arrays(session, measure)
    if m.empty or len(nodes) == 0:
        return np.zeros(len(nodes), dtype=np.float64), None
    f = session.free
    gpu = f.gpu_milli[nodes]
    cpu, mem = f.cpu[nodes], f.mem[nodes]
    allowed = m.allowed[nodes]
    stranded, usable, total = _parts(m, gpu)
    before = _combine(m, stranded, usable, total, cpu, mem, allowed)
    cpu_after, mem_after = cpu - request.milli_cpu, mem - request.mem_mib
    if request.gpu_milli and not request.gpu:
        # One candidate per GPU; only that GPU changes, so update the parts instead of
        # recomputing them: (N, G candidates, K).
        share = request.gpu_milli
        old = gpu[:, :, None]
        new = np.maximum(old - share, 0)
        need = m.need
        stranded_after = stranded[:, None, :] - old * (old < need) + new * (new < need)
        usable_after = (
            usable[:, None, :]
            - ((old >= need) & (old > 0)).astype(np.int64)
            + ((new >= need) & (new > 0)).astype(np.int64)
        )
        after = _combine(
            m,
            stranded_after,
            usable_after,
            (total - share)[:, None],
            cpu_after[:, None],
            mem_after[:, None],
            allowed[:, None, :],
        )
        per_gpu = np.where(gpu >= share, after - before[:, None], np.inf)
        return per_gpu.min(axis=1), per_gpu
    # Whole GPUs (or none): which full GPUs go does not matter to the measure, and a full GPU
    # is never stranded and has room for every shape, so taking one only lowers the usable
    # count and the total; the parts need no recomputing.
    taken = np.minimum((gpu == GPU_MILLI_WHOLE).sum(axis=1), request.gpu)
    after = _combine(
        m,
        stranded,
        usable - taken[:, None],
        total - taken * GPU_MILLI_WHOLE,
        cpu_after,
        mem_after,
        allowed,
    )
    return after - before, None


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """`fgd`: the node (and GPU) where the cluster's expected fragmentation grows least.

    `weigh_by`: "gpu" weighs the shapes of the mix by their share of the GPU demand, "tasks" by
    their share of the tasks. `feed`: free GPU that the node's free CPU and memory cannot feed
    counts as fragment (else only a node too short of CPU or memory for one task strands it).
    `fit_by`: "largest" judges where a shape fits by its largest task, "mean" by its mean one.
    """

    name: str = "fgd"
    weigh_by: str = "gpu"
    feed: bool = True
    fit_by: str = "largest"

    def __post_init__(self) -> None:
        if self.weigh_by not in ("gpu", "tasks"):
            raise ValueError(f"weigh_by must be 'gpu' or 'tasks', got {self.weigh_by!r}")
        if self.fit_by not in ("largest", "mean"):
            raise ValueError(f"fit_by must be 'largest' or 'mean', got {self.fit_by!r}")

    @property
    def measure(self) -> Measure:
        return Measure(self.weigh_by == "gpu", self.feed, self.fit_by == "largest")

    def _growth(
        self, session: Session, request: Resources, nodes: IntArray
    ) -> tuple[FloatArray, FloatArray | None]:
        return fragmentation_growth(session, request, nodes, self.measure)

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        growth, _ = self._growth(session, request, nodes)
        # Growths equal but for float rounding (the same sums taken in another order) must
        # tie; 1e-6 milli-GPU is far below any real difference.
        growth = np.round(growth, 6)
        # Ties (common: a CPU-only task grows nothing on most nodes) go to the lowest node
        # index. Breaking them by best fit or worst fit instead left more GPU unallocated on
        # openb (docs/benchmarks.md), so they are left alone.
        return -growth

    def choose_gpu(
        self, session: Session, job: Job, request: Resources, node: int, candidates: IntArray
    ) -> int:
        _, per_gpu = self._growth(session, request, np.array([node], dtype=np.int64))
        if per_gpu is None:
            return int(candidates[0])
        growth = per_gpu[0][candidates]
        free = session.free.gpu_milli[node][candidates]
        # Least growth; among equals the fullest GPU, then the lowest index.
        return int(candidates[np.lexsort((candidates, free, growth))[0]])

"""Placement scores. Each returns raw values over feasible nodes (higher is better); the
framework normalises and weights them.

binpack fills the fullest nodes first (less fragmentation for large jobs later); spread does
the opposite (less interference). Both keep CPU-only tasks off GPU nodes when they can, since
a GPU node's CPUs are what its GPUs need. `topology` prefers nodes that can host more of the
gang's tasks, and its presence turns on the rack/zone packing search in placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aisched.core.snapshot import ClusterArrays, FloatArray, IntArray
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

if TYPE_CHECKING:
    from aisched.core.session import Session

GPU_WEIGHT = 3.0
CPU_ONLY_ON_GPU_NODE_PENALTY = 1.0


def _capacities(arrays: ClusterArrays) -> tuple[IntArray, IntArray, IntArray]:
    """Each node's CPU, memory and GPU capacity (GPU-milli) as the score divides by them (at
    least 1 CPU-milli, 1 MiB, 1 GPU): fixed with the cluster, so worked out once."""
    hit = arrays.memo.get("score-capacities")
    if hit is None:
        whole = np.maximum(arrays.num_gpus, 1) * GPU_MILLI_WHOLE
        hit = arrays.memo["score-capacities"] = (
            np.maximum(arrays.cap_cpu, 1),
            np.maximum(arrays.cap_mem, 1),
            whole,
        )
    return hit  # type: ignore[return-value]


def utilisation_after(session: Session, request: Resources, nodes: IntArray) -> FloatArray:
    """Weighted share of each node in use once one task of `request` is added."""
    f = session.free
    caps = _capacities(session.arrays)
    cap_cpu, cap_mem = caps[0][nodes], caps[1][nodes]
    total = (cap_cpu - f.cpu[nodes] + request.milli_cpu) / cap_cpu
    total = total + (cap_mem - f.mem[nodes] + request.mem_mib) / cap_mem
    weight = 2.0
    if request.gpu or request.gpu_milli:
        cap_gpu = caps[2][nodes]
        used = cap_gpu - f.gpu_total[nodes]
        add = request.gpu * GPU_MILLI_WHOLE + request.gpu_milli
        total = total + GPU_WEIGHT * (used + add) / cap_gpu
        weight += GPU_WEIGHT
    return np.asarray(total / weight, dtype=np.float64)


def _less_cpu_only_penalty(
    session: Session, request: Resources, nodes: IntArray, score: FloatArray
) -> FloatArray:
    """`score` less the penalty on GPU nodes for a CPU-only task (none for a GPU task)."""
    if request.gpu or request.gpu_milli:
        return score
    has_gpu = session.arrays.num_gpus[nodes] > 0
    return score - np.where(has_gpu, CPU_ONLY_ON_GPU_NODE_PENALTY, 0.0)


@dataclass(frozen=True, slots=True)
class BinPack:
    name: str = "binpack"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return _less_cpu_only_penalty(
            session, request, nodes, utilisation_after(session, request, nodes)
        )


@dataclass(frozen=True, slots=True)
class Spread:
    name: str = "spread"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return _less_cpu_only_penalty(
            session, request, nodes, -utilisation_after(session, request, nodes)
        )


@dataclass(frozen=True, slots=True)
class TopologyLocality:
    name: str = "topology"

    def uniform(self, job: Job) -> bool:
        """One task scores alike everywhere (`Score.uniform`)."""
        return job.num_tasks == 1

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        from aisched.core.placement import fit_counts

        if job.num_tasks == 1:
            return np.ones(len(nodes), dtype=np.float64)
        counts = fit_counts(session, request, job.gpu_models)[nodes]
        return np.minimum(counts, job.num_tasks).astype(np.float64)

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

from aisched.core.snapshot import FloatArray, IntArray
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

if TYPE_CHECKING:
    from aisched.core.session import Session

GPU_WEIGHT = 3.0
CPU_ONLY_ON_GPU_NODE_PENALTY = 1.0


def utilisation_after(session: Session, request: Resources, nodes: IntArray) -> FloatArray:
    """Weighted share of each node in use once one task of `request` is added."""
    a, f = session.arrays, session.free
    cap_cpu = np.maximum(a.cap_cpu[nodes], 1)
    cap_mem = np.maximum(a.cap_mem[nodes], 1)
    total = (cap_cpu - f.cpu[nodes] + request.milli_cpu) / cap_cpu
    total = total + (cap_mem - f.mem[nodes] + request.mem_mib) / cap_mem
    weight = 2.0
    if request.gpu or request.gpu_milli:
        ngpu = np.maximum(a.num_gpus[nodes], 1)
        used = ngpu * GPU_MILLI_WHOLE - f.gpu_total[nodes]
        add = request.gpu * GPU_MILLI_WHOLE + request.gpu_milli
        total = total + GPU_WEIGHT * (used + add) / (ngpu * GPU_MILLI_WHOLE)
        weight += GPU_WEIGHT
    return np.asarray(total / weight, dtype=np.float64)


def _cpu_only_penalty(session: Session, request: Resources, nodes: IntArray) -> FloatArray:
    if request.gpu or request.gpu_milli:
        return np.zeros(len(nodes), dtype=np.float64)
    has_gpu = session.arrays.num_gpus[nodes] > 0
    return np.where(has_gpu, CPU_ONLY_ON_GPU_NODE_PENALTY, 0.0)


@dataclass(frozen=True, slots=True)
class BinPack:
    name: str = "binpack"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return utilisation_after(session, request, nodes) - _cpu_only_penalty(
            session, request, nodes
        )


@dataclass(frozen=True, slots=True)
class Spread:
    name: str = "spread"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return -utilisation_after(session, request, nodes) - _cpu_only_penalty(
            session, request, nodes
        )


@dataclass(frozen=True, slots=True)
class TopologyLocality:
    name: str = "topology"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        from aisched.core.placement import fit_counts

        if job.num_tasks == 1:
            return np.ones(len(nodes), dtype=np.float64)
        counts = fit_counts(session, request, job.gpu_models)[nodes]
        return np.minimum(counts, job.num_tasks).astype(np.float64)

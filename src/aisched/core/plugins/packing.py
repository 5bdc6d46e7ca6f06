"""Baseline placement scores for GPU-sharing clusters, the ones FGD is measured against.

- `bestfit`: the node left with the least free CPU and GPU after the task (weighted 1:1, each
  in units of the largest node of the cluster); a shared task takes the fullest GPU that fits.
- `worstfit`: the opposite, the node left with the most; a shared task takes the emptiest GPU.
- `dotprod`: Tetris' alignment: the node whose free (CPU, GPU) vector has the smallest dot
  product with the task's demand, so big free nodes are kept for big tasks.
- `random`: a pseudo-random node and GPU, drawn from `seed`, the job id and the node index, so
  the same input always gives the same choice (the core has no unseeded randomness).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt

from aisched.core.snapshot import FloatArray, IntArray
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

if TYPE_CHECKING:
    from aisched.core.session import Session


def _scales(session: Session) -> tuple[float, float]:
    """The largest node's CPU and GPU (milli), to put both on one scale."""
    a = session.arrays
    cpu = float(a.cap_cpu.max()) if a.num_nodes else 1.0
    gpu = float(a.num_gpus.max()) * GPU_MILLI_WHOLE if a.num_nodes else 1.0
    return max(cpu, 1.0), max(gpu, 1.0)


def left_after(session: Session, request: Resources, nodes: IntArray) -> FloatArray:
    """Free CPU and GPU left on each node after one task, weighted 1:1 on the cluster's scale."""
    cpu_scale, gpu_scale = _scales(session)
    f = session.free
    cpu_left = (f.cpu[nodes] - request.milli_cpu) / cpu_scale
    gpu_left = (f.gpu_total[nodes] - request.gpu_equivalent_milli) / gpu_scale
    return np.asarray(0.5 * cpu_left + 0.5 * gpu_left, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class BestFit:
    name: str = "bestfit"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return -left_after(session, request, nodes)

    def choose_gpu(
        self, session: Session, job: Job, request: Resources, node: int, candidates: IntArray
    ) -> int:
        free = session.free.gpu_milli[node][candidates]
        return int(candidates[np.lexsort((candidates, free))[0]])


@dataclass(frozen=True, slots=True)
class WorstFit:
    name: str = "worstfit"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return left_after(session, request, nodes)

    def choose_gpu(
        self, session: Session, job: Job, request: Resources, node: int, candidates: IntArray
    ) -> int:
        free = session.free.gpu_milli[node][candidates]
        return int(candidates[np.lexsort((candidates, -free))[0]])


@dataclass(frozen=True, slots=True)
class DotProduct:
    name: str = "dotprod"

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        cpu_scale, gpu_scale = _scales(session)
        f = session.free
        dot = (f.cpu[nodes] / cpu_scale) * (request.milli_cpu / cpu_scale) + (
            f.gpu_total[nodes] / gpu_scale
        ) * (request.gpu_equivalent_milli / gpu_scale)
        return np.asarray(-dot, dtype=np.float64)


_MASK64 = (1 << 64) - 1


def _mix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: spreads consecutive integers over 64 bits."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x


def draws(seed: int, key: str, values: IntArray) -> FloatArray:
    """A reproducible uniform draw in [0, 1) for each value, fixed by (seed, key, value)."""
    base = (zlib.crc32(key.encode()) * 0x9E3779B97F4A7C15 + seed * 0xD1B54A32D192ED03) & _MASK64
    with np.errstate(over="ignore"):
        mixed = _mix64(values.astype(np.uint64) + np.uint64(base))
    return np.asarray((mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53))


@dataclass(frozen=True, slots=True)
class RandomFit:
    name: str = "random"
    seed: int = 0
    # Draws depend on the job's id, not only its shape: placement outcomes are per job.
    per_job: ClassVar[bool] = True

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        return draws(self.seed, job.id, nodes)

    def choose_gpu(
        self, session: Session, job: Job, request: Resources, node: int, candidates: IntArray
    ) -> int:
        return int(candidates[int(np.argmax(draws(self.seed, f"{job.id}@{node}", candidates)))])

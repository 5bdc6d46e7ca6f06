"""Heterogeneity-aware scores: which GPU model a job should get, not only whether it fits.

- `hetero`: a speed table per GPU model (`model.gpu_speed`); long or large jobs (by the
  attached estimate, else the job's own, else its time limit) go to the
  fastest model with room, where the speed-up saves the most GPU-hours; jobs known to be short
  and small go to the slowest, leaving fast GPUs free for the jobs that gain from them. A job
  whose runtime is unknown and that is small is left to the other scores.
- `gpu-preference`: nodes of one of the job's preferred models (`Job.gpu_models_preferred`)
  first; a preference never makes a node infeasible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from aisched.core.snapshot import FloatArray, IntArray
from aisched.model.gpu_speed import GpuSpeeds
from aisched.model.job import Job
from aisched.model.resources import Resources

if TYPE_CHECKING:
    from aisched.core.session import Session


def node_speeds(session: Session, speeds: GpuSpeeds) -> FloatArray:
    """Speed of each node's GPU model (the default for CPU-only nodes); memoised per cluster."""
    arrays = session.arrays
    key = ("gpu-speeds", speeds)
    hit = arrays.memo.get(key)
    if hit is None:
        by_code = [speeds.speed(m) for m in arrays.models]
        hit = np.array(
            [by_code[c] if c >= 0 else speeds.default for c in arrays.model_code.tolist()],
            dtype=np.float64,
        )
        arrays.memo[key] = hit
    return hit  # type: ignore[return-value]


def expected_runtime(session: Session, job: Job) -> float | None:
    """The estimate attached to the pending job (a predictor's), else the job's own, else its
    time limit; None when nothing is known."""
    by_id = session.memo.get("pending-by-id")
    if by_id is None:
        by_id = session.memo["pending-by-id"] = {pj.id: pj for pj in session.pending}
    pj = by_id.get(job.id)  # type: ignore[attr-defined]
    if pj is not None and pj.estimate_s is not None:
        return float(pj.estimate_s)
    return job.estimate_s if job.estimate_s is not None else job.time_limit_s


@dataclass(frozen=True, slots=True)
class Heterogeneity:
    name: str = "hetero"
    # {model: speed}; None for the default table.
    speeds: Any = None
    long_s: float = 3600.0
    large_gpus: float = 2.0
    _table: GpuSpeeds = field(default=GpuSpeeds(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # `not x >= 0` refuses NaN too, with which every job would be neither large nor long.
        if not self.long_s >= 0:
            raise ValueError(f"long_s must be 0 or more, got {self.long_s}")
        if not self.large_gpus >= 0:
            raise ValueError(f"large_gpus must be 0 or more, got {self.large_gpus}")
        if self.speeds is None:
            return
        if not isinstance(self.speeds, Mapping) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in self.speeds.values()
        ):
            raise ValueError("speeds: expected a mapping of GPU model to speed, e.g. {T4: 0.4}")
        object.__setattr__(self, "_table", GpuSpeeds.of_mapping(self.speeds))
        object.__setattr__(self, "speeds", tuple(sorted(self.speeds.items())))

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        speed = node_speeds(session, self._table)[nodes]
        runtime = expected_runtime(session, job)
        if job.num_gpus >= self.large_gpus or (runtime is not None and runtime >= self.long_s):
            return speed
        if runtime is not None:
            return -speed
        return np.zeros(len(nodes), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class PreferredModel:
    name: str = "gpu-preference"

    def uniform(self, job: Job) -> bool:
        """A job without preferred models scores alike everywhere (`Score.uniform`)."""
        return not job.gpu_models_preferred

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        if not job.gpu_models_preferred:
            return np.zeros(len(nodes), dtype=np.float64)
        arrays = session.arrays
        codes = [i for i, m in enumerate(arrays.models) if m in job.gpu_models_preferred]
        return np.isin(arrays.model_code[nodes], codes).astype(np.float64)

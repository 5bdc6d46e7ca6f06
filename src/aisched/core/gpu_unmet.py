"""What a job asks of a GPU that no GPU of the cluster offers: a model, or memory per GPU.

Said beside a never-fits reason (`placement.never_fits`), whose room count ("room for 0 of 1
tasks") is true but does not say that the cause is the model asked for, or a GPU memory size
that the cluster's GPUs do not reach or do not declare (GPUs declared without a size count as
having none).
"""

from __future__ import annotations

import numpy as np

from aisched.core.snapshot import ClusterArrays
from aisched.model.job import Job
from aisched.model.resources import describe_mib


def unmet_gpu_asks(arrays: ClusterArrays, job: Job) -> str | None:
    """Why no GPU of `arrays` could ever take a task of `job`, or None when some GPU could."""
    if job.gpu_models and not set(job.gpu_models) & set(arrays.models):
        here = ", ".join(repr(m) for m in arrays.models) or "none"
        asked = " or ".join(repr(m) for m in job.gpu_models)
        return f"no GPU here is of model {asked} (the models here: {here})"
    per_gpu = max(
        (_mem_per_gpu_mib(g.request.gpu, g.request.gpu_mem_mib) for g in job.groups), default=0
    )
    if per_gpu == 0:
        return None
    valid = arrays.gpu_valid
    if job.gpu_models:
        codes = [i for i, m in enumerate(arrays.models) if m in job.gpu_models]
        valid = valid & np.isin(arrays.model_code, codes)[:, None]
    asks = f"it asks for {describe_mib(per_gpu)} of memory per GPU"
    if not valid.any():
        return f"{asks}, and there is no GPU here"
    most = int(arrays.gpu_mem_cap[valid].max())
    if most >= per_gpu:
        return None
    if most == 0:
        return f"{asks}, and no GPU here has a known size"
    return f"{asks}, and the largest GPU here has {describe_mib(most)}"


def _mem_per_gpu_mib(gpus: int, gpu_mem_mib: int) -> int:
    """GPU memory one device must hold: a share's whole ask, or a whole-GPU ask spread over
    its devices (as placement divides it)."""
    return -(-gpu_mem_mib // gpus) if gpus else gpu_mem_mib

"""Elastic gangs: how many more tasks of a running job the idle capacity could take.

A job marked `elastic` starts with as many tasks as fit, at least `min_available` (placement
already does this, and its queue lets it in with as many as its limit has room for:
`core.queues.queue_takes`). When tasks of it are missing and capacity sits idle, the service
restarts it from its checkpoint to grow; this module answers only "how many more would fit",
counted per node over free CPU, memory and whole GPUs (a GPU share request counts free whole
GPUs too, which understates what shares could take, never overstates). Pure: arrays in, a
number out.
"""

from __future__ import annotations

import numpy as np

from aisched.core.snapshot import ClusterArrays, FreeState
from aisched.model.resources import Resources


def extra_tasks_fit(arrays: ClusterArrays, free: FreeState, request: Resources, limit: int) -> int:
    """Tasks of `request` that the healthy nodes' free capacity holds, at most `limit`."""
    if limit <= 0:
        return 0
    per_node = np.full(len(free.cpu), limit, dtype=np.int64)
    if request.milli_cpu > 0:
        per_node = np.minimum(per_node, free.cpu // request.milli_cpu)
    if request.mem_mib > 0:
        per_node = np.minimum(per_node, free.mem // request.mem_mib)
    gpus = request.gpu + (1 if request.gpu_milli else 0)
    if gpus > 0:
        per_node = np.minimum(per_node, free.whole // gpus)
    per_node = np.where(arrays.healthy, per_node, 0)
    return int(min(int(per_node.sum()), limit))

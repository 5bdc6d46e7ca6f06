"""How many more tasks of an elastic job the free capacity holds."""

from __future__ import annotations

import pytest

from aisched.core.elastic import extra_tasks_fit
from aisched.core.snapshot import FreeState, build_arrays
from aisched.model.cluster import Cluster
from aisched.model.resources import Resources
from aisched.testing import node

CLUSTER = Cluster(
    (
        node("a").gpus(4).cpus(8).build(),
        node("b").gpus(4).cpus(8).build(),
        node("down").gpus(4).cpus(8).unhealthy().build(),
    )
)


@pytest.mark.parametrize(
    ("request_", "limit", "want"),
    [
        (Resources(milli_cpu=1000, gpu=1), 100, 8),  # GPUs bound: 4 per healthy node
        (Resources(milli_cpu=1000, gpu=2), 100, 4),
        (Resources(milli_cpu=3000, gpu=1), 100, 4),  # CPUs bound: 2 per node
        (Resources(milli_cpu=1000, gpu=1), 3, 3),  # never more than asked
        (Resources(milli_cpu=1000, gpu_milli=500), 100, 8),  # a share counts a whole free GPU
        (Resources(milli_cpu=1000, gpu=1), 0, 0),
    ],
)
def test_extra_tasks_fit(request_: Resources, limit: int, want: int) -> None:
    arrays = build_arrays(CLUSTER)
    assert extra_tasks_fit(arrays, FreeState.empty(arrays), request_, limit) == want

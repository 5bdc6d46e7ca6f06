"""A queue tree refuses caps that contradict a guarantee, and says where the guarantees add up
to more than a cluster has (a warning: an autoscaled or overcommitted cluster may want it)."""

from __future__ import annotations

import pytest

from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Dim, Resources


def test_borrowing_false_without_a_guarantee_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^queue q: borrowing: false keeps it within its "):
        QueueTree((Queue("q", borrowing=False),))
    with pytest.raises(ValueError, match="queue q: borrowing: false"):  # a 0 guarantees nothing
        QueueTree((Queue("q", guarantee=Resources(gpu=0), borrowing=False),))


def test_a_limit_below_the_guarantee_is_refused_on_a_resource_it_names() -> None:
    with pytest.raises(ValueError) as err:
        QueueTree((Queue("q", guarantee=Resources(gpu=4), limit=Resources(gpu=3)),))
    assert str(err.value) == (
        "queue q: limit.gpus (3) is below guarantee.gpus (4): the queue could never hold what "
        "it is guaranteed"
    )
    zero = Queue(
        "q", guarantee=Resources(gpu_milli=500), limit=Resources(), limit_named=frozenset({Dim.GPU})
    )
    with pytest.raises(ValueError, match=r"limit.gpus \(0\) is below guarantee.gpus \(0.5\)"):
        QueueTree((zero,))
    # A limit that does not name the guaranteed resource does not cap it.
    QueueTree((Queue("q", guarantee=Resources(gpu=4), limit=Resources(milli_cpu=1000)),))


def test_guarantees_beyond_the_cluster_are_said_per_resource() -> None:
    tree = QueueTree(
        (
            Queue("a", guarantee=Resources(gpu=6, mem_mib=1024)),
            Queue("b", guarantee=Resources(gpu=4)),
            Queue("child", parent="b", guarantee=Resources(gpu=4)),  # inside its parent's
        )
    )
    assert tree.guarantees_beyond(Resources(milli_cpu=64_000, mem_mib=4096, gpu=8)) == [
        "the top-level queues' guarantees add up to 10 GPU, more than the cluster's 8 now: "
        "reclaim cannot give every queue its guarantee at once"
    ]
    assert tree.guarantees_beyond(Resources(mem_mib=1024, gpu=10)) == []

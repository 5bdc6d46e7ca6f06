"""A job that may not be evicted (`preemptible: false`) never starts on capacity guaranteed to
another queue: reclaim could not take it back, so a user of a queue without a guarantee could
keep the guaranteed queue's jobs waiting for as long as it ran. Such work beyond its own
top-level queue's guarantee must fit in what no queue is guaranteed (`queues.holds_others_
guarantee`), counted over every running job that may not be evicted."""

from __future__ import annotations

import pytest
from helpers import QueueCase, check_queue_case, running

from aisched.core.status import StatusCode
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import job

# 8 GPUs, 4 of them guaranteed to team: 4 are nobody's.
TEAM = QueueTree((Queue("team", guarantee=Resources(gpu=4)), Queue("default")))
NO_GUARANTEES = QueueTree((Queue("team"), Queue("default")))


def _held(name: str, queue: str, gpus: range, preemptible: bool = False) -> object:
    b = job(name).task(gpu=len(gpus)).queue(queue)
    return running((b if preemptible else b.not_preemptible()).build(), ("n1", tuple(gpus)))


CASES = [
    QueueCase(
        "up to what nobody is guaranteed, it starts",
        [job("pinned").task(gpu=4).queue("default").not_preemptible()],
        [("bind", "pinned", "n1:0,1,2,3")],
    ),
    QueueCase(
        "past it, it waits for its queue, though the GPUs are free",
        [job("pinned").task(gpu=4).queue("default").not_preemptible()],
        [],
        {"pinned": StatusCode.WAIT_QUEUE},
        running=[_held("earlier", "default", range(2))],
    ),
    QueueCase(
        "the same job, if it may be evicted, starts (reclaim can take it back)",
        [job("evictable").task(gpu=4).queue("default")],
        [("bind", "evictable", "n1:4,5,6,7")],
        running=[_held("earlier", "default", range(2))],
    ),
    QueueCase(
        "within its own queue's guarantee it starts beside others' unevictable work",
        [job("team-pinned").task(gpu=4).queue("team").not_preemptible()],
        [("bind", "team-pinned", "n1:4,5,6,7")],
        running=[_held("earlier", "default", range(4))],
    ),
    QueueCase(
        "one that may start with fewer tasks starts with its minimum where that alone fits",
        [job("few").gang(2, gpu=2).queue("default").min_available(1).not_preemptible()],
        [("bind", "few", "n1:2,3")],
        running=[_held("earlier", "default", range(2))],
    ),
    QueueCase(
        "evictable work held elsewhere does not count against it",
        [job("pinned").task(gpu=4).queue("default").not_preemptible()],
        [("bind", "pinned", "n1:4,5,6,7")],
        running=[_held("borrowed", "default", range(4), preemptible=True)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_unevictable_work_stays_off_other_queues_guarantees(case: QueueCase) -> None:
    check_queue_case(case, TEAM)


def test_without_guarantees_unevictable_work_takes_any_free_capacity() -> None:
    case = QueueCase(
        "no guarantee anywhere",
        [job("pinned").task(gpu=6).queue("default").not_preemptible()],
        [("bind", "pinned", "n1:2,3,4,5,6,7")],
        running=[_held("earlier", "default", range(2))],
    )
    check_queue_case(case, NO_GUARANTEES)

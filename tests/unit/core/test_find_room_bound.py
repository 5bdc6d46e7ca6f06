"""The search for room gives up at once when even every candidate taken would leave no room
(`eviction._room_with_all`). A job offered both task by task (its surplus, to shrink) and
whole (to evict) gives each of its tasks back once there, as the search itself does: counted
twice, a GPU read as more than whole, so not whole at all, and room that eviction makes was
missed (found by the plain-walk comparison of tests/property/test_preempt_walk.py)."""

from __future__ import annotations

from aisched.core.decisions import TaskBinding
from aisched.core.eviction import Cut, find_room
from aisched.core.policy import preset
from aisched.core.session import Session
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.testing import cluster, job, node, pending


def test_a_job_cut_both_ways_gives_its_tasks_back_once() -> None:
    elastic = job("e").task(2, gpu=1, name="w").elastic().min_available(1).build()
    tasks = tuple(TaskBinding("w", i, "n0", (i,), 1000) for i in range(2))
    e = RunningJob(elastic, tasks, 0.0)
    other = RunningJob(
        job("r").task(gpu=2).build(), (TaskBinding("g0", 0, "n0", (2, 3), 1000),), 0.0
    )
    snapshot = snapshot_of(cluster(node("n0").gpus(4).cpus(16).mem_gib(64)), (e, other))
    wants_two = job("p").task(gpu=2).build()
    session = Session(snapshot, preset("priority"), 0.0, pending(wants_two))
    # Shrinking e by its surplus task frees one GPU: not enough; evicting e frees two.
    room = find_room(session, wants_two, [Cut(e, tasks[1]), Cut(e)])
    assert room is not None
    assert [v.id for v in room.evicted] == ["e"]
    assert sorted(g for t in room.tasks for g in t.gpus) == [0, 1]

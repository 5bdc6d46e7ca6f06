"""Elastic jobs in the control loop: started with what fits, grown into idle capacity (restarted
from their checkpoint) once nothing waits, shrunk (restarted smaller on the tasks they keep)
rather than evicted when another job needs the room. A real SQLite store, a fake executor and a
fake clock (see test_loop.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from world import World, new_world

from aisched.model.job import Job
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


def elastic(workers: int, min_workers: int) -> Job:
    return replace(job("el").task(workers, gpu=1).min_available(min_workers).build(), elastic=True)


def world_sizes(w: World, job_id: str) -> list[str]:
    """WORLD_SIZE of every task launched for the job, in launch order."""
    return [t.env["WORLD_SIZE"] for t in w.fx.launched if t.job_id == job_id]


def test_an_elastic_job_shrinks_for_an_equal_priority_job_and_grows_back(w: World) -> None:
    el = w.submit(elastic(4, 1))
    assert len(w.fx.keys(el)) == 4  # at its max: all four GPUs
    other = w.submit(job("other").task(gpu=2).build())  # same priority: no one may be evicted
    # 1. The cycle shrinks the elastic job: every task is stopped (SIGTERM: it checkpoints).
    assert sorted(w.fx.stops) == sorted((el, 1, f"g0-{i}") for i in range(4))
    assert w.state(el)["stopping"] == "shrink"
    # It waits for a shrink, not a preemption: its reason said "preempted job(s)".
    assert (w.state(other)["reason_code"], w.state(other)["reason"]) == (
        "preempting",
        f"waiting for shrinking job(s) {el} to stop",
    )
    # 2. Its tasks have exited: it restarts at once on the two it keeps, still running; the
    #    other job starts on the two it gave up.
    w.sched.step()
    w.sched.step()
    row = w.state(el)
    assert (row["state"], row["attempt"], row["stopping"], row["preemptions"]) == (
        "running",
        2,
        None,
        0,
    )
    assert w.fx.keys(el) == [(el, 2, "g0-0"), (el, 2, "g0-1")]
    assert world_sizes(w, el) == ["4"] * 4 + ["2"] * 2
    assert [t.gpus for t in w.fx.launched[-3:-1]] == [(0,), (1,)]  # the GPUs it kept
    assert w.state(other)["state"] == "running"
    assert sorted(g for t in w.fx.launched if t.job_id == other for g in t.gpus) == [2, 3]
    with w.store.read() as tx:
        assert len(tx.tasks_of(el, 2)) == 2
    assert {"shrinking", "shrunk"} <= set(w.events(el))
    assert "preempted" not in w.events(el)
    # 3. The other job ends; once the elastic job has run long enough it grows back to four.
    w.fx.exit(w.fx.keys(other)[0], 0)
    w.sched.step()
    w.clock.t += 60
    w.sched.step()
    w.sched.step()
    w.sched.step()
    assert (w.state(el)["state"], w.state(el)["attempt"]) == ("running", 3)
    assert len(w.fx.keys(el)) == 4 and world_sizes(w, el)[-4:] == ["4"] * 4
    assert "growing" in w.events(el)


def test_an_elastic_job_grows_back_after_every_shrink(w: World) -> None:
    # Once grown, it remembered the size it grew from and never grew from that size again.
    el = w.submit(elastic(4, 1))
    for attempt in (3, 5, 7):
        other = w.submit(job("other").task(gpu=2).build())
        w.sched.step()
        w.sched.step()
        assert len(w.fx.keys(el)) == 2, f"round to attempt {attempt}: not shrunk"
        w.fx.exit(w.fx.keys(other)[0], 0)
        w.sched.step()
        w.clock.t += 60
        for _ in range(3):
            w.sched.step()
        assert (w.state(el)["attempt"], len(w.fx.keys(el))) == (attempt, 4)


def test_a_scheduler_restart_in_the_middle_of_a_shrink_requeues_the_job(w: World) -> None:
    el = w.submit(elastic(4, 1))
    w.fx.stubborn.update(w.fx.keys(el))  # its tasks take their time to stop
    other = w.submit(job("other").task(gpu=2).build())
    assert w.state(el)["stopping"] == "shrink"
    w.restart()
    for k in w.fx.keys(el):
        w.fx.exit(k, 0)
    for _ in range(6):
        w.sched.step()
        w.clock.t += 5
    # The kept tasks were not stored: the job was requeued, placed again (first in order, so
    # with all four tasks), shrunk again for the waiting job, and now runs beside it.
    assert w.state(other)["state"] == "running"
    assert w.state(el)["state"] == "running" and len(w.fx.keys(el)) == 2
    assert "requeued" in w.events(el) and w.events(el)[-1] == "started"


def test_an_elastic_job_grows_into_capacity_freed_later(w: World) -> None:
    other = w.submit(job("other").task(gpu=2).build())
    el = w.submit(elastic(4, 1))
    assert len(w.fx.keys(el)) == 2  # started with what fit
    w.fx.exit(w.fx.keys(other)[0], 0)
    w.sched.step()
    assert w.fx.stops == []  # idle capacity, but it has not run long enough to be restarted
    w.clock.t += 60
    w.sched.step()  # grown: stopped (SIGTERM, so it checkpoints) and requeued
    assert len(w.fx.stops) == 2 and w.state(el)["stopping"] == "requeue"
    w.sched.step()
    w.sched.step()
    row = w.state(el)
    assert (row["state"], row["attempt"], row["failures"]) == ("running", 2, 0)
    assert (
        sorted(t.env["WORLD_SIZE"] for t in w.fx.launched if t.job_id == el)
        == ["2"] * 2 + ["4"] * 4
    )
    assert {t.env["AISCHED_RESTART_COUNT"] for t in w.fx.launched[-4:]} == {"1"}
    assert "growing" in w.events(el)


def test_an_elastic_job_is_not_grown_while_another_job_waits(w: World) -> None:
    other = w.submit(job("other").task(gpu=2).build())
    el = w.submit(elastic(4, 1))
    big = w.submit(job("big").task(gpu=4).priority(-1).build())
    w.fx.exit(w.fx.keys(other)[0], 0)
    w.sched.step()
    assert len(w.fx.keys(el)) == 2 and w.state(big)["state"] == "pending"
    w.clock.t += 120
    w.sched.step()
    assert w.fx.stops == []  # two GPUs idle, but the capacity is owed to the waiting job


def test_elastic_needs_a_smaller_minimum() -> None:
    from aisched.spec.errors import SpecError
    from aisched.spec.job import parse_job_text

    with pytest.raises(SpecError) as e:
        parse_job_text("command: x\nreplicas: 2\nelastic: true\n", "j.yaml")
    assert e.value.problems == (
        "j.yaml: elastic: needs min_available below the job's 2 tasks: the fewest it runs with",
    )


def test_an_elastic_job_is_not_grown_out_of_what_its_queue_would_take_back(tmp_path: Path) -> None:
    # Growing requeues the job, and its queue charges the whole request: with its queue at
    # its limit, the job lost the task it ran and waited for ever ("queue small would exceed").
    queues = QueueTree((Queue("default"), Queue("small", limit=Resources(gpu=2))))
    w = new_world(tmp_path, queues=queues)
    big = w.submit(job("big").task(gpu=3).build())
    el = w.submit(replace(elastic(2, 1), queue="small"))
    small = w.submit(job("p").task(gpu=1).queue("small").build())
    assert (len(w.fx.keys(el)), w.state(small)["state"]) == (1, "pending")
    w.fx.exit(w.fx.keys(big)[0], 0)
    for _ in range(2):
        w.sched.step()
    assert w.state(small)["state"] == "running"  # the queue is at its 2-GPU limit now
    w.clock.t += 120
    for _ in range(3):
        w.sched.step()
    row = w.state(el)
    assert (row["state"], row["attempt"], len(w.fx.keys(el))) == ("running", 1, 1)
    assert "growing" not in w.events(el)
    w.store.close()


@pytest.mark.parametrize(
    ("queue", "preemptible", "grown"),
    [
        pytest.param("default", False, False, id="unevictable-not-grown-into-team-s-guarantee"),
        pytest.param("default", True, True, id="evictable-grown"),
        pytest.param("team", False, True, id="unevictable-grown-within-its-own-guarantee"),
    ],
)
def test_an_unevictable_elastic_job_is_not_grown_into_another_queues_guarantee(
    tmp_path: Path, queue: str, preemptible: bool, grown: bool
) -> None:
    # 8 GPUs, 4 guaranteed to team. An unevictable job of default holds 2 of the 4 nobody is
    # guaranteed, an evictable one 4; el (4 tasks, at least 2) starts on the 2 left. Once the
    # evictable job has ended, el, of default and unevictable, would be taken back with its
    # minimum only: grown (stopped and requeued) it would lose its tasks' work for nothing,
    # and did, restarting with the 2 tasks it had.
    queues = QueueTree((Queue("team", guarantee=Resources(gpu=4)), Queue("default")))
    w = new_world(tmp_path, FakeExecutor([fake_node(gpus=8)]), queues=queues)
    w.submit(replace(job("pinned").task(gpu=2).build(), preemptible=False))
    hog = w.submit(job("hog").task(gpu=4).build())
    el = w.submit(replace(elastic(4, 2), queue=queue, preemptible=preemptible))
    assert len(w.fx.keys(el)) == 2
    w.fx.exit(w.fx.keys(hog)[0], 0)
    w.sched.step()
    w.clock.t += 120
    for _ in range(3):
        w.sched.step()
    row = w.state(el)
    if grown:
        assert (row["state"], row["attempt"], len(w.fx.keys(el))) == ("running", 2, 4)
        assert "growing" in w.events(el)
    else:
        assert (row["state"], row["attempt"], len(w.fx.keys(el))) == ("running", 1, 2)
        assert [k for k in w.fx.stops if k[0] == el] == []
        assert "growing" not in w.events(el)
    w.store.close()

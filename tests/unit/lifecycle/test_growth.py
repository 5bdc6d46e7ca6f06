"""When an elastic job running short of tasks grows, and which one when several may."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import pytest

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind, TaskBinding
from aisched.core.policy import preset
from aisched.core.snapshot import PendingJob, RunningJob, build_arrays
from aisched.lifecycle.elastic import (
    Running,
    capacity_is_idle,
    grow_at,
    next_to_grow,
    queue_takes_back,
)
from aisched.lifecycle.holdings import Holdings
from aisched.model.cluster import Cluster
from aisched.model.job import Job
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import job, node

AFTER_S = 60.0


def _elastic(job_id: str, tasks: int = 3) -> Job:
    return job(job_id).task(tasks, gpu=1).min_available(1).elastic().build()


def _ledger(busy: int) -> Holdings:
    """One 4-GPU node with its first `busy` GPUs held."""
    held = Holdings(build_arrays(Cluster((node("n1").gpus(4).build(),))))
    if busy:
        tasks = tuple(TaskBinding("g0", i, "n1", (i,), 1000) for i in range(busy))
        held.take(RunningJob(job("hog").task(busy, gpu=1).build(), tasks, 0.0))
    return held


def test_a_short_job_may_grow_once_its_attempt_has_run_long_enough() -> None:
    assert grow_at(_elastic("a"), 1, 10.0, AFTER_S) == 70.0
    assert grow_at(_elastic("a"), 3, 10.0, AFTER_S) == math.inf  # not short
    assert grow_at(_elastic("a"), 1, 10.0, AFTER_S, grew_from=1) == math.inf  # brought nothing


@pytest.mark.parametrize(
    ("pending", "waiting", "requeuing"),
    [(True, False, False), (False, True, False), (False, False, True)],
)
def test_idle_capacity_owed_to_a_job_is_not_grown_into(
    pending: bool, waiting: bool, requeuing: bool
) -> None:
    assert not capacity_is_idle(pending=pending, waiting_for_victims=waiting, requeuing=requeuing)
    assert capacity_is_idle(pending=False, waiting_for_victims=False, requeuing=False)


def test_one_job_grows_at_a_time_the_first_by_id() -> None:
    held = _ledger(busy=2)  # 2 GPUs idle: room for one more task of either
    running = [Running(_elastic("10"), 1, 0.0), Running(_elastic("9"), 1, 0.0)]
    found = next_to_grow(running, 100.0, AFTER_S, held.arrays, held.free)
    assert found is not None
    assert (found[0].id, found[1]) == ("9", 2)


def test_a_job_whose_time_has_not_come_or_that_nothing_idle_fits_does_not_grow() -> None:
    early = [Running(_elastic("1"), 1, 50.0)]
    held = _ledger(busy=2)
    assert next_to_grow(early, 100.0, AFTER_S, held.arrays, held.free) is None
    full = _ledger(busy=4)
    ready = [Running(_elastic("1"), 1, 0.0)]
    assert next_to_grow(ready, 100.0, AFTER_S, full.arrays, full.free) is None


def test_a_job_grows_only_as_far_as_its_queue_would_take_it_back() -> None:
    # 4 GPUs idle, 2 more tasks of each job missing. The queue of "1" would take it back with
    # the 1 task it holds (no larger: not grown), that of "2" with 2 (grown by one, not two).
    held = _ledger(busy=0)
    running = [Running(_elastic("1"), 1, 0.0), Running(_elastic("2"), 1, 0.0)]
    room = {"1": 1, "2": 2}
    found = next_to_grow(running, 100.0, AFTER_S, held.arrays, held.free, lambda r: room[r.job.id])
    assert found is not None
    assert (found[0].id, found[1]) == ("2", 1)


def test_the_queue_takes_back_what_its_limit_has_room_for_once_the_job_gives_back() -> None:
    # Queue capped may hold 3 GPUs; a job of it holds 1 and an elastic job of it 1 of its 3:
    # given back, the elastic job would be let in with 2 tasks; with a 1-GPU limit, none.
    ledger = _ledger(busy=0)
    el = replace(_elastic("e"), queue="capped")
    other = job("o").task(gpu=1).queue("capped").build()
    ledger.take(RunningJob(other, (TaskBinding("g0", 0, "n1", (0,), 1000),), 0.0))
    ledger.take(RunningJob(el, (TaskBinding("g0", 0, "n1", (1,), 1000),), 0.0))
    running = Running(el, 1, 0.0)
    capped = QueueTree((Queue("default"), Queue("capped", limit=Resources(gpu=3))))
    assert queue_takes_back(capped, ledger, running) == 2
    tight = QueueTree((Queue("default"), Queue("capped", limit=Resources(gpu=1))))
    assert queue_takes_back(tight, ledger, running) == 0
    assert queue_takes_back(QueueTree((Queue("capped"),)), ledger, running) == 3


# 8 GPUs, 4 guaranteed to team: 4 are nobody's, and unevictable work of default must fit there.
TEAM = QueueTree((Queue("team", guarantee=Resources(gpu=4)), Queue("default")))


def _one_gpu_tasks(first: int, count: int) -> tuple[TaskBinding, ...]:
    return tuple(TaskBinding("g0", i, "n1", (first + i,), 1000) for i in range(count))


@pytest.mark.parametrize(
    ("queue", "preemptible", "least", "held", "pinned", "back"),
    [
        # Its minimum alone fits beside the pinned job in what nobody is guaranteed: taken
        # back with that, no more than it holds (not grown), or fewer (3 of 4 held, back 1).
        pytest.param("default", False, 2, 2, 2, 2, id="unevictable-held-at-its-minimum"),
        pytest.param("default", False, 1, 3, 1, 1, id="unevictable-taken-back-smaller"),
        pytest.param("default", False, 2, 2, 3, 0, id="unevictable-not-even-its-minimum"),
        # Reclaim can take back an evictable job: the guarantee does not hold it.
        pytest.param("default", True, 2, 2, 2, 4, id="evictable"),
        # Within its own queue's guarantee an unevictable job is taken back whole.
        pytest.param("team", False, 2, 2, 2, 4, id="unevictable-within-its-guarantee"),
    ],
)
def test_an_unevictable_job_is_taken_back_as_the_next_cycle_takes_it(
    queue: str, preemptible: bool, least: int, held: int, pinned: int, back: int
) -> None:
    # An elastic job of 4 one-GPU tasks holds `held` beside an unevictable job of default on
    # `pinned` GPUs. The grow's prediction (`queue_takes_back`) is what the next cycle binds
    # once the job has given its tasks back, and only a larger one grows it.
    ledger = Holdings(build_arrays(Cluster((node("n1").gpus(8).build(),))))
    pin = job("pin").task(gpu=pinned).queue("default").not_preemptible().build()
    ledger.take(RunningJob(pin, (TaskBinding("g0", 0, "n1", tuple(range(pinned)), 1000),), 0.0))
    el = job("e").task(4, gpu=1).min_available(least).elastic().queue(queue).build()
    el = replace(el, preemptible=preemptible)
    ledger.take(RunningJob(el, _one_gpu_tasks(pinned, held), 0.0))
    running = Running(el, held, 0.0)
    assert queue_takes_back(TEAM, ledger, running) == back
    found = next_to_grow(
        [running],
        100.0,
        AFTER_S,
        ledger.arrays,
        ledger.free,
        partial(queue_takes_back, TEAM, ledger),
    )
    assert found == ((el, back - held) if back > held else None)
    ledger.give(el.id)
    result = run_cycle(
        ledger.snapshot(TEAM), [PendingJob(el)], preset("fifo"), 100.0, validate=True
    )
    bound = [len(d.tasks) for d in result.decisions if isinstance(d, Bind) and d.job_id == "e"]
    assert bound == ([back] if back else [])

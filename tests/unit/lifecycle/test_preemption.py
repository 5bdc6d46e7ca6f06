"""The rules of a preemption's grace and of the wait of the job it makes room for."""

from __future__ import annotations

import pytest

from aisched.core.decisions import TaskBinding
from aisched.core.snapshot import RunningJob, build_arrays
from aisched.lifecycle.attempts import Stop
from aisched.lifecycle.holdings import Holdings
from aisched.lifecycle.preemption import (
    VictimWait,
    after_victims,
    blockers,
    keep_freed,
    kept_id,
    kill_at,
    played_stop_s,
    release_kept,
    resume_order,
    resumed_tasks,
    wait_for,
    wait_limit_s,
    waiting_reason,
)
from aisched.model.cluster import Cluster
from aisched.testing import job, node

GRACE = {"a": 20.0, "b": 4.0}


@pytest.mark.parametrize(
    ("grace", "stop", "want"),
    [(20.0, 10.0, 10.0), (4.0, 10.0, 4.0), (30.0, 0.0, 0.0), (0.0, 10.0, 0.0)],
)
def test_a_played_task_exits_after_its_stop_time_or_when_its_grace_runs_out(
    grace: float, stop: float, want: float
) -> None:
    assert played_stop_s(grace, stop) == want


def test_a_task_is_killed_when_its_grace_runs_out() -> None:
    assert kill_at(30.0, 100.0) == 130.0


def test_a_bind_after_victims_that_have_all_stopped_goes_ahead_at_once() -> None:
    assert wait_for(("a", "b"), lambda v: False, 5.0) is None
    assert wait_for((), lambda v: True, 5.0) is None


def test_a_bind_after_victims_still_stopping_waits_for_those_only() -> None:
    assert wait_for(("a", "b"), lambda v: v == "a", 5.0) == VictimWait(frozenset({"a"}), 5.0)


def test_a_wait_keeps_where_the_core_bound_the_job_while_it_narrows() -> None:
    tasks = (TaskBinding("g0", 0, "n1", (0,), 1000),)
    wait = wait_for(("a", "b"), lambda v: True, 5.0, tasks)
    assert wait == VictimWait(frozenset({"a", "b"}), 5.0, tasks)
    narrower = after_victims(wait, lambda v: v == "a", GRACE.__getitem__, 6.0, 30.0)
    assert narrower == VictimWait(frozenset({"a"}), 5.0, tasks)


def test_the_wait_narrows_as_victims_stop_and_ends_when_the_last_has() -> None:
    wait = VictimWait(frozenset({"a", "b"}), 100.0)
    grace = GRACE.__getitem__
    assert after_victims(wait, lambda v: True, grace, 104.0, 30.0) == wait
    narrower = after_victims(wait, lambda v: v == "a", grace, 104.0, 30.0)
    assert narrower == VictimWait(frozenset({"a"}), 100.0)
    assert after_victims(wait, lambda v: False, grace, 110.0, 30.0) is None


def test_the_wait_gives_up_after_the_slowest_victims_grace_plus_the_drivers_margin() -> None:
    wait = VictimWait(frozenset({"a", "b"}), 100.0)
    grace = GRACE.__getitem__
    assert wait_limit_s((20.0, 4.0), 30.0) == 50.0
    assert after_victims(wait, lambda v: True, grace, 150.0, 30.0) == wait
    assert after_victims(wait, lambda v: True, grace, 150.5, 30.0) is None
    # Only victims still stopping count: with a gone, b's 4 s grace sets the limit.
    assert after_victims(wait, lambda v: v == "b", grace, 134.5, 30.0) is None


def _ledger() -> tuple[Holdings, RunningJob, RunningJob]:
    arrays = build_arrays(Cluster((node("n1").gpus(4).build(), node("n2").gpus(4).build())))
    held = Holdings(arrays)
    wide = RunningJob(
        job("wide").task(1, gpu=4).build(), (TaskBinding("g0", 0, "n1", (0, 1, 2, 3), 1000),), 0.0
    )
    half = RunningJob(
        job("half").task(1, gpu=2).build(), (TaskBinding("g0", 0, "n2", (0, 1), 1000),), 0.0
    )
    held.take(wide)
    held.take(half)
    return held, wide, half


def test_a_bind_that_fits_what_is_free_is_blocked_by_nobody() -> None:
    held, _, _ = _ledger()
    tasks = (TaskBinding("g0", 0, "n2", (2, 3), 1000),)
    assert held.short_nodes(tasks) == frozenset()
    assert blockers(tasks, held, lambda v: True) == frozenset()


def test_a_bind_into_what_a_stopping_job_holds_waits_for_it_and_only_for_it() -> None:
    held, _, _ = _ledger()
    on_n1 = (TaskBinding("g0", 0, "n1", (3,), 1000),)
    on_n2 = (TaskBinding("g0", 0, "n2", (1,), 1000),)
    assert held.short_nodes(on_n1 + on_n2) == frozenset({"n1", "n2"})
    assert blockers(on_n1 + on_n2, held, lambda v: v == "wide") == frozenset({"wide"})
    # What is not stopping will not free anything: nobody to wait for (a core bug if so).
    assert blockers(on_n2, held, lambda v: v == "wide") == frozenset()


def test_tasks_are_summed_per_node_and_per_gpu() -> None:
    held, _, _ = _ledger()
    two_halves = tuple(TaskBinding("g0", i, "n2", (2,), 500) for i in range(2))
    three_halves = tuple(TaskBinding("g0", i, "n2", (2,), 500) for i in range(3))
    assert held.short_nodes(two_halves) == frozenset()
    assert held.short_nodes(three_halves) == frozenset({"n2"})


def test_what_a_victim_frees_is_kept_for_the_job_that_waited_for_it_longest() -> None:
    held, wide, _ = _ledger()
    freed = held.give("wide").tasks
    urgent = job("urgent").task(1, gpu=4).build()
    waits = {
        "urgent": VictimWait(frozenset({"wide", "other"}), 100.0),
        "later": VictimWait(frozenset({"wide"}), 101.0),
    }
    jobs = {"urgent": urgent}.__getitem__
    assert keep_freed(held, "wide", freed, waits, jobs, 104.0) == "urgent"
    kept = held.views[kept_id("urgent")]
    assert (kept.tasks, kept.terminating, kept.job.queue) == (wide.tasks, True, urgent.queue)
    assert held.short_nodes(wide.tasks) == frozenset({"n1"})  # nobody else gets it
    release_kept(held, "urgent")
    assert held.short_nodes(wide.tasks) == frozenset()
    assert held.problems() == []


def test_nothing_is_kept_when_no_wait_goes_on() -> None:
    held, _, _ = _ledger()
    freed = held.give("wide").tasks
    assert keep_freed(held, "wide", freed, {}, {}.__getitem__, 104.0) is None
    assert held.short_nodes(freed) == frozenset()
    release_kept(held, "urgent")  # nothing kept: nothing to give back
    assert held.problems() == []


def test_a_job_whose_victims_stopped_starts_where_the_core_bound_it() -> None:
    held, wide, _ = _ledger()
    wait = VictimWait(frozenset({"wide"}), 100.0, wide.tasks)
    assert resumed_tasks(wait, held) is None  # wide still holds it
    held.give("wide")
    assert resumed_tasks(wait, held) == wide.tasks


def test_a_job_whose_room_was_taken_or_unknown_is_placed_afresh() -> None:
    held, _, half = _ledger()
    on_half = VictimWait(frozenset({"x"}), 100.0, half.tasks)
    assert resumed_tasks(on_half, held) is None  # another job holds it
    assert resumed_tasks(VictimWait(frozenset({"x"}), 100.0), held) is None  # not known


def test_waits_that_end_together_resume_longest_waiting_first() -> None:
    waits = {
        "10": VictimWait(frozenset({"a"}), 100.0),
        "9": VictimWait(frozenset({"a"}), 100.0),
        "2": VictimWait(frozenset({"a"}), 101.0),
    }
    assert resume_order(waits) == ["9", "10", "2"]


@pytest.mark.parametrize(
    ("victims", "reason"),
    [
        ({"3": Stop.PREEMPT, "4": Stop.PREEMPT}, "waiting for preempted job(s) 3, 4 to stop"),
        # Each was called preempted, whatever stopped it.
        ({"7": Stop.SHRINK}, "waiting for shrinking job(s) 7 to stop"),
        (
            {"3": Stop.PREEMPT, "5": Stop.CANCEL, "6": Stop.TIMEOUT, "7": Stop.SHRINK},
            "waiting for preempted job(s) 3 and cancelled job(s) 5 and timed-out job(s) 6 and "
            "shrinking job(s) 7 to stop",
        ),
        ({"8": None}, "waiting for stopping job(s) 8 to stop"),
        # In the order of their numbers: as text, 10 came before 2 and 9.
        (
            {"10": Stop.PREEMPT, "9": Stop.PREEMPT, "2": Stop.PREEMPT, "11": Stop.SHRINK},
            "waiting for preempted job(s) 2, 9, 10 and shrinking job(s) 11 to stop",
        ),
    ],
)
def test_a_waiting_jobs_reason_names_each_job_by_why_it_stops(
    victims: dict[str, Stop | None], reason: str
) -> None:
    assert waiting_reason(victims) == reason

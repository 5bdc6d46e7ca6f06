"""The rules of a preemption's grace and of the wait of the job it makes room for."""

from __future__ import annotations

import pytest

from aisched.lifecycle.preemption import (
    VictimWait,
    after_victims,
    kill_at,
    played_stop_s,
    wait_for,
    wait_limit_s,
)

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

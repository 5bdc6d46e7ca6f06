"""A cycle's statuses (`core.statuses`): a job's own status wins, a rule covers the admitted
jobs without one, a refused job is never covered, and once the cycle is over every pending job
has a status (not reached, by default) and nothing else has one."""

from __future__ import annotations

import pytest

import aisched.core.statuses as statuses_module
from aisched.core.admitted import Member
from aisched.core.status import PLACED, JobStatus, StatusCode, group_ref, named_for
from aisched.core.statuses import Statuses
from aisched.model.job import Job
from aisched.testing import job, pending

JOBS = pending(*(job(x) for x in "abcd"))
WAIT_1 = JobStatus(StatusCode.WAIT_RESOURCES, "no room for one")
WAIT_2 = JobStatus(StatusCode.WAIT_RESOURCES, "no room for two")
REFUSED = JobStatus(StatusCode.NEVER_FITS, "too large")
NOT_REACHED = JobStatus(StatusCode.NOT_CONSIDERED, "not reached")


def members() -> dict[str, Member]:
    a, b, c, d = JOBS
    return {
        "a": Member(a, ("a",), None, 1),
        "b": Member(b, ("b",), None, 2),
        "c": Member(c, ("c",), None, 1),
        "d": Member(d, ("d",), "too large", 1),
    }


def test_own_statuses_win_and_the_rule_covers_admitted_jobs_only() -> None:
    s = Statuses(JOBS)
    s.know_members(members())
    s["d"] = REFUSED
    assert "a" not in s and s.get("a") is None  # not reached yet: absent during the cycle
    s["a"] = PLACED
    s.wait_by_shape({1: WAIT_1, 2: WAIT_2})
    assert dict(s) == {"a": PLACED, "b": WAIT_2, "c": WAIT_1, "d": REFUSED}
    s.wait_all(WAIT_1)
    assert dict(s) == {"a": PLACED, "b": WAIT_1, "c": WAIT_1, "d": REFUSED}
    assert list(s) == ["a", "b", "c", "d"]  # in pending order


def test_after_the_cycle_every_pending_job_has_one_and_no_other_job_has_one() -> None:
    s = Statuses(JOBS)
    s["b"] = PLACED
    s.finish(NOT_REACHED)
    assert len(s) == 4
    assert s == {"a": NOT_REACHED, "b": PLACED, "c": NOT_REACHED, "d": NOT_REACHED}
    assert "x" not in s and s.get("x") is None
    try:
        s["x"]
    except KeyError:
        pass
    else:
        raise AssertionError("a job that is not pending has no status")


def test_alike_statuses_naming_groups_by_place_are_named_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The eta action gives each waiting job a status object of its own: statuses alike in
    code, reason and start are still read as one object, and a reason is named once per group
    names, however many statuses carry it."""
    jobs = pending(*(job(x).task(gpu=1, name="trainer" if x != "d" else "eval") for x in "abcd"))
    calls: list[str] = []

    def counted(reason: str, j: Job) -> str:
        calls.append(j.id)
        return named_for(reason, j)

    monkeypatch.setattr(statuses_module, "named_for", counted)
    reason = f"room for 0 of 1 '{group_ref(0)}' tasks"
    s = Statuses(jobs)
    # Equal, but separate objects, as the eta action writes them.
    s["a"] = JobStatus(StatusCode.WAIT_RESOURCES, reason, 100.0)
    s["b"] = JobStatus(StatusCode.WAIT_RESOURCES, reason, 100.0)
    s["c"] = JobStatus(StatusCode.WAIT_RESOURCES, reason, 200.0)
    s["d"] = JobStatus(StatusCode.WAIT_RESOURCES, reason, 100.0)
    s.finish(NOT_REACHED)
    trainer = "room for 0 of 1 'trainer' tasks"
    assert dict(s) == {
        "a": JobStatus(StatusCode.WAIT_RESOURCES, trainer, 100.0),
        "b": JobStatus(StatusCode.WAIT_RESOURCES, trainer, 100.0),
        "c": JobStatus(StatusCode.WAIT_RESOURCES, trainer, 200.0),
        "d": JobStatus(StatusCode.WAIT_RESOURCES, "room for 0 of 1 'eval' tasks", 100.0),
    }
    assert s["a"] is s["b"]
    assert calls == ["a", "d"]  # once per names: not again for b or c, nor when read again

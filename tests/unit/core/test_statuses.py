"""A cycle's statuses (`core.statuses`): a job's own status wins, a rule covers the admitted
jobs without one, a refused job is never covered, and once the cycle is over every pending job
has a status (not reached, by default) and nothing else has one."""

from __future__ import annotations

from aisched.core.admitted import Member
from aisched.core.status import PLACED, JobStatus, StatusCode
from aisched.core.statuses import Statuses
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

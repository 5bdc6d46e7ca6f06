"""A service's replica count: held within its bounds; the surplus chosen by one rule; the
crash loop's backoff between replicas that fail."""

from __future__ import annotations

from aisched.lifecycle.services import (
    CRASH_RESET_S,
    CrashLoop,
    crash_loop_of,
    replacement_wait_s,
    replica_failed,
    replicas_within,
    surplus,
)
from aisched.model.service import ServiceSpec
from aisched.testing import job


def test_a_count_asked_for_is_held_within_the_services_bounds() -> None:
    spec = ServiceSpec(min_replicas=2, max_replicas=5)
    assert [replicas_within(spec, n) for n in (0, 2, 4, 9)] == [2, 2, 4, 5]


def test_the_surplus_is_pending_replicas_first_then_the_newest_running() -> None:
    live = [("3", True), ("4", False), ("10", True), ("7", True), ("8", False)]
    assert surplus(live, 2) == ["8", "4", "10"]
    assert surplus(live, 5) == []
    assert surplus(live, 9) == []


def test_a_crash_loops_wait_doubles_per_failed_replica_from_the_backoff_to_the_cap() -> None:
    svc = job("web").backoff(2).build()
    run, waits = None, []
    for i, at in enumerate([100.0, 103.0, 108.0, 117.0, 134.0, 167.0]):
        run = replica_failed(run, svc, str(i), "exited with code 1", at, max_backoff_s=20)
        waits.append(run.until - at)
    assert waits == [2, 4, 8, 16, 20, 20]
    assert run == CrashLoop(6, "5", "exited with code 1", 167.0, 187.0)
    assert run.note() == "replica 5 failed: exited with code 1 (6 replicas failed in a row)"
    assert run.waiting_note(lambda t: f"<{t:g}>") == (
        "replica 5 failed: exited with code 1 (6 replicas failed in a row): a new replica "
        "starts not before <187>"
    )


def test_a_service_without_a_backoff_still_waits_between_failed_replicas() -> None:
    svc = job("web").backoff(0).build()
    assert [replacement_wait_s(svc, n, 300) for n in (1, 2, 3, 12)] == [1, 2, 4, 300]


def test_a_failure_long_after_the_last_wait_starts_a_new_run() -> None:
    svc = job("web").backoff(1).build()
    run = replica_failed(None, svc, "1", "x", 0.0, 300)
    run = replica_failed(run, svc, "2", "x", 1.0 + CRASH_RESET_S - 0.1, 300)
    assert run.failed == 2
    again = replica_failed(run, svc, "3", "x", run.until + CRASH_RESET_S, 300)
    assert (again.failed, again.until - again.last_at) == (1, 1.0)


def test_the_run_is_derived_from_the_failed_replicas_ends_alone() -> None:
    svc = job("web").backoff(1).build()
    ends = [("1", 0.0, "a"), ("2", 1.5, "b"), ("3", 4.0, "c")]
    run = None
    for rid, at, why in ends:
        run = replica_failed(run, svc, rid, why, at, 300)
    assert crash_loop_of(svc, ends, 300) == run == CrashLoop(3, "3", "c", 4.0, 8.0)
    assert crash_loop_of(svc, [], 300) is None


def test_running_replicas_not_ready_go_before_the_ready_ones() -> None:
    live = [("3", True), ("4", False), ("10", True), ("7", True)]
    assert surplus(live, 1, ready={"10", "7"}) == ["4", "3", "10"]
    assert surplus(live, 2, ready=set()) == ["4", "10"]

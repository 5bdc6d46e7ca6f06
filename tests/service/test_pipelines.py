"""Pipelines in the control loop: jobs held back by `depends_on`, released or cancelled as their
dependencies end, all-or-nothing submission, and recovery after a restart. A real SQLite store,
a fake executor and a fake clock (see test_loop.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import replace

import pytest
from sqlalchemy.exc import OperationalError
from world import World, submit_all
from world import pipeline_job as step

from aisched.core.dependencies import NAMED_WAITING, DependencyCheck
from aisched.executors.base import ExitKind
from aisched.model.job import Dependency, DependencyCondition
from aisched.model.states import JobState
from aisched.service.live import LiveJob
from aisched.service.loop import Rejected


def finish(w: World, job_id: str, code: int = 0) -> None:
    for key in w.fx.keys(job_id):
        w.fx.exit(key, code, ExitKind.EXITED)
    w.sched.step()


def test_steps_start_in_dependency_order_and_waiting_ones_say_why(w: World) -> None:
    prep, train, serve = submit_all(w, step("prep"), step("train", "prep"), step("serve", "train"))
    # Only the first step runs, although GPUs are free for all three.
    assert [w.state(i)["state"] for i in (prep, train, serve)] == ["running", "pending", "pending"]
    assert (w.state(train)["reason_code"], w.state(train)["reason"]) == (
        "wait-dependencies",
        f"waiting for job {prep} (prep) to succeed",
    )
    assert w.state(serve)["reason"] == f"waiting for job {train} (train) to succeed"
    finish(w, prep)
    assert [w.state(i)["state"] for i in (prep, train, serve)] == [
        "succeeded",
        "running",
        "pending",
    ]
    finish(w, train)
    finish(w, serve)
    assert [w.state(i)["state"] for i in (prep, train, serve)] == ["succeeded"] * 3


def test_a_failed_step_cancels_its_dependents_naming_it_and_any_still_runs(w: World) -> None:
    prep, train, serve, report = submit_all(
        w,
        step("prep"),
        step("train", "prep"),
        step("serve", "train"),
        step("report", "prep", condition=DependencyCondition.ANY),
    )
    finish(w, prep, code=3)
    assert w.state(prep)["state"] == "failed"
    assert (w.state(train)["state"], w.state(train)["message"]) == (
        "cancelled",
        f"dependency {prep} (prep) failed; it had to succeed",
    )
    assert (w.state(serve)["state"], w.state(serve)["message"]) == (
        "cancelled",
        f"dependency {train} (train) cancelled; it had to succeed",
    )
    assert w.state(report)["state"] == "running"
    assert w.fx.keys(train) == [] and w.fx.keys(serve) == []


def test_a_bad_reference_refuses_the_whole_submission(w: World) -> None:
    fut = w.sched.submit_all((
        (step("a"), "native", ()),
        (step("b", "nope"), "native", ()),
    ))  # fmt: skip
    w.sched.step()
    with pytest.raises(Rejected, match=r"job 'b': depends_on.0: no job 'nope'"):
        fut.result(0)
    with w.store.read() as tx:
        assert tx.live_jobs() == []
    assert w.fx.launched == []


def test_depending_on_an_earlier_job_by_id_and_on_one_that_already_failed(w: World) -> None:
    (first,) = submit_all(w, step("first"))
    (later,) = submit_all(w, step("later", first))
    assert w.state(later)["reason_code"] == "wait-dependencies"
    finish(w, first, code=1)
    assert w.state(later)["state"] == "cancelled"
    fut = w.sched.submit_all(((step("again", first), "native", ()),))
    w.sched.step()
    with pytest.raises(Rejected, match=rf"job {first} \(first\) has already ended \(failed\)"):
        fut.result(0)


def test_a_restarted_scheduler_keeps_holding_and_then_releases_dependents(w: World) -> None:
    prep, train = submit_all(w, step("prep"), step("train", "prep"))
    w.restart()
    w.sched.step()
    assert w.state(train)["state"] == "pending"
    assert w.state(train)["reason_code"] == "wait-dependencies"
    finish(w, prep)
    assert w.state(train)["state"] == "running"


def test_a_dependency_that_ended_while_the_scheduler_was_down_is_seen_ended(w: World) -> None:
    # The restart adopts prep's exit (an end not yet stored) before it re-checks train: train
    # must not be held for a job that has already ended.
    prep, train, serve = submit_all(w, step("prep"), step("train", "prep"), step("serve", "train"))
    (key,) = w.fx.keys(prep)
    w.fx.crash_while_down(key, 0)
    w.restart()
    w.sched.step()
    assert [w.state(i)["state"] for i in (prep, train, serve)] == [
        "succeeded",
        "running",
        "pending",
    ]
    finish(w, train)
    finish(w, serve)
    assert w.state(serve)["state"] == "succeeded"


def test_a_chain_whose_head_was_being_cancelled_when_the_scheduler_died_ends_cancelled(
    w: World,
) -> None:
    prep, train, serve = submit_all(w, step("prep"), step("train", "prep"), step("serve", "train"))
    (key,) = w.fx.keys(prep)
    w.fx.stubborn.add(key)  # still running when the scheduler is killed
    w.sched.cancel(prep)
    w.sched.step()
    w.fx.crash_while_down(key, -15)
    w.restart()
    w.sched.step()
    assert [(w.state(i)["state"], w.state(i)["message"]) for i in (prep, train, serve)] == [
        ("cancelled", "cancelled"),
        ("cancelled", f"dependency {prep} (prep) cancelled; it had to succeed"),
        ("cancelled", f"dependency {train} (train) cancelled; it had to succeed"),
    ]


def test_a_job_ended_in_the_same_step_as_a_submission_naming_it_counts_as_ended(w: World) -> None:
    # Its end is not stored yet when the submission is resolved: the store still says pending.
    first, second = submit_all(w, step("first"), step("second", "first"))
    cancelled = w.sched.cancel(second)
    success = w.sched.submit_all(((step("on-success", second), "native", ()),))
    anyway = w.sched.submit_all(
        ((step("anyway", second, condition=DependencyCondition.ANY), "native", ()),)
    )
    w.sched.step()
    assert cancelled.result(0) == "cancelled"
    with pytest.raises(Rejected, match=rf"job {second} \(second\) has already ended \(cancelled\)"):
        success.result(0)
    (after,) = anyway.result(0)
    assert w.state(str(after["id"]))["state"] == "running"


def test_cancelling_the_head_of_a_chain_of_2000_jobs_cancels_every_one(w: World) -> None:
    n = 2000
    ids = submit_all(w, step("s0"), *(step(f"s{i}", f"s{i - 1}") for i in range(1, n)))
    cancelled = w.sched.cancel(ids[0])
    w.sched.step()  # the head's task is asked to stop
    assert cancelled.result(0) == "running"
    w.sched.step()  # it has: the head ends, and with it the chain (once, this overflowed)
    with w.store.read() as tx:
        assert tx.count_by_state() == {"cancelled": n}
        tail = tx.get_job(ids[-1])
    assert tail is not None and tail["message"] == (
        f"dependency {ids[-2]} (s{n - 2}) cancelled; it had to succeed"
    )
    assert w.sched.jobs == {} and w.sched.pipelines.blocked == {}


def test_a_cascade_cut_short_by_a_failed_step_is_finished_by_the_next_step(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = submit_all(w, step("s0"), *(step(f"s{i}", f"s{i - 1}") for i in range(1, 5)))
    check = w.sched.pipelines.check
    failed: list[str] = []

    def check_failing_once(lj: LiveJob, live: Mapping[str, LiveJob]) -> DependencyCheck:
        if lj.id == ids[2] and not failed:  # the store cannot be read, this once
            failed.append(lj.id)
            raise OperationalError("SELECT ...", {}, sqlite3.OperationalError("database is locked"))
        return check(lj, live)

    monkeypatch.setattr(w.sched.pipelines, "check", check_failing_once)
    w.sched.cancel(ids[0])
    w.sched.step()
    with pytest.raises(OperationalError):
        w.sched.step()  # s0 ends, s1 is cancelled, s2's re-check fails
    assert failed == [ids[2]]
    w.sched.step()
    assert [w.state(i)["state"] for i in ids] == ["cancelled"] * 5


def test_ended_dependencies_are_cached_within_a_bound_and_read_again_past_it(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service that runs for months must not keep every job it ever ended.
    monkeypatch.setattr("aisched.service.pipelines.ENDED_CACHED", 3)
    heads = []
    for i in range(6):
        head, tail = submit_all(w, step(f"head{i}"), step(f"tail{i}", f"head{i}"))
        finish(w, head, code=1 if i == 0 else 0)
        finish(w, tail)
        heads.append(head)
    assert len(w.sched.pipelines.ended) == 3
    assert heads[0] not in w.sched.pipelines.ended
    # Past the cache, the store still says how a job ended.
    (after,) = submit_all(w, step("after", heads[1]))
    assert w.state(after)["state"] == "running"
    fut = w.sched.submit_all(((step("again", heads[0]), "native", ()),))
    w.sched.step()
    with pytest.raises(Rejected, match=rf"job {heads[0]} \(head0\) has already ended \(failed\)"):
        fut.result(0)


def test_a_step_waiting_on_many_names_what_it_still_awaits_as_they_end_in_any_order(
    w: World,
) -> None:
    # What it awaits is kept between re-checks (and rebuilt from the store by a restart): its
    # reason must stay the one a look at every dependency gives.
    heads = submit_all(w, *(step(f"h{i}") for i in range(4)))
    before = submit_all(w, step("before", heads[0], condition=DependencyCondition.ANY))[0]
    deps = (*heads, before)
    (last,) = submit_all(w, replace(step("last"), depends_on=(
        Dependency(deps[0], DependencyCondition.SUCCESS),
        Dependency(deps[1], DependencyCondition.ANY),
        Dependency(deps[2], DependencyCondition.SUCCESS),
        Dependency(deps[3], DependencyCondition.ANY),
        Dependency(deps[4], DependencyCondition.SUCCESS),
    )))  # fmt: skip
    h0, h1, h2, h3, b = (
        f"{d} ({n})" for d, n in zip(deps, ("h0", "h1", "h2", "h3", "before"), strict=True)
    )
    assert w.state(last)["reason"] == (
        f"waiting for job {h0} to succeed, {h1} to end, {h2} to succeed and 2 more"
    )
    finish(w, heads[1], code=1)  # "any": awaited no more
    assert w.state(last)["reason"] == (
        f"waiting for job {h0} to succeed, {h2} to succeed, {h3} to end and 1 more"
    )
    w.restart()
    w.sched.step()
    assert w.state(last)["reason"] == (
        f"waiting for job {h0} to succeed, {h2} to succeed, {h3} to end and 1 more"
    )
    finish(w, heads[2])
    assert (
        w.state(last)["reason"] == f"waiting for job {h0} to succeed, {h3} to end, {b} to succeed"
    )
    finish(w, heads[0])  # "before" runs now
    assert w.state(last)["reason"] == f"waiting for job {h3} to end, {b} to succeed"
    finish(w, before)
    assert (w.state(last)["state"], w.state(last)["reason"]) == (
        "pending",
        f"waiting for job {h3} to end",
    )
    finish(w, heads[3], code=1)
    assert w.state(last)["state"] == "running"


def test_a_job_listed_twice_is_awaited_twice(w: World) -> None:
    (first,) = submit_all(w, step("first"))
    (second,) = submit_all(w, replace(step("second"), depends_on=(
        Dependency(first, DependencyCondition.SUCCESS),
        Dependency(first, DependencyCondition.ANY),
    )))  # fmt: skip
    assert w.state(second)["reason"] == (
        f"waiting for job {first} (first) to succeed, {first} (first) to end"
    )
    finish(w, first)
    assert w.state(second)["state"] == "running"


def test_a_step_may_wait_on_a_job_of_another_user(w: World) -> None:
    (theirs,) = submit_all(w, replace(step("theirs"), user="alice"))
    (mine,) = submit_all(w, replace(step("mine", theirs), user="bob"))
    assert w.state(mine)["reason"] == f"waiting for job {theirs} (theirs) to succeed"
    finish(w, theirs, code=2)
    assert (w.state(mine)["state"], w.state(mine)["message"]) == (
        "cancelled",
        f"dependency {theirs} (theirs) failed; it had to succeed",
    )


def test_an_end_does_not_look_again_at_its_waiters_other_dependencies(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 30 steps each waiting on the same 20: one of the 20 ending used to look up all 20 for
    # each waiter (600 lookups, every time; 10,000 waiters on 100 jobs took seconds a step).
    heads = submit_all(w, *(step(f"h{i}") for i in range(20)))
    waiters = submit_all(w, *(step(f"w{i}", *heads) for i in range(30)))
    lookups: list[str] = []
    lookup = w.sched.pipelines.lookup

    def counted(job_id: str, live: Mapping[str, LiveJob]) -> tuple[JobState, str] | None:
        lookups.append(job_id)
        return lookup(job_id, live)

    monkeypatch.setattr(w.sched.pipelines, "lookup", counted)
    finish(w, heads[1])  # one of the 4 running (a GPU each)
    # Only the jobs each reason names are looked up (for their names), not all 20.
    assert len(lookups) == len(waiters) * NAMED_WAITING
    assert set(lookups) == {heads[0], heads[2], heads[3]}
    assert w.state(waiters[0])["reason"] == (
        f"waiting for job {heads[0]} (h0) to succeed, {heads[2]} (h2) to succeed, "
        f"{heads[3]} (h3) to succeed and 16 more"
    )

"""Bulk cancel in the control loop over pipelines: a selection takes jobs that depend on one
another, so cancelling one of them ends or releases others of the selection in the same step.
Every job of the selection ends cancelled, none of it is started on the way, and the command
is answered. A bug met cancelling one job of the selection leaves none of the others live.
A real SQLite (or PostgreSQL) store, the fake executor and a fake clock."""

from __future__ import annotations

from functools import partial

import pytest
from world import World, pipeline_job, submit_all

from aisched.model.job import DependencyCondition
from aisched.service.live import Batch, LiveJob
from aisched.service.loop_types import CancelSelection
from aisched.service.scheduler_state import SchedulerState

ANY = DependencyCondition.ANY
SUCCESS = DependencyCondition.SUCCESS


# The pipelines here are alice's, unless a step says whose.
step = partial(pipeline_job, user="alice")


def test_cancelling_all_of_a_users_pipeline_cancels_every_step_and_starts_none(
    w: World,
) -> None:
    # Another user's job holds 3 of the 4 GPUs: `first` (2 GPUs) waits behind it, `second`
    # on `first`, `third` on `second` ending in any way.
    blocker = submit_all(w, step("blocker", gpus=3, user="bob"))[0]
    first, second, third = submit_all(
        w,
        step("first", gpus=2),
        step("second", "first"),
        step("third", "second", condition=ANY),
    )
    assert [w.state(i)["state"] for i in (blocker, first, second, third)] == [
        "running",
        "pending",
        "pending",
        "pending",
    ]
    done = w.sched.cancel_matching(CancelSelection(user="alice"))
    w.sched.step()
    assert done.result(0) == [(first, "cancelled"), (second, "cancelled"), (third, "cancelled")]
    w.sched.step()  # a cycle: nothing of the selection may start
    assert [(w.state(i)["state"], w.state(i)["message"]) for i in (first, second, third)] == [
        ("cancelled", "cancelled while pending"),
        ("cancelled", "cancelled while pending"),
        ("cancelled", "cancelled while pending"),
    ]
    assert [w.events(i) for i in (first, second, third)] == [["submitted", "cancelled"]] * 3
    assert w.fx.keys(third) == []
    assert w.state(blocker)["state"] == "running"


def test_a_bug_met_cancelling_one_job_leaves_none_of_the_others_live(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = submit_all(w, step("before"))[0]
    buggy = submit_all(w, step("buggy"))[0]
    waiting = submit_all(w, step("waiting", gpus=4))[0]
    assert [w.state(i)["state"] for i in (before, buggy, waiting)] == [
        "running",
        "running",
        "pending",
    ]
    real = SchedulerState._stop_tasks

    def with_a_bug(self: SchedulerState, lj: LiveJob, batch: Batch) -> None:
        if lj.job.name == "buggy":
            raise RuntimeError("a bug met stopping this job")
        real(self, lj, batch)

    monkeypatch.setattr(SchedulerState, "_stop_tasks", with_a_bug)
    done = w.sched.cancel_matching(CancelSelection(user="alice"))
    with pytest.raises(RuntimeError, match="a bug met stopping this job"):
        w.sched.step()  # the command fails, as one cancel meeting the bug does
    with pytest.raises(RuntimeError, match="a bug met stopping this job"):
        done.result(0)
    w.sched.step()  # the failed step's batch is stored: the others are cancelled
    assert (w.state(before)["state"], w.state(before)["stopping"]) == ("running", "cancel")
    assert w.state(waiting)["state"] == "cancelled"
    for key in w.fx.keys(before):
        w.fx.exit(key, 143)
    w.sched.step()
    assert w.state(before)["state"] == "cancelled"

"""The control loop over a fake executor and a fake clock: every state change, step by step.

The store is a real SQLite file; only the executor (processes) and the clock are fakes, so each
test drives the loop exactly: submit, step, end a task, step, and looks at the whole outcome.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from world import World, make_scheduler, new_world

from aisched.executors.base import ExitKind
from aisched.model.job import Job, RestartPolicy
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.predict import PredictorConfig, RuntimePredictor
from aisched.service import failpoints, launches
from aisched.service.live import Batch
from aisched.service.loop import Rejected
from aisched.spec import parse_job_text
from aisched.store.db import Store
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


def test_a_gang_starts_whole_with_distinct_gpus_and_ranks(w: World) -> None:
    jid = w.submit(job("x").task(2, gpu=2, cpu=2).build())
    launches = sorted(w.fx.launched, key=lambda t: t.task)
    assert [(t.task, t.gpus, t.env["RANK"], t.env["WORLD_SIZE"]) for t in launches] == [
        ("g0-0", (0, 1), "0", "2"),
        ("g0-1", (2, 3), "1", "2"),
    ]
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in launches] == ["0,1", "2,3"]
    assert {t.env["MASTER_PORT"] for t in launches} == {launches[0].env["MASTER_PORT"]}
    assert launches[0].env["AISCHED_CHECKPOINT_DIR"] == str(w.home / "checkpoints" / jid)
    row = w.state(jid)
    assert (row["state"], row["attempt"]) == ("running", 1)
    with w.store.read() as tx:
        assert [(t["name"], t["state"]) for t in tx.tasks_of(jid)] == [
            ("g0-0", "running"),
            ("g0-1", "running"),
        ]
    for key in w.fx.keys(jid):
        w.fx.exit(key, 0)
    w.sched.step()
    assert w.state(jid)["state"] == "succeeded"
    assert w.events(jid) == [
        "submitted", "placed", "started", "task-exited", "task-exited", "succeeded"
    ]  # fmt: skip


def test_ranks_run_across_groups_and_volcano_task_indices_within_each(w: World) -> None:
    w.submit(job("x").task(1, cpu=1).task(2, gpu=1, cpu=1).build())
    launches = sorted(w.fx.launched, key=lambda t: int(t.env["RANK"]))
    assert [(t.task, t.env["RANK"], t.env["VC_TASK_INDEX"]) for t in launches] == [
        ("g0-0", "0", "0"),
        ("g1-0", "1", "0"),
        ("g1-1", "2", "1"),
    ]
    assert all(t.env["VK_TASK_INDEX"] == t.env["VC_TASK_INDEX"] for t in launches)


def test_a_job_waits_for_busy_gpus_then_starts(w: World) -> None:
    first = w.submit(job("a").task(gpu=4).build())
    second = w.submit(job("b").task(gpu=2).build())
    row = w.state(second)
    assert row["state"] == "pending"
    # The default policy reserves the machine for the blocked head job (backfill).
    assert (row["reason_code"], row["reason"]) == (
        "reserved",
        "nodes reserved once running jobs end",
    )
    w.fx.exit(w.fx.keys(first)[0], 0)
    w.sched.step()
    assert w.state(second)["state"] == "running"
    assert w.state(first)["state"] == "succeeded"


def test_higher_priority_preempts_and_the_victim_restarts_with_its_checkpoint_dir(w: World) -> None:
    low = w.submit(job("low").task(gpu=4).priority(0).build())
    (low_key,) = w.fx.keys(low)
    high = w.submit(job("high").task(gpu=4).priority(10).build())
    # The victim is asked to stop; the preemptor waits for it and does not start beside it.
    assert w.fx.stops == [low_key]
    assert w.state(low)["stopping"] == "preempt"
    assert w.state(high)["state"] == "pending"
    assert "waiting for preempted job(s) 1" in str(w.state(high)["reason"])
    assert w.fx.keys(high) == []
    w.sched.step()  # the stop is reported; the victim is requeued, the preemptor starts
    assert w.state(low)["state"] == "pending"
    assert w.state(low)["preemptions"] == 1
    assert w.state(high)["state"] == "running"
    w.fx.exit(w.fx.keys(high)[0], 0)
    w.sched.step()
    relaunch = w.fx.launched[-1]
    assert (relaunch.job_id, relaunch.attempt) == (low, 2)
    assert relaunch.env["AISCHED_RESTART_COUNT"] == "1"
    assert relaunch.env["AISCHED_CHECKPOINT_DIR"] == w.fx.launched[0].env["AISCHED_CHECKPOINT_DIR"]
    assert w.events(low) == ["submitted", "placed", "started", "preempting", "task-exited",
                             "preempted", "placed", "started"]  # fmt: skip


def test_a_failing_job_is_retried_with_backoff_up_to_its_limit(w: World) -> None:
    j = job("f").task(gpu=1).build()
    jid = w.submit(replace(j, max_retries=2, backoff_s=10.0))
    for attempt, wait in ((1, 10.0), (2, 20.0)):
        w.fx.exit(w.fx.keys(jid)[0], 3)
        w.sched.step()
        row = w.state(jid)
        assert (row["state"], row["failures"], row["not_before"]) == (
            "pending",
            attempt,
            w.clock.t + wait,
        )
        w.sched.step()
        assert w.fx.keys(jid) == []  # backing off
        w.clock.t += wait
        w.sched.step()
        assert w.state(jid)["attempt"] == attempt + 1
    w.fx.exit(w.fx.keys(jid)[0], 3)
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["failures"], row["exit_code"]) == ("failed", 3, 3)
    assert row["message"] == "task g0-0 exited with code 3; no retries left (2)"


def test_restart_policy_never_fails_at_once(w: World) -> None:
    j = job("n").task(cpu=1).build()
    jid = w.submit(replace(j, restart_policy=RestartPolicy.NEVER))
    w.fx.exit(w.fx.keys(jid)[0], 1, ExitKind.OOM)
    w.sched.step()
    row = w.state(jid)
    assert row["state"] == "failed"
    assert row["message"] == "task g0-0 was killed for exceeding its memory limit; restart " \
        "policy is never"  # fmt: skip


def test_one_failed_task_stops_the_rest_of_the_gang(w: World) -> None:
    jid = w.submit(job("g").task(3, cpu=1).build())
    keys = w.fx.keys(jid)
    w.fx.exit(keys[1], 2)
    w.sched.step()
    assert sorted(w.fx.stops) == [keys[0], keys[2]]
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["failures"]) == ("pending", 1)


def test_cancel_pending_running_finished_and_unknown(w: World) -> None:
    running = w.submit(job("r").task(gpu=4).build())
    waiting = w.submit(job("p").task(gpu=4).build())
    f1, f2 = w.sched.cancel(waiting), w.sched.cancel(running)
    w.sched.step()
    assert (f1.result(0), f2.result(0)) == ("cancelled", "running")
    assert w.state(waiting)["state"] == "cancelled"
    assert w.fx.stops == [(running, 1, "g0-0")]
    w.sched.step()
    assert w.state(running)["state"] == "cancelled"
    for job_id, status in ((running, 409), ("999", 404)):
        fut = w.sched.cancel(job_id)
        w.sched.step()
        with pytest.raises(Rejected) as e:
            fut.result(0)
        assert e.value.status == status


def test_a_job_that_can_never_fit_is_refused_and_nothing_is_stored(w: World) -> None:
    fut = w.sched.submit(job("big").task(gpu=8).build())
    w.sched.step()
    with pytest.raises(Rejected, match="can never fit"):
        fut.result(0)
    with w.store.read() as tx:
        assert tx.list_jobs() == []


def test_unknown_queue_is_refused(w: World) -> None:
    fut = w.sched.submit(job("q").task(cpu=1).queue("nope").build())
    w.sched.step()
    with pytest.raises(Rejected, match="unknown queue 'nope'"):
        fut.result(0)


def test_time_limit_stops_and_fails_the_job(w: World) -> None:
    j = job("t").task(cpu=1).build()
    jid = w.submit(replace(j, time_limit_s=60.0))
    w.clock.t += 61
    w.sched.step()
    assert w.fx.stops == [(jid, 1, "g0-0")]
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["message"]) == ("failed", "exceeded its time limit of 60s")


def test_restart_adopts_running_tasks_and_never_launches_them_twice(w: World) -> None:
    jid = w.submit(job("a").task(2, gpu=1).build())
    launched = len(w.fx.launched)
    w.restart()
    w.sched.step()
    assert len(w.fx.launched) == launched
    assert w.state(jid)["state"] == "running"
    assert "adopted" in w.events(jid)
    # The adopted job's resources are held: a job needing every GPU waits.
    other = w.submit(job("b").task(gpu=4).build())
    assert w.state(other)["state"] == "pending"
    for key in w.fx.keys(jid):
        w.fx.exit(key, 0)
    w.sched.step()
    assert w.state(jid)["state"] == "succeeded"
    assert w.state(other)["state"] == "running"


def test_restart_finds_a_task_that_ended_while_it_was_down(w: World) -> None:
    jid = w.submit(job("a").task(2, gpu=1).build())
    k0, k1 = w.fx.keys(jid)
    w.fx.crash_while_down(k0, 9)
    w.restart()
    assert w.fx.stops == [k1]  # the rest of the gang is stopped
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["failures"], row["exit_code"]) == ("pending", 1, 9)


def test_restart_requeues_a_launch_that_never_happened_without_counting_a_failure(
    w: World,
) -> None:
    w.fx.fail_launch.add("never")  # irrelevant name: nothing fails
    jid = w.submit(job("a").task(gpu=1).build())
    (key,) = w.fx.keys(jid)
    # As if the scheduler died after writing the task row but before starting it.
    del w.fx.running[key]
    with w.store.tx() as tx:
        tx.update_task(*key, {"state": "launching", "handle": None})
    w.restart()
    row = w.state(jid)
    assert (row["state"], row["failures"]) in {("pending", 0), ("running", 0)}
    w.sched.step()
    assert w.state(jid)["attempt"] == 2
    assert "requeued" in w.events(jid)


def test_a_launch_failure_rolls_the_gang_back(w: World) -> None:
    w.fx.fail_launch.add("g0-1")
    jid = w.submit(job("a").task(2, gpu=1).build())
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["failures"]) == ("pending", 1)
    assert w.fx.running == {}
    assert "could not start" in str(row["reason"]) or row["not_before"] is not None
    # Placed, but one of its tasks could not start: the attempt never started.
    assert "started" not in w.events(jid)
    assert w.events(jid)[:2] == ["submitted", "placed"]


def test_a_launch_that_can_never_start_fails_the_job_without_a_retry(w: World) -> None:
    # A path its user may not mount, containers off on the node: it was retried as a task
    # lost, each attempt failing the same way.
    w.fx.refuse_launch.add("g0-1")
    jid = w.submit(job("a").task(2, gpu=1).build())
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["failures"]) == ("failed", 1)
    assert row["message"] == "task g0-1 could not start: g0-1 may never start here; not retried"
    assert w.fx.running == {}


class Crash(Exception):
    """The scheduler process dying at that point: the test restarts it. (The loop logs and
    drops the exception: the old loop is simply not used again.)"""


def test_a_launch_committed_but_never_made_shows_no_start(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    died: list[str] = []

    def die(name: str) -> None:
        if name == failpoints.PAUSE_BEFORE_LAUNCH:
            died.append(name)
            raise Crash(name)

    monkeypatch.setattr(launches.failpoints, "hit", die)
    fut = w.sched.submit(job("a").task(gpu=1).build())
    w.sched.step()
    assert died and w.fx.launched == []
    jid = str(fut.result(0)["id"])
    assert "started" not in w.events(jid)
    assert w.events(jid) == ["submitted", "placed"]
    monkeypatch.undo()
    w.restart()  # the launch is given up, requeued, and made this time
    w.sched.step()
    assert (w.state(jid)["state"], w.state(jid)["attempt"]) == ("running", 2)
    assert w.events(jid).count("started") == 1
    assert w.events(jid) == ["submitted", "placed", "task-exited", "requeued", "placed", "started"]
    assert [t.attempt for t in w.fx.launched] == [2]


def test_a_launch_made_but_not_recorded_is_started_on_recovery(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Batch.flush
    died: list[str] = []

    def flush(batch: Batch, store: Store) -> None:
        if w.fx.launched:  # the batch recording the launch: the process dies before it lands
            died.append("flush")
            raise Crash("before the launch was recorded")
        real(batch, store)

    monkeypatch.setattr(Batch, "flush", flush)
    fut = w.sched.submit(job("a").task(2, gpu=1).build())
    w.sched.step()
    assert died and len(w.fx.launched) == 2
    jid = str(fut.result(0)["id"])
    assert w.events(jid) == ["submitted", "placed"]
    monkeypatch.undo()
    w.restart()  # both tasks are found running: the attempt started after all
    assert w.events(jid) == ["submitted", "placed", "started", "adopted", "adopted"]
    assert len(w.fx.launched) == 2 and w.state(jid)["attempt"] == 1


def test_the_predictor_learns_runtimes_and_relearns_them_after_a_restart(pw: World) -> None:
    w = pw
    first = w.submit(job("train-1").task(gpu=1).build())
    assert w.state(first)["predicted_s"] == pytest.approx(3600.0)  # no history yet: the prior
    for n in range(3):  # three runs of one sweep, 100 s, 200 s, 300 s
        jid = w.submit(job(f"sweep-{n}").task(gpu=1).name(f"sweep-{n}").build())
        w.clock.t += 100.0 * (n + 1)
        w.fx.exit(w.fx.keys(jid)[0], 0)
        w.sched.step()
    nxt = w.submit(job("sweep-9").task(gpu=1).name("sweep-9").build())
    assert w.state(nxt)["predicted_s"] == pytest.approx(200.0)  # the sweep's median
    w.restart()  # a fresh predictor warms up from the store
    later = w.submit(job("sweep-10").task(gpu=1).name("sweep-10").build())
    assert w.state(later)["predicted_s"] == pytest.approx(200.0)


def test_a_jobs_own_estimate_outweighs_its_users_unrelated_short_jobs(pw: World) -> None:
    """The README's ETA demo after the user has run `aisched run -- true` five times: `big`
    (`--estimate 30s`) is predicted its own 30 s, not the median of five jobs of another name
    (a second), so `waits` is reserved from 30 s on, not overdue after one."""
    w = pw
    for _ in range(5):
        jid = w.submit(job("t").task(cpu=1).name("true").build())
        w.clock.t += 0.1
        w.fx.exit(w.fx.keys(jid)[0], 0)
        w.sched.step()
    start = w.clock.t
    big = w.submit(job("big").task(gpu=4).name("big").estimate(30.0).build())
    waits = w.submit(job("waits").task(gpu=1).name("waits").build())
    assert (w.state(big)["predicted_s"], w.state(big)["predicted_upper_s"]) == (
        pytest.approx(30.0),
        pytest.approx(30.0),
    )
    w.clock.t += 5
    w.sched.step()  # the periodic cycle works the estimated starts out
    row = w.state(waits)
    assert (row["state"], row["reason_code"]) == ("pending", "reserved")
    assert row["eta"] == pytest.approx(start + 30.0)


def test_after_a_restart_the_predictor_is_fitted_by_the_first_step_not_on_the_start_path(
    pw: World,
) -> None:
    """Recovery only feeds the predictor the finished jobs (the service is not ready until
    recovery ends): the jobs recovered pending get the history's answer, and the loop's first
    step fits once, on all of them, before its cycle."""
    w = pw
    for n in range(4):
        jid = w.submit(job(f"sweep-{n}").task(gpu=1).name(f"sweep-{n}").build())
        w.clock.t += 100.0 * (n + 1)
        w.fx.exit(w.fx.keys(jid)[0], 0)
        w.sched.step()
    w.submit(job("hog").task(gpu=4).build())  # runs on, holding every GPU
    held = w.submit(job("held").task(gpu=1).build())  # so this one waits
    w.sched = make_scheduler(w.store, w.fx, w.clock, w.home)
    predictor = w.sched.predictor = RuntimePredictor(PredictorConfig(min_fit=3, max_iter=5))
    w.sched.recover()
    assert predictor.stats.observed == 4
    assert predictor.stats.fits == 0 and not predictor.fitted  # nothing fitted on the start path
    # The jobs recovered (one running, one pending) got the history's answers.
    assert predictor.stats.predicted == 2
    assert all(source.startswith("history") for source in predictor.stats.by_source)
    w.sched.step()
    assert predictor.stats.fits == 1 and predictor.fitted
    w.sched.step()
    assert predictor.stats.fits == 1  # once
    assert w.state(held)["state"] == "pending"


def test_a_running_job_expects_to_end_by_its_predicted_upper_runtime_also_after_a_restart(
    pw: World,
) -> None:
    """A preemptive policy (qssf) weighs running jobs by when they should end: a job with no
    estimate of its own must get the predictor's bound, not none (endless)."""
    w, clock = pw, pw.clock
    unestimated = w.submit(job("a").task(gpu=1).build())
    estimated = w.submit(job("b").task(gpu=1).estimate(50.0).build())
    upper = w.state(unestimated)["predicted_upper_s"]
    assert isinstance(upper, float) and upper > 0
    start = clock.t

    def expected_end(jid: str) -> float | None:
        view = w.sched.jobs[jid].running_view
        assert view is not None
        return view.expected_end_s

    assert expected_end(unestimated) == pytest.approx(start + upper)
    clock.t += 10.0
    w.restart()  # recovered running jobs are bounded the same way
    assert expected_end(unestimated) == pytest.approx(start + upper)
    # The bound order is the core's: the prediction's upper bound before the user's estimate.
    upper_b = w.state(estimated)["predicted_upper_s"]
    assert isinstance(upper_b, float)
    assert expected_end(estimated) == pytest.approx(start + upper_b)


@pytest.mark.parametrize("refresh", [True, False])
def test_a_job_starts_with_the_bound_the_finishes_while_it_waited_taught(
    pw: World, refresh: bool
) -> None:
    """Calibrating a bound again at the start (`PredictorConfig.calib_refresh`), as the
    simulator does: jobs that finished while "x" waited ran ten times their prediction, so "x"
    starts with a wider bound than it was predicted with, and keeps the one it waited with for
    the backlog's drain time (`waited_end_s`). Without refresh it keeps the bound it waited
    with."""
    w = pw
    cfg = PredictorConfig(calib_min_group=3, calib_window=4, calib_group_window=4)
    w.sched.predictor = RuntimePredictor(replace(cfg, calib_refresh=refresh))
    ahead = [w.submit(job(f"b{i}").task(gpu=1).build()) for i in range(4)]  # all 4 GPUs
    x = w.submit(job("x").task(gpu=1).build())
    assert w.state(x)["state"] == "pending"
    waited_upper = w.state(x)["predicted_upper_s"]
    assert isinstance(waited_upper, float)
    w.clock.t += 10 * 3600.0  # ten times the prior's median
    for jid in ahead:
        w.fx.exit(w.fx.keys(jid)[0], 0)
    w.sched.step()
    w.sched.step()
    assert w.state(x)["state"] == "running"
    view = w.sched.jobs[x].running_view
    assert view is not None
    if refresh:
        assert view.expected_end_s is not None
        assert view.expected_end_s - view.started_s > 2 * waited_upper
        assert view.waited_end_s == pytest.approx(view.started_s + waited_upper)
    else:
        assert view.expected_end_s == pytest.approx(view.started_s + waited_upper)
        assert view.waited_end_s is None


def test_while_launches_are_held_a_due_job_waits_saying_why_and_the_loop_does_not_spin(
    w: World,
) -> None:
    # Held launches (a full disk) skipped the cycle but left it due: the loop stepped again at
    # once, for as long as the hold lasted, and kept a core busy.
    held = ["disk pressure: 0 MiB free for the data directory D, below the 8 MiB it keeps free"]
    w.sched.launch_hold = lambda: held[0] if held else None
    jid = w.submit(job("x").task(1, cpu=1).build())
    assert w.sched.step() > 0
    row = w.state(jid)
    assert (row["state"], row["reason"]) == ("pending", f"launches are held: {held[0]}")
    held.clear()
    w.sched.step()
    assert w.state(jid)["state"] == "running"


def test_a_fresh_state_database_gives_out_no_id_whose_files_the_data_directory_holds(
    w: World, caplog: pytest.LogCaptureFixture
) -> None:
    # A damaged database moved aside (as its error says) leaves the old jobs' folders: a new
    # job 1 was refused its launch (tasks/1 existed), read job 1's old log and checkpoints.
    # Said as a warning (it was an info note): a database that lost its jobs by accident (its
    # WAL file deleted under a running service) looks the same, and was noticed by nobody.
    for kind, name in (("logs", "7"), ("tasks", "5"), ("checkpoints", "3"), ("logs", "x9")):
        (w.home / kind / name).mkdir(parents=True, exist_ok=True)
    w.sched = make_scheduler(w.store, w.fx, w.clock, w.home)
    with caplog.at_level(logging.WARNING, logger="aisched.loop"):
        w.sched.recover()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "the data directory holds files of jobs up to 7 that the state database does not know: "
        "unless it was moved aside on purpose, the database has lost them (a deleted "
        "state.db-wal, a truncated or replaced state.db): stop aisched and restore the "
        "database from a backup; new jobs start at 8"
    ]
    assert w.submit(job("").task(1, gpu=1).build()) == "8"
    w.restart()  # known to the database now: no note, and the next id follows it
    assert w.submit(job("").task(1, gpu=1).build()) == "9"


def _messages(w: World, job_id: str) -> dict[str, str]:
    with w.store.read() as tx:
        return {e["kind"]: e["message"] for e in tx.events_of(job_id)}


def test_a_stop_under_way_at_a_restart_ends_with_the_reason_it_began_with(w: World) -> None:
    # Its message is not stored: after a restart in the grace, a preemption ended "; requeued".
    low = w.submit(job("low").task(gpu=2).priority(0).build())
    (low_key,) = w.fx.keys(low)
    gang = w.submit(job("gang").task(2, gpu=1).build())
    quit_key, stayed_key = w.fx.keys(gang)
    w.fx.stubborn |= {low_key, stayed_key}  # each in its grace when the scheduler restarts
    w.fx.exit(quit_key, 3)
    w.sched.step()
    w.submit(job("high").task(gpu=2).priority(10).build())
    assert (w.state(low)["stopping"], w.state(gang)["stopping"]) == ("preempt", "failed")
    preempting = _messages(w, low)["preempting"]
    w.restart()
    for key in (low_key, stayed_key):
        w.fx.stubborn.discard(key)
        w.fx.exit(key, -15, ExitKind.STOPPED)
    w.sched.step()
    assert _messages(w, low)["preempted"] == (
        preempting.removesuffix(": stopping its tasks") + "; requeued"
    )
    assert _messages(w, gang)["retrying"].startswith("task g0-0 exited with code 3; retry 1 of 3")


def test_a_restart_keeps_a_preemptors_wait_and_preempts_no_one_more(w: World) -> None:
    """The wait for a victim that ignores SIGTERM lived in memory only: after a restart the
    waiting job was an ordinary pending one, and the next cycle preempted a second victim for
    it (one 1-GPU job evicted two), and it started later, on the second one's GPU."""
    lows = [w.submit(job(f"low{i}").task(gpu=1).priority(0).build()) for i in range(4)]
    for low in lows:
        w.fx.stubborn.update(w.fx.keys(low))
    high = w.submit(job("high").task(gpu=1).priority(10).build())
    assert len(w.fx.stops) == 1
    (victim,) = [low for low in lows if w.state(low)["stopping"] == "preempt"]
    w.restart()
    for _ in range(3):
        w.sched.step()
    assert len(w.fx.stops) == 2  # the victim's stop, resumed by the restart: no other victim
    assert w.fx.stops[1] == w.fx.stops[0]
    assert f"waiting for preempted job(s) {victim} to stop" in str(w.state(high)["reason"])
    (key,) = w.fx.keys(victim)
    w.fx.exit(key, -9, ExitKind.STOPPED)  # killed at the end of its grace
    w.sched.step()
    w.sched.step()
    assert w.state(high)["state"] == "running"
    assert [low for low in lows if w.state(low)["state"] == "running"] == [
        low for low in lows if low != victim
    ]
    with w.store.read() as tx:
        assert (tx.get_job(high) or {})["waiting_for"] is None


def test_a_preemptors_reason_says_its_victim_was_cancelled_meanwhile(w: World) -> None:
    """Every job a wait was for was called preempted, whatever stopped it: a victim cancelled
    while it stopped went on being "preempted"."""
    low = w.submit(job("low").task(gpu=4).priority(0).build())
    w.fx.stubborn.update(w.fx.keys(low))
    high = w.submit(job("high").task(gpu=4).priority(10).build())
    assert w.state(high)["reason"] == f"waiting for preempted job(s) {low} to stop"
    assert w.sched.cancel(low) is not None
    w.sched.step()
    w.sched.step()
    assert w.state(low)["stopping"] == "cancel"
    assert w.state(high)["reason"] == f"waiting for cancelled job(s) {low} to stop"


def test_a_preemptors_reason_names_only_the_victims_still_stopping(w: World) -> None:
    """A waiting preemptor's reason named every victim it waited for at first, also those
    that had stopped since: it said "waiting for preempted job(s) 1, 2" while only 2 held it."""
    first = w.submit(job("a").task(gpu=2).priority(0).build())
    second = w.submit(job("b").task(gpu=2).priority(0).build())
    w.fx.stubborn.update(w.fx.keys(first) + w.fx.keys(second))
    high = w.submit(job("high").task(gpu=4).priority(10).build())
    assert w.state(high)["reason"] == f"waiting for preempted job(s) {first}, {second} to stop"
    (key,) = w.fx.keys(first)
    w.fx.exit(key, -15, ExitKind.STOPPED)
    w.sched.step()
    assert w.state(first)["state"] == "pending"
    assert (w.state(high)["state"], w.state(high)["reason"]) == (
        "pending",
        f"waiting for preempted job(s) {second} to stop",
    )
    w.restart()  # a wait resumed after a restart says the same
    w.sched.step()
    assert w.state(high)["reason"] == f"waiting for preempted job(s) {second} to stop"
    (key,) = w.fx.keys(second)
    w.fx.exit(key, -15, ExitKind.STOPPED)
    w.sched.step()
    w.sched.step()
    assert (w.state(high)["state"], w.state(high)["reason"]) == ("running", None)


def _holds_freed_gpus_for_the_preemptor(
    w: World, running: list[str], waiting: list[str], big_job: Job, restart: bool
) -> None:
    """`running` fill the 8 GPUs, GPU i for running[i]; `waiting` would fit any freed GPU. The
    first running job ignores SIGTERM (a slow victim). `big_job` (4 GPUs) then takes GPUs 0-3.
    While the slow victim stops, what the others freed is held for that job, and it starts
    there in the step the slow one stops. Without the hold a cycle bound a waiting job (a
    requeued victim among them) to a freed GPU, and the preemptor evicted it again: a storm of
    preemptions, jobs at attempt 6 within a second (an audit of the live service). `restart`:
    the scheduler restarts once the fast victims have stopped; what was held lived in memory
    only, and the first cycle after the restart gave it away."""
    slow = running[0]
    (slow_key,) = w.fx.keys(slow)
    w.fx.stubborn.add(slow_key)
    victims, others = running[:4], running[4:]
    launched = len(w.fx.launched)
    big = w.submit(big_job)
    stopped = {(v, 1) for v in victims}  # (job, attempt); a restart stops the slow one again
    assert {k[:2] for k in w.fx.stops} == stopped
    w.sched.step()  # the fast victims' exits come in
    if restart:
        w.restart()
    for _ in range(4):  # cycles run (every 5 s), all within the victims' grace
        w.sched.step()
        w.clock.t += 5.0
    assert [w.state(v)["state"] for v in victims] == ["running", "pending", "pending", "pending"]
    assert [w.state(j)["state"] for j in waiting] == ["pending"] * len(waiting)
    assert len(w.fx.launched) == launched  # nothing started on GPUs 1-3
    assert w.sched.gpu_owners().keys() == {("box", g) for g in (0, 4, 5, 6, 7)}
    assert (w.state(big)["waiting_for"] or {})["victims"] == [slow]
    w.fx.stubborn.discard(slow_key)
    w.fx.exit(slow_key, -9, ExitKind.STOPPED)  # killed at the end of its grace
    w.sched.step()
    assert (w.state(big)["state"], w.fx.launched[-1].gpus) == ("running", (0, 1, 2, 3))
    for _ in range(3):
        w.sched.step()
        w.clock.t += 5.0
    assert {k[:2] for k in w.fx.stops} == stopped  # nobody evicted twice
    assert [w.state(j)["attempt"] for j in running] == [1] * 8
    assert [w.state(j)["state"] for j in (*victims, *waiting)] == ["pending"] * (4 + len(waiting))
    assert [w.state(j)["state"] for j in others] == ["running"] * 4


@pytest.mark.parametrize("restart", [False, True], ids=["", "over-a-restart"])
def test_gpus_freed_for_a_preemptor_of_higher_priority_are_held_for_it(
    tmp_path: Path, restart: bool
) -> None:
    w = new_world(tmp_path, FakeExecutor([fake_node(gpus=8)]))
    running = [w.submit(job(f"low{i}").task(gpu=1).build()) for i in range(8)]
    waiting = [w.submit(job(f"more{i}").task(gpu=1).build()) for i in range(2)]
    big = job("big").task(gpu=4).priority(10).build()
    _holds_freed_gpus_for_the_preemptor(w, running, waiting, big, restart)
    w.store.close()


@pytest.mark.parametrize("restart", [False, True], ids=["", "over-a-restart"])
def test_gpus_reclaimed_for_a_queues_guarantee_are_held_for_the_job_that_waits(
    tmp_path: Path, restart: bool
) -> None:
    """The audit: teama and teamb guaranteed 4 GPUs each of 8, scratch at most 3, equal
    priorities. Scratch's 3 jobs and teama's 5 run; teamb's 4-GPU job takes back the 3 of
    scratch and 1 of teama (beyond its guarantee)."""
    queues = QueueTree(
        (
            Queue("teama", guarantee=Resources(gpu=4)),
            Queue("teamb", guarantee=Resources(gpu=4)),
            Queue("scratch", limit=Resources(gpu=3)),
        )
    )
    w = new_world(tmp_path, FakeExecutor([fake_node(gpus=8)]), queues=queues)
    running = [w.submit(job(f"s{i}").task(gpu=1).queue("scratch").build()) for i in range(3)]
    running += [w.submit(job(f"a{i}").task(gpu=1).queue("teama").build()) for i in range(5)]
    waiting = [
        w.submit(job("s3").task(gpu=1).queue("scratch").build()),
        w.submit(job("a5").task(gpu=1).queue("teama").build()),
    ]
    big = job("big").task(gpu=4).queue("teamb").build()
    _holds_freed_gpus_for_the_preemptor(w, running, waiting, big, restart)
    w.store.close()


def test_a_child_queue_reclaims_its_parents_guarantee(tmp_path: Path) -> None:
    """org is guaranteed 4 of 8 GPUs; train, its child, has no guarantee of its own. scratch
    borrowed all 8: train's 2-GPU job takes back 2 of them (reclaimed), and runs once they
    stopped. Only the leaf's own guarantee counted, and train's job waited for ever."""
    queues = QueueTree(
        (
            Queue("org", guarantee=Resources(gpu=4)),
            Queue("train", parent="org"),
            Queue("scratch"),
        )
    )
    w = new_world(tmp_path, FakeExecutor([fake_node(gpus=8)]), queues=queues)
    borrowers = [w.submit(job(f"s{i}").task(gpu=1).queue("scratch").build()) for i in range(8)]
    mine = w.submit(job("t").task(gpu=2).queue("train").build())
    stopping = [s for s in borrowers if w.state(s)["stopping"] == "preempt"]
    assert len(stopping) == 2 and len(w.fx.stops) == 2
    assert w.state(mine)["reason_code"] == "preempting"
    w.sched.step()  # the stops are reported; the victims are requeued and the job starts
    assert w.state(mine)["state"] == "running"
    assert [w.state(s)["state"] for s in stopping] == ["pending", "pending"]
    assert _messages(w, stopping[0])["preempting"].startswith(f"reclaimed for {mine}")
    w.store.close()


def test_a_job_started_short_of_its_tasks_says_how_many_ran_when_it_succeeds(w: World) -> None:
    """min_available 1 of 8 tasks of 4 CPUs on 16 CPUs: 4 start and the other 4 never do; the
    job's end used to say `all tasks exited with code 0`."""
    jid = w.submit(job("x").task(8, cpu=4).min_available(1).build())
    keys = w.fx.keys(jid)
    assert len(keys) == 4
    for key in keys:
        w.fx.exit(key, 0)
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["message"]) == (
        "succeeded",
        "all 4 tasks that started (of 8) exited with code 0",
    )
    assert _messages(w, jid)["succeeded"] == row["message"]


def test_a_volcano_tasks_command_expands_dollar_names_against_its_environment(w: World) -> None:
    """Kubernetes expands `$(NAME)` in a container's command, args and env values; a Volcano
    file's `--rank=$(VC_TASK_INDEX)` reached the task as written. A native job's command is
    run as written."""
    text = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: v}
spec:
  tasks:
    - replicas: 2
      template:
        spec:
          containers:
            - command: [sh, -c, 'echo $(VC_TASK_INDEX) $$(VC_TASK_INDEX) $(NOPE)']
              args: ["--rank=$(VC_TASK_INDEX)", "--of=$(WORLD_SIZE)", "--in=$(WHERE)", "$$$$"]
              env:
                - {name: BASE, value: /data}
                - {name: WHERE, value: "$(BASE)/in"}
                - {name: EARLY, value: "$(LATE)"}
                - {name: LATE, value: x}
"""
    parsed = parse_job_text(text, "v.yaml")
    jid = w.submit(parsed.job)
    launches = sorted((t for t in w.fx.launched if t.job_id == jid), key=lambda t: t.task)
    assert [t.command for t in launches] == [
        ("sh", "-c", f"echo {i} $(VC_TASK_INDEX) $(NOPE)", f"--rank={i}", "--of=2",
         "--in=/data/in", "$$")
        for i in (0, 1)
    ]  # fmt: skip
    assert (launches[0].env["WHERE"], launches[0].env["EARLY"]) == ("/data/in", "$(LATE)")
    plain = job("n").task(1, cpu=1).build()
    written = ("echo", "$(VC_TASK_INDEX)", "$$")
    native = w.submit(replace(plain, groups=(replace(plain.groups[0], command=written),)))
    (launch,) = (t for t in w.fx.launched if t.job_id == native)
    assert launch.command == written
    w.restart()  # the stored job keeps what it came from
    assert w.sched.jobs[jid].job.groups[0].kubernetes_pod


def test_a_command_that_dollar_names_make_too_large_fails_at_launch_without_a_retry(
    w: World,
) -> None:
    """A name the scheduler sets is known at the launch only: 5,000 times
    `$(AISCHED_CHECKPOINT_DIR)` passed the file's checks, then exec failed with `Argument list
    too long`, said of the program, at each of the job's retries."""
    text = f"""
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: v}}
spec:
  tasks:
    - name: lead
      template: {{spec: {{containers: [{{command: [echo, ok]}}]}}}}
    - name: work
      template:
        spec:
          containers:
            - command: [echo]
              args: [a, "{"$(AISCHED_CHECKPOINT_DIR)" * 5000}"]
"""
    jid = w.submit(parse_job_text(text, "v.yaml").job)
    row = w.state(jid)
    size = 5000 * len(str(row["checkpoint_dir"]))
    assert (row["state"], row["failures"], row["message"]) == (
        "failed",
        1,
        f"task lead-0 could not start: task work-0: word 2 of its command (command then args, "
        f"from 0) is {size:,} bytes once $(NAME) is expanded: a program gets at most 130,048 "
        "bytes in each argument or variable (the kernel's limit); not retried",
    )
    assert [t for t in w.fx.launched if t.job_id == jid] == []


PYTORCH_WORKERS_FIRST = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: ddp}
spec:
  plugins: {pytorch: [--master=lead, --worker=work]}
  tasks:
    - name: work
      replicas: 2
      template: {spec: {containers: [{command: [python, train.py]}]}}
    - name: lead
      template: {spec: {containers: [{command: [python, train.py]}]}}
"""


def test_volcanos_pytorch_plugin_gives_its_master_rank_0_wherever_the_file_lists_it(
    w: World,
) -> None:
    """The pytorch plugin's `--master` task is RANK 0 (and MASTER_ADDR its host), its workers
    index + 1; aisched ranked the tasks in file order, so the first worker was RANK 0."""
    parsed = parse_job_text(PYTORCH_WORKERS_FIRST, "ddp.yaml")
    assert parsed.warnings == ()
    jid = w.submit(parsed.job)
    launches = sorted((t for t in w.fx.launched if t.job_id == jid), key=lambda t: t.task)
    assert [(t.task, t.env["RANK"], t.env["WORLD_SIZE"]) for t in launches] == [
        ("lead-0", "0", "3"),
        ("work-0", "1", "3"),
        ("work-1", "2", "3"),
    ]
    assert w.state(jid)["state"] == "running"


def _quick_exit(w: World, jid: str) -> float:
    """The running attempt of `jid` exits at once with 0; the wait before its restart."""
    (key,) = w.fx.keys(jid)
    w.fx.exit(key, 0)
    w.sched.step()
    row = w.state(jid)
    assert row["state"] == "pending"
    return float(row["not_before"]) - w.clock.t  # type: ignore[arg-type]


def _restarted(w: World, jid: str, wait: float) -> None:
    w.clock.t += wait
    w.sched.step()
    w.sched.step()
    assert w.state(jid)["state"] == "running"


def test_the_quick_exits_of_a_job_restarting_always_outlive_a_scheduler_restart(
    w: World,
) -> None:
    """The count of quick clean exits in a row was kept in memory only: after a scheduler
    restart the doubling wait before the next restart began again at its least."""
    jid = w.submit(
        replace(job("loop").task(gpu=1).backoff(1).build(), restart_policy=RestartPolicy.ALWAYS)
    )
    waits = []
    for _ in range(3):
        waits.append(_quick_exit(w, jid))
        _restarted(w, jid, waits[-1])
    assert waits == [1.0, 2.0, 4.0]
    w.restart()
    w.sched.step()
    assert _quick_exit(w, jid) == 8.0
    w.restart()  # while it waits: the count is the one after this exit
    _restarted(w, jid, 8.0)
    assert _quick_exit(w, jid) == 16.0

"""A bug that one job or one event sets off must not stop the others.

A job the scheduling cycle fails on (here a filter plugin that raises on one job name) is held
back for a while and every other job is scheduled without it; before, every step failed and no
one's job started again until a restart. A task exit whose handling raises holds its job for
a while, and is handled (or its attempt ended) when the hold is over; the exits behind it are
handled in the same step. Before, the exits behind it were handled by the next step, and it
was lost, its job running for ever in the service's books. A bug met handling one job's time
limit or re-checking its dependencies leaves that job alone for a while and the step goes on;
before, every step failed on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from world import World, new_world

from aisched.core.dependencies import DependencyCheck
from aisched.core.policy import preset
from aisched.core.session import Session
from aisched.core.snapshot import BoolArray, PendingJob
from aisched.model.job import Dependency, Job
from aisched.model.queue import QueueTree
from aisched.model.resources import Resources
from aisched.predict.runtime import RuntimePredictor
from aisched.service import poison
from aisched.service.exits import Exits
from aisched.service.intents import Intents
from aisched.service.live import LiveJob
from aisched.service.loop import LoopConfig, Rejected, Scheduler
from aisched.service.metrics import Metrics
from aisched.service.scheduler_state import clock
from aisched.testing import job


@dataclass(frozen=True)
class BuggyFilter:
    """A filter plugin with a bug that only jobs of the names in `fails_on` meet, when placed
    for real (and, with `at_submission`, in the check at submission on the empty cluster)."""

    fails_on: set[str] = field(default_factory=set)
    name: str = "buggy"
    at_submission: bool = False  # the check at submission meets it too

    def mask(self, session: Session, job: Job, request: Resources) -> BoolArray | None:
        if job.name in self.fails_on and (self.at_submission or not session.imagine_empty):
            raise KeyError(f"no role for {job.name!r}")
        return None


def _buggy_world(home: Path, database_url: str | None, bug: BuggyFilter) -> World:
    w = new_world(home, database_url=database_url)
    w.sched = _scheduler(w, bug)
    w.sched.recover()
    return w


def _scheduler(w: World, bug: BuggyFilter | None) -> Scheduler:
    default = preset("default")
    policy = default if bug is None else replace(default, filters=(*default.filters, bug))
    return Scheduler(
        w.store,
        w.fx,
        policy,
        QueueTree(),
        LoopConfig(data_dir=w.home, cycle_interval_s=5.0, cycle_gap_factor=0),
        clock=w.clock,
        predictor=RuntimePredictor(),
    )


@pytest.fixture
def buggy(tmp_path: Path, database_url: str | None) -> tuple[World, BuggyFilter]:
    bug = BuggyFilter({"poison"})
    return _buggy_world(tmp_path, database_url, bug), bug


def test_the_job_a_cycle_fails_on_is_held_and_the_others_start(
    buggy: tuple[World, BuggyFilter],
) -> None:
    w, _ = buggy
    before = w.submit(job("first").name("first").task(1, gpu=1).build())
    bad = w.submit(job("poison").name("poison").task(1, gpu=1).build())
    after = w.submit(job("after").name("after").task(1, gpu=1).build())
    w.sched.step()
    assert [w.state(i)["state"] for i in (before, bad, after)] == ["running", "pending", "running"]
    assert not w.sched.step_errors.failing
    held = w.state(bad)
    assert held["not_before"] == w.clock.t + poison.HOLD_S
    reason = str(held["reason"])
    assert reason.startswith("held until ")
    why = "the scheduler fails on this job (a bug, logged: KeyError: \"no role for 'poison'\")"
    assert why in reason
    assert "held" in w.events(bad)
    metrics = Metrics()
    metrics.watch(w.sched)
    assert "aisched_jobs_held_for_cycle_errors_total 1.0" in metrics.render().decode().splitlines()
    # Jobs submitted while it is held start as before.
    later = w.submit(job("later").name("later").task(1, gpu=1).build())
    assert w.state(later)["state"] == "running"
    assert w.state(bad)["state"] == "pending"


def test_a_held_job_is_tried_again_and_held_again_while_the_bug_stays(
    buggy: tuple[World, BuggyFilter],
) -> None:
    w, _ = buggy
    bad = w.submit(job("poison").name("poison").task(1, gpu=1).build())
    w.sched.step()
    first_hold = w.state(bad)["not_before"]
    assert first_hold is not None
    w.clock.t = float(first_hold) + 1  # type: ignore[arg-type]
    w.sched.step()
    w.sched.step()
    assert w.state(bad)["state"] == "pending"
    assert w.state(bad)["not_before"] == w.clock.t + poison.HOLD_S
    assert w.sched.stats.held_for_cycle_errors == 2
    assert w.events(bad).count("held") == 2


def test_a_held_job_starts_once_the_service_runs_without_the_bug(
    buggy: tuple[World, BuggyFilter],
) -> None:
    """The hold is stored (it is the retry backoff's field): a service restarted on a fixed
    version starts the job when the hold ends, not before."""
    w, _ = buggy
    bad = w.submit(job("poison").name("poison").task(1, gpu=1).build())
    w.sched.step()
    until = float(w.state(bad)["not_before"])  # type: ignore[arg-type]
    w.sched = _scheduler(w, None)
    w.sched.recover()
    w.sched.step()
    assert w.state(bad)["state"] == "pending"
    w.clock.t = until
    w.sched.step()
    w.sched.step()
    assert w.state(bad)["state"] == "running"
    assert w.state(bad)["not_before"] is None


def test_a_cycle_that_fails_on_every_job_still_fails_the_step(
    tmp_path: Path, database_url: str | None
) -> None:
    """Past `MAX_HELD_PER_CYCLE` jobs held in one cycle the failure is not one job's: the step
    fails (counted, backed off, readiness says so), as any bug's does."""
    names = {f"j{i}" for i in range(poison.MAX_HELD_PER_CYCLE + 1)}
    w = _buggy_world(tmp_path, database_url, BuggyFilter(names))
    for n in sorted(names):
        w.sched.submit(job(n).name(n).task(1, gpu=1).build())
    with pytest.raises(KeyError):
        w.sched.step()
    assert w.sched.stats.held_for_cycle_errors == poison.MAX_HELD_PER_CYCLE


def _failing_on(culprits: set[str], runs: list[int]) -> object:
    def run(part: Sequence[PendingJob]) -> None:
        runs.append(len(part))
        hit = [p.job.name for p in part if p.job.name in culprits]
        if hit and (len(culprits) == 1 or set(hit) == culprits):
            raise ValueError(",".join(hit))

    return run


def _pending(n: int) -> list[PendingJob]:
    return [PendingJob(job(f"j{i}").name(f"j{i}").task(1, gpu=1).build()) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_halving_finds_the_one_job_in_few_runs(n: int) -> None:
    pending = _pending(n)
    runs: list[int] = []
    found = poison.job_it_fails_on(_failing_on({f"j{n - 1}"}, runs), pending)  # type: ignore[arg-type]
    assert found is not None
    view, error = found
    assert view is pending[-1]
    assert str(error) == f"j{n - 1}"
    assert len(runs) <= 2 * max(n - 1, 1).bit_length() + 2


def test_no_single_job_is_blamed_for_a_mix_or_for_what_fails_without_any() -> None:
    pending = _pending(6)
    mix = poison.job_it_fails_on(_failing_on({"j0", "j5"}, []), pending)  # type: ignore[arg-type]
    assert mix is None

    def always(part: Sequence[PendingJob]) -> None:
        raise RuntimeError("the running jobs set it off")

    assert poison.job_it_fails_on(always, pending) is None


@pytest.mark.parametrize("marked", [False, True], ids=["before-marking", "task-marked-exited"])
def test_an_exit_whose_handling_raises_holds_its_job_and_ends_it_when_the_hold_is_over(
    w: World, monkeypatch: pytest.MonkeyPatch, marked: bool
) -> None:
    """Before, the exit was dropped (and the step failed): its job ran for ever in the
    service's books, holding its GPU. The bug meets the exit before anything is done, or
    after its task is marked exited (then the exit is not handled again: the attempt is
    ended)."""
    a, b, c = (w.submit(job(n).task(1, gpu=1).build()) for n in "abc")
    bug = {b}
    real = Exits._end_attempt if marked else Exits._on_exit

    def with_a_bug(self: Exits, first: Any, *args: Any) -> None:
        job_id = first.id if marked else first.key[0]
        if job_id in bug:
            raise RuntimeError("a bug met by this exit")
        real(self, first, *args)

    monkeypatch.setattr(Exits, "_end_attempt" if marked else "_on_exit", with_a_bug)
    for job_id in (a, b, c):
        (key,) = w.fx.keys(job_id)
        w.fx.exit(key, 0)
    w.sched.step()
    assert not w.sched.step_errors.failing
    assert [w.state(i)["state"] for i in (a, b, c)] == ["succeeded", "running", "succeeded"]
    assert "held" in w.events(b)
    bug.clear()
    w.clock.t += poison.HOLD_S
    w.sched.step()
    w.sched.step()
    assert w.state(b)["state"] == "succeeded"
    # Its GPU is free again: a job needing all four starts.
    assert w.state(w.submit(job("d").task(1, gpu=4).build()))["state"] == "running"


def test_a_submission_the_admission_check_fails_on_is_refused_and_the_step_goes_on(
    tmp_path: Path, database_url: str | None
) -> None:
    """Before, the check's error failed the whole step: the other commands behind it waited
    for the back-off, and readiness said the step was failing, refusing everyone's jobs."""
    w = _buggy_world(tmp_path, database_url, BuggyFilter({"poison"}, at_submission=True))
    bad = w.sched.submit(job("poison").name("poison").task(1, gpu=1).build())
    good = w.sched.submit(job("good").name("good").task(1, gpu=1).build())
    w.sched.step()
    with pytest.raises(Rejected) as refused:
        bad.result(0)
    assert refused.value.status == 500
    assert str(refused.value) == (
        "the scheduler failed on this job (a bug, logged: KeyError: \"no role for 'poison'\"); "
        "nothing of it was kept"
    )
    assert w.state(str(good.result(0)["id"]))["state"] == "running"
    assert not w.sched.step_errors.failing


def test_a_time_limit_whose_handling_raises_holds_that_job_and_the_others_stop(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the bug failed every step: no other job's time limit, exit or cycle was
    handled again until a restart."""
    a, b, c = (w.submit(replace(job(n).task(1, cpu=1).build(), time_limit_s=60.0)) for n in "abc")
    bug = {b}
    real = Intents._stop_over_limit

    def stop_over_limit(self: Intents, lj: LiveJob, *args: Any) -> None:
        if lj.id in bug:
            raise KeyError(f"no limit for {lj.id}")
        real(self, lj, *args)

    monkeypatch.setattr(Intents, "_stop_over_limit", stop_over_limit)
    w.clock.t += 61
    w.sched.step()
    assert not w.sched.step_errors.failing
    assert sorted(stop[0] for stop in w.fx.stops) == sorted([a, c])
    assert w.state(b)["state"] == "running"
    (held,) = [e for e in _events(w, b) if e["kind"] == "held"]
    until = w.clock.t + poison.HOLD_S
    assert held["message"] == (
        f"held until {clock(until)}: the scheduler fails on its timers (a bug, logged: "
        f"KeyError: 'no limit for {b}'); the other jobs go on, and it is tried again then"
    )
    metrics = Metrics()
    metrics.watch(w.sched)
    assert "aisched_jobs_held_for_step_errors_total 1.0" in metrics.render().decode().splitlines()
    # Left alone while held (one hold, one log), then tried again: the bug is gone by then.
    w.clock.t += 10
    w.sched.step()
    assert w.sched.stats.held_for_step_errors == 1
    bug.clear()
    w.clock.t = until
    w.sched.step()
    assert (b, 1, "g0-0") in w.fx.stops


def test_a_dependency_recheck_that_raises_holds_that_job_waiting_and_the_others_start(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    prep, x, y = _submit_all(w, _step("prep"), _step("x", "prep"), _step("y", "prep"))
    bug = {x}
    check = w.sched.pipelines.check

    def check_with_a_bug(lj: LiveJob, live: Mapping[str, LiveJob]) -> DependencyCheck:
        if lj.id in bug:
            raise KeyError(f"no dependencies for {lj.id}")
        return check(lj, live)

    monkeypatch.setattr(w.sched.pipelines, "check", check_with_a_bug)
    for key in w.fx.keys(prep):
        w.fx.exit(key, 0)
    w.sched.step()
    assert not w.sched.step_errors.failing
    assert [w.state(i)["state"] for i in (prep, x, y)] == ["succeeded", "pending", "running"]
    until = w.clock.t + poison.HOLD_S
    assert w.state(x)["reason"] == (
        f"held until {clock(until)}: the scheduler fails on checking its dependencies (a bug, "
        f"logged: KeyError: 'no dependencies for {x}'); the other jobs go on, and it is tried "
        "again then"
    )
    # Not started by a cycle while its dependencies are unchecked, though GPUs are free.
    for _ in range(3):
        w.clock.t += 30
        w.sched.step()
    assert w.state(x)["state"] == "pending"
    bug.clear()
    w.clock.t = until
    w.sched.step()
    w.sched.step()
    assert w.state(x)["state"] == "running"


def _step(name: str, *deps: str) -> Job:
    j = job(name).task(gpu=1).build()
    return replace(j, name=name, depends_on=tuple(Dependency(d) for d in deps))


def _submit_all(w: World, *jobs: Job) -> list[str]:
    fut = w.sched.submit_all(tuple((j, "native", ()) for j in jobs))
    w.sched.step()
    return [str(r["id"]) for r in fut.result(0)]


def _events(w: World, job_id: str) -> list[dict[str, Any]]:
    with w.store.read() as tx:
        return list(tx.events_of(job_id))

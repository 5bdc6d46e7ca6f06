"""The loop under a long queue, step by step: estimated starts worked out once per interval and
kept in between, and a submission that could start not held back by the gap a long cycle left.
Decisions are the same either way (the parity tests compare them with the simulator's)."""

from __future__ import annotations

from pathlib import Path

from world import Clock, World

from aisched.core.policy import preset
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.service.loop import LoopConfig, Scheduler
from aisched.store.db import Store
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


def submit(sched: Scheduler, j: Job) -> str:
    fut = sched.submit(j)
    sched.step()
    return str(fut.result(0)["id"])


def state(sched: Scheduler, job_id: str) -> tuple[object, object]:
    with sched.store.read() as tx:
        row = tx.get_job(job_id)
    assert row is not None
    return row["state"], row["reason_code"]


def status(w: World, job_id: str) -> tuple[object, object]:
    row = w.state(job_id)
    return row["reason_code"], row["eta"]


def test_estimated_starts_are_worked_out_once_per_interval_and_kept_between(w: World) -> None:
    assert w.sched.config.eta_interval_s == 5.0
    running = w.submit(job("a").task(gpu=4).estimate(100).not_preemptible().build())
    x = w.submit(job("x").task(gpu=4).estimate(100).build())
    z = w.submit(job("z").task(gpu=4).estimate(100).build())
    # The first cycle (a's) worked out estimates; those of x's and z's own cycles did not: x has
    # its reservation's start, z none yet.
    assert (status(w, x), status(w, z)) == (("reserved", 1100.0), ("wait-resources", None))
    # Five seconds on, the periodic cycle works them out: z starts after x.
    w.clock.t += 5
    w.sched.step()
    assert (status(w, x), status(w, z)) == (("reserved", 1100.0), ("wait-reservation", 1200.0))
    # Two seconds on, a more urgent job goes ahead of both. Its cycle works out no estimates:
    # it takes the reservation (and the start that comes with it); x and z keep their last.
    w.clock.t += 2
    y = w.submit(job("y").task(gpu=4).estimate(100).priority(10).build())
    assert w.state(running)["state"] == "running"
    assert (status(w, y), status(w, x), status(w, z)) == (
        ("reserved", 1100.0),
        ("wait-reservation", 1100.0),
        ("wait-reservation", 1200.0),
    )
    # Five seconds after the last estimates, the next cycle works them out again.
    w.clock.t += 5
    w.sched.step()
    assert (status(w, y), status(w, x), status(w, z)) == (
        ("reserved", 1100.0),
        ("wait-reservation", 1200.0),
        ("wait-reservation", 1300.0),
    )


def a_loop_with_a_long_gap(tmp_path: Path) -> Scheduler:
    """A loop whose cycles are each followed by a gap longer than any test (its cycles are
    taken to cost a billion times what they did), on one node of 4 GPUs."""
    config = LoopConfig(data_dir=tmp_path, cycle_gap_factor=1e9)
    sched = Scheduler(
        Store.sqlite(tmp_path / "state.db"),
        FakeExecutor([fake_node(gpus=4)]),
        preset("default"),
        QueueTree(),
        config,
        clock=Clock(),
    )
    sched.recover()
    return sched


def test_a_submission_that_could_start_does_not_wait_out_the_gap(tmp_path: Path) -> None:
    sched = a_loop_with_a_long_gap(tmp_path)
    blocker = submit(sched, job("b").task(gpu=4).build())
    # No GPU is free: a job that needs one waits for the gap to pass, not seen by any cycle.
    waiting = submit(sched, job("w").task(gpu=1).build())
    assert state(sched, blocker) == ("running", None)
    assert state(sched, waiting) == ("pending", "not-considered")
    # A CPU job fits beside the blocker: its cycle runs now, and sees the waiting job too.
    tiny = submit(sched, job("t").task(cpu=1).build())
    assert (state(sched, tiny), state(sched, waiting)) == (
        ("running", None),
        ("pending", "reserved"),
    )
    # Another job of the shape that cycle left waiting waits for the gap again,
    again = submit(sched, job("w2").task(gpu=1).build())
    assert state(sched, again) == ("pending", "not-considered")
    # as does a CPU job once too few CPUs are free for it.
    big = submit(sched, job("c").task(cpu=15).build())
    assert state(sched, big) == ("pending", "not-considered")
    sched.store.close()

"""The loop under a long queue, step by step: estimated starts worked out once per interval and
kept in between. Decisions are the same either way (the parity tests compare them with the
simulator's)."""

from __future__ import annotations

from world import World

from aisched.testing import job


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

"""Elastic jobs in the control loop: started with what fits, grown into idle capacity (restarted
from their checkpoint) once nothing waits. A real SQLite store, a fake executor and a fake clock
(see test_loop.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_loop import Clock, World, make_scheduler

from aisched.model.job import Job
from aisched.store.db import Store
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


@pytest.fixture
def w(tmp_path: Path) -> World:
    store = Store.sqlite(tmp_path / "state.db")
    fx = FakeExecutor([fake_node(gpus=4)])
    clock = Clock()
    sched = make_scheduler(store, fx, clock, tmp_path)
    sched.recover()
    return World(store, fx, clock, sched, tmp_path)


def elastic(workers: int, min_workers: int) -> Job:
    return replace(job("el").task(workers, gpu=1).min_available(min_workers).build(), elastic=True)


def test_an_elastic_job_grows_into_capacity_freed_later(w: World) -> None:
    other = w.submit(job("other").task(gpu=2).build())
    el = w.submit(elastic(4, 1))
    assert len(w.fx.keys(el)) == 2  # started with what fit
    w.fx.exit(w.fx.keys(other)[0], 0)
    w.sched.step()
    assert w.fx.stops == []  # idle capacity, but it has not run long enough to be restarted
    w.clock.t += 60
    w.sched.step()  # grown: stopped (SIGTERM, so it checkpoints) and requeued
    assert len(w.fx.stops) == 2 and w.state(el)["stopping"] == "requeue"
    w.sched.step()
    w.sched.step()
    row = w.state(el)
    assert (row["state"], row["attempt"], row["failures"]) == ("running", 2, 0)
    assert (
        sorted(t.env["WORLD_SIZE"] for t in w.fx.launched if t.job_id == el)
        == ["2"] * 2 + ["4"] * 4
    )
    assert {t.env["AISCHED_RESTART_COUNT"] for t in w.fx.launched[-4:]} == {"1"}
    assert "growing" in w.events(el)


def test_an_elastic_job_is_not_grown_while_another_job_waits(w: World) -> None:
    other = w.submit(job("other").task(gpu=2).build())
    el = w.submit(elastic(4, 1))
    big = w.submit(job("big").task(gpu=4).priority(-1).build())
    w.fx.exit(w.fx.keys(other)[0], 0)
    w.sched.step()
    assert len(w.fx.keys(el)) == 2 and w.state(big)["state"] == "pending"
    w.clock.t += 120
    w.sched.step()
    assert w.fx.stops == []  # two GPUs idle, but the capacity is owed to the waiting job


def test_elastic_needs_a_smaller_minimum() -> None:
    from aisched.spec.errors import SpecError
    from aisched.spec.job import parse_job_text

    with pytest.raises(SpecError) as e:
        parse_job_text("command: x\nreplicas: 2\nelastic: true\n", "j.yaml")
    assert e.value.problems == (
        "j.yaml: elastic: needs min_available below the job's 2 tasks: the fewest it runs with",
    )

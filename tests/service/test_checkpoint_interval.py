"""The checkpoint interval the core chooses victims by: the job's own, else the loop's default
(none unless configured), by the lifecycle's one rule (`lifecycle.work.checkpoint_interval_s`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from world import Clock, World

from aisched.core.policy import preset
from aisched.model.queue import QueueTree
from aisched.service.loop import LoopConfig, Scheduler
from aisched.store.db import Store
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


def interval_seen(sched: Scheduler, job_id: str) -> float | None:
    return sched.held.views[job_id].checkpoint_interval_s


def submit(sched: Scheduler, name: str, interval_s: float | None = None) -> str:
    fut = sched.submit(replace(job(name).task(gpu=1).build(), checkpoint_interval_s=interval_s))
    sched.step()
    return str(fut.result(0)["id"])


def test_a_job_that_names_no_interval_is_not_taken_to_checkpoint(w: World) -> None:
    plain, own = submit(w.sched, "plain"), submit(w.sched, "own", 120.0)
    assert (interval_seen(w.sched, plain), interval_seen(w.sched, own)) == (None, 120.0)


def test_the_loops_default_applies_to_jobs_that_name_none(tmp_path: Path) -> None:
    config = LoopConfig(data_dir=tmp_path, cycle_gap_factor=0, checkpoint_interval_s=600.0)
    sched = Scheduler(
        Store.sqlite(tmp_path / "state.db"),
        FakeExecutor([fake_node(gpus=4)]),
        preset("default"),
        QueueTree(),
        config,
        clock=Clock(),
    )
    sched.recover()
    plain, own = submit(sched, "plain"), submit(sched, "own", 120.0)
    assert (interval_seen(sched, plain), interval_seen(sched, own)) == (600.0, 120.0)

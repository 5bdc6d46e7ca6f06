"""The control loop's test world: a real store (SQLite or PostgreSQL), the fake executor and
a fake clock, so each test drives the loop exactly (submit, step, end a task, step) and reads
the whole outcome. The `w` and `pw` fixtures (conftest.py) make one, on each store."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from aisched.core.policy import preset
from aisched.model.job import Dependency, DependencyCondition, Job, RestartPolicy
from aisched.model.queue import QueueTree
from aisched.predict.runtime import RuntimePredictor
from aisched.service.loop import LoopConfig, Scheduler
from aisched.store.db import Store
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class World:
    store: Store
    fx: FakeExecutor
    clock: Clock
    sched: Scheduler
    home: Path
    predicting: bool = False  # the loop has a runtime predictor
    queues: QueueTree | None = None  # None: one queue

    def submit(self, j: Job) -> str:
        fut = self.sched.submit(j)
        self.sched.step()
        return str(fut.result(0)["id"])

    def state(self, job_id: str) -> dict[str, object]:
        with self.store.read() as tx:
            row = tx.get_job(job_id)
        assert row is not None
        return row

    def events(self, job_id: str) -> list[str]:
        with self.store.read() as tx:
            return [e["kind"] for e in tx.events_of(job_id)]

    def restart(self) -> Scheduler:
        """A new loop over the same store and executor: the scheduler process restarted."""
        self.sched = make_scheduler(
            self.store, self.fx, self.clock, self.home, self.predicting, self.queues
        )
        self.sched.recover()
        return self.sched


def make_scheduler(
    store: Store,
    fx: FakeExecutor,
    clock: Clock,
    home: Path,
    predicting: bool = False,
    queues: QueueTree | None = None,
) -> Scheduler:
    return Scheduler(
        store,
        fx,
        preset("default"),
        queues or QueueTree(),
        LoopConfig(data_dir=home, cycle_interval_s=5.0, max_backoff_s=60.0, cycle_gap_factor=0),
        clock=clock,
        predictor=RuntimePredictor() if predicting else None,
    )


def new_world(
    home: Path,
    fx: FakeExecutor | None = None,
    *,
    predicting: bool = False,
    database_url: str | None = None,
    queues: QueueTree | None = None,
) -> World:
    """A recovered loop over a fresh store (SQLite in `home`, or the PostgreSQL database
    `database_url`; one node of 4 GPUs unless `fx` says; one queue unless `queues` says)."""
    store = Store.sqlite(home / "state.db") if database_url is None else Store(database_url)
    fx = fx if fx is not None else FakeExecutor([fake_node(gpus=4)])
    clock = Clock()
    sched = make_scheduler(store, fx, clock, home, predicting, queues)
    sched.recover()
    return World(store, fx, clock, sched, home, predicting, queues)


def pipeline_job(
    name: str,
    *deps: str,
    gpus: int = 1,
    user: str = "default",
    condition: DependencyCondition = DependencyCondition.SUCCESS,
) -> Job:
    """A one-task job of `gpus` GPUs named `name`, never restarted, depending on the jobs
    named `deps` (in its file) under `condition`."""
    j = job(name).task(gpu=gpus).build()
    return replace(
        j,
        name=name,
        user=user,
        restart_policy=RestartPolicy.NEVER,
        depends_on=tuple(Dependency(d, condition) for d in deps),
    )


def submit_all(w: World, *jobs: Job) -> list[str]:
    """Submit `jobs` as one file (a pipeline) and step once; their ids, in order."""
    fut = w.sched.submit_all(tuple((j, "native", ()) for j in jobs))
    w.sched.step()
    return [str(r["id"]) for r in fut.result(0)]

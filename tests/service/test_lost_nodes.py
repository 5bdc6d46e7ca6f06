"""A node that leaves the cluster for a while (a raylet restart, a network blip): a waiting job
that fits only with it waits `lost_node_grace_s` for it to come back, rather than failing at once
as never fitting; past the grace it fails as before. A real store and loop, a fake executor whose
node list changes (as a cluster executor's does)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from world import World, new_world

from aisched.model.job import Dependency, Job
from aisched.service.loop import Rejected
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node

A, B = fake_node("a", gpus=2), fake_node("b", gpus=2)


@pytest.fixture
def w(tmp_path: Path, database_url: str | None) -> Iterator[World]:
    world = new_world(tmp_path, FakeExecutor([A, B]), database_url=database_url)
    yield world
    world.store.close()


def gang() -> Job:
    return job("gang").task(2, gpu=2).build()


def test_a_job_that_fits_only_with_a_node_that_left_waits_for_it(w: World) -> None:
    w.fx.node_list = [A]
    w.sched.step()
    jid = w.submit(gang())  # taken: it fits the cluster with b back
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["reason_code"]) == ("pending", "wait-resources")
    assert "does not fit this cluster" in str(row["reason"])
    assert "waits up to 600 s for b, which left, to come back" in str(row["reason"])
    w.clock.t += 300
    w.fx.node_list = [A, B]
    w.sched.step()
    w.sched.step()
    assert w.state(jid)["state"] == "running"
    assert sorted(k[2] for k in w.fx.keys(jid)) == ["g0-0", "g0-1"]


def test_past_the_grace_it_fails_as_never_fitting(w: World) -> None:
    w.fx.node_list = [A]
    w.sched.step()
    jid = w.submit(gang())
    w.clock.t += 601
    w.sched.step()
    w.clock.t += 10  # the next cycle
    w.sched.step()
    row = w.state(jid)
    assert row["state"] == "failed"
    assert str(row["message"]).startswith("can never fit this cluster")


def test_one_that_waited_for_it_fails_past_the_grace_naming_it(w: World) -> None:
    w.fx.node_list = [A]
    w.sched.step()
    jid = w.submit(gang())
    w.sched.step()
    assert "waits up to 600 s for b" in str(w.state(jid)["reason"])
    w.clock.t += 601
    w.sched.step()
    w.clock.t += 10  # the next cycle
    w.sched.step()
    row = w.state(jid)
    assert row["state"] == "failed"
    assert str(row["message"]).startswith("can never fit this cluster")
    assert str(row["message"]).endswith(
        "; waited 600 s (lost_node_grace) for b, which left, to come back"
    )


def _waits_for_b(w: World, jid: str) -> bool:
    row = w.state(jid)
    return row["state"] == "pending" and "for b, which left, to come back" in str(row["reason"])


def test_a_restart_remembers_a_node_that_left(w: World) -> None:
    """The nodes that left were kept in memory only: after a restart of the scheduler a job
    waiting for one failed at once as never fitting, its grace forgotten."""
    w.fx.node_list = [A]
    w.sched.step()
    jid = w.submit(gang())
    w.sched.step()
    assert _waits_for_b(w, jid)
    w.clock.t += 100
    w.restart()
    for _ in range(2):
        w.clock.t += 10
        w.sched.step()
    assert _waits_for_b(w, jid)
    w.fx.node_list = [A, B]
    w.sched.step()
    w.sched.step()
    assert w.state(jid)["state"] == "running"


def test_a_node_gone_while_the_scheduler_was_down_is_waited_for(w: World) -> None:
    """A node offered before a restart and not after it (it left meanwhile, or has not
    rejoined yet) counts as left from the restart on."""
    first = w.submit(job("first").task(1, gpu=1).build())
    jid = w.submit(replace(gang(), depends_on=(Dependency(first),)))
    w.sched.step()
    w.fx.node_list = [A]
    w.restart()
    w.fx.exit(w.fx.keys(first)[0], 0)
    for _ in range(3):
        w.clock.t += 10
        w.sched.step()
    assert _waits_for_b(w, jid), w.state(jid)


# A node offered again smaller after a restart (the service restarted with fewer --gpus): the
# jobs admitted before it that fit only its former size wait for it as for a node that left.
BIG, SMALL = fake_node("a", gpus=4), fake_node("a", gpus=2)


@pytest.fixture
def one(tmp_path: Path, database_url: str | None) -> Iterator[World]:
    world = new_world(tmp_path, FakeExecutor([BIG]), database_url=database_url)
    yield world
    world.store.close()


def _pending_behind_a_holder(w: World) -> str:
    """A 4-GPU job kept waiting by a 1-GPU one that holds a GPU of the 4."""
    w.submit(job("holder").task(1, gpu=1).build())
    w.sched.step()
    jid = w.submit(job("wide").task(1, gpu=4).build())
    w.sched.step()
    assert w.state(jid)["state"] == "pending"
    return jid


SHRANK = (
    "does not fit this cluster: room for 0 of 1 'g0' tasks (4 GPU, 1 CPU, 1 GiB memory "
    "each) now; waits up to 600 s for a, which has 2 GPU, 32 GiB GPU memory, 16 CPU, 64 GiB "
    "memory since the restart (4 GPU, 64 GiB GPU memory, 16 CPU, 64 GiB memory before), to be "
    "as large again"
)


def test_a_restart_on_a_smaller_node_keeps_a_job_admitted_before_waiting(one: World) -> None:
    """It failed at once as never fitting: a job the service had taken was lost because the
    operator restarted it with fewer GPUs."""
    w = one
    jid = _pending_behind_a_holder(w)
    w.fx.node_list = [SMALL]
    w.restart()
    for _ in range(2):
        w.clock.t += 10
        w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["reason_code"], row["reason"]) == (
        "pending",
        "wait-resources",
        SHRANK,
    )
    # Restarted as large as before within the grace, it runs once the holder has ended.
    w.fx.node_list = [BIG]
    w.restart()
    w.clock.t += 10
    w.sched.step()
    w.fx.exit(w.fx.keys("1")[0], 0)
    for _ in range(2):
        w.clock.t += 10
        w.sched.step()
    assert w.state(jid)["state"] == "running"


def test_past_the_grace_it_fails_naming_the_node_that_shrank(one: World) -> None:
    w = one
    jid = _pending_behind_a_holder(w)
    w.fx.node_list = [SMALL]
    w.restart()
    w.clock.t += 300
    w.sched.step()
    w.clock.t += 300
    w.restart()  # a second restart keeps the time it shrank at
    w.sched.step()
    assert w.state(jid)["reason"] == SHRANK
    w.clock.t += 10
    w.sched.step()
    row = w.state(jid)
    assert (row["state"], row["message"]) == (
        "failed",
        "can never fit this cluster: room for 0 of 1 'g0' tasks (4 GPU, 1 CPU, 1 GiB memory "
        "each); waited 600 s (lost_node_grace) for a, smaller since the restart, to be as "
        "large again",
    )


def test_a_new_job_too_large_for_the_shrunk_node_is_still_refused(one: World) -> None:
    w = one
    _pending_behind_a_holder(w)
    w.fx.node_list = [SMALL]
    w.restart()
    w.sched.step()
    fut = w.sched.submit(job("late").task(1, gpu=4).build())
    w.sched.step()
    with pytest.raises(Rejected, match="can never fit"):
        fut.result(0)

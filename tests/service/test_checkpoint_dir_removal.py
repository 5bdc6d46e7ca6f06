"""A checkpoint directory the service made (`DATA_DIR/checkpoints/JOB`, at launch) is removed
once its job has ended for good, if it is empty; one that holds anything is kept, and so is
every directory while its job may run again. Links are never followed. Before: every job that
ran left an empty directory behind, for ever."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from world import World

from aisched.model.job import RestartPolicy
from aisched.testing import job


def _end(w: World, job_id: str, code: int = 0) -> None:
    for key in w.fx.keys(job_id):
        w.fx.exit(key, code)
    w.sched.step()


def test_an_empty_checkpoint_dir_goes_when_its_job_ends_and_one_with_files_stays(
    w: World,
) -> None:
    empty = w.submit(job("empty").task(gpu=1).build())
    kept = w.submit(job("kept").task(gpu=1).build())
    failed = w.submit(replace(job("f").task(gpu=1).build(), restart_policy=RestartPolicy.NEVER))
    ckpt = w.home / "checkpoints"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([empty, kept, failed])
    (ckpt / kept / "weights").write_text("saved\n")
    for job_id in (empty, kept):
        _end(w, job_id)
    _end(w, failed, code=1)
    assert [w.state(j)["state"] for j in (empty, kept, failed)] == [
        "succeeded",
        "succeeded",
        "failed",
    ]
    assert [p.name for p in ckpt.iterdir()] == [kept]
    assert (ckpt / kept / "weights").read_text() == "saved\n"


def test_a_requeued_job_keeps_its_checkpoint_dir_until_it_ends(w: World) -> None:
    low = w.submit(job("low").task(gpu=4).priority(0).build())
    ckpt = w.home / "checkpoints" / low
    assert ckpt.is_dir()
    (low_key,) = w.fx.keys(low)
    high = w.submit(job("high").task(gpu=4).priority(10).build())
    assert w.fx.stops == [low_key]
    w.sched.step()  # stopped for the preemptor: requeued, to restart from its checkpoints
    assert (w.state(low)["state"], ckpt.is_dir()) == ("pending", True)
    _end(w, high)
    assert w.state(low)["state"] == "running"
    _end(w, low)
    assert not ckpt.exists()


def test_a_job_cancelled_before_it_ran_has_no_dir_to_remove(w: World) -> None:
    w.submit(job("big").task(gpu=4).build())
    waiting = w.submit(job("waiting").task(gpu=4).build())
    fut = w.sched.cancel(waiting)
    w.sched.step()
    fut.result(0)
    assert w.state(waiting)["state"] == "cancelled"
    assert not (w.home / "checkpoints" / waiting).exists()


def test_no_link_is_followed(w: World) -> None:
    """A link in the job directory's place, or in the checkpoints folder's, is left as it is,
    and the empty directory it points to too."""
    elsewhere = w.home.parent / f"{w.home.name}-elsewhere"
    first = w.submit(job("a").task(gpu=1).build())
    second = w.submit(job("b").task(gpu=1).build())
    ckpt = w.home / "checkpoints"
    (elsewhere / first).mkdir(parents=True)
    (ckpt / first).rmdir()
    (ckpt / first).symlink_to(elsewhere / first)
    _end(w, first)
    assert (ckpt / first).is_symlink() and (elsewhere / first).is_dir()
    # The whole checkpoints folder swapped for a link to a folder with the job's empty dir.
    (elsewhere / second).mkdir()
    ckpt.rename(w.home / "checkpoints.moved")
    ckpt.symlink_to(elsewhere)
    _end(w, second)
    assert (elsewhere / second).is_dir()
    assert Path(w.home / "checkpoints.moved" / second).is_dir()

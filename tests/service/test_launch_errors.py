"""Launching a bound job: its tasks are started from the task groups their bindings name, and
a launch that cannot even be put together (a binding naming a group the job lacks, no free
port for its gang), or that the executor fails with an unexpected error, ends the attempt like
a task that could not start: its resources come back and its restart policy decides, with the
reason in its events, rather than leaving it `launching` for ever (and its task rows holding
their GPUs and CPUs)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from world import World

from aisched.core.decisions import Bind
from aisched.core.snapshot import FreeState
from aisched.model.job import RestartPolicy
from aisched.service import intents, launches
from aisched.testing import job


def _all_free(w: World) -> bool:
    return w.sched.free.equals(FreeState.empty(w.sched.arrays))


def test_jobs_of_one_shape_start_each_from_its_own_task_groups(w: World) -> None:
    """The second job is placed on the free state the first was placed on (the core reads
    that placement back): its tasks still carry its own group names and commands."""
    first = w.submit(job("first").task(2, gpu=1, name="trainer").build())
    for key in w.fx.keys(first):
        w.fx.exit(key, 0)
    w.sched.step()
    assert w.state(first)["state"] == "succeeded"
    # Past the interval of estimated starts: this cycle, like the first, works them out, so
    # it runs the same policy (placements are kept per policy).
    w.clock.t += w.sched.config.eta_interval_s
    second = w.submit(job("second").task(2, gpu=1, name="worker").build())
    assert w.state(second)["state"] == "running"
    assert sorted((t.task, t.gpus) for t in w.fx.launched if t.job_id == second) == [
        ("worker-0", (0,)),
        ("worker-1", (1,)),
    ]
    with w.store.read() as tx:
        assert [(t["name"], t["state"]) for t in tx.tasks_of(second)] == [
            ("worker-0", "running"),
            ("worker-1", "running"),
        ]


def _bind_to_a_group_it_lacks(w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    real = intents.run_cycle

    def cycle(*args: object, **kw: object) -> object:
        result = real(*args, **kw)  # type: ignore[arg-type]
        decisions = [
            replace(d, tasks=tuple(replace(t, group="nope") for t in d.tasks))
            if isinstance(d, Bind)
            else d
            for d in result.decisions
        ]
        return replace(result, decisions=decisions)

    monkeypatch.setattr(intents, "run_cycle", cycle)


def _no_free_port(w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(host: str) -> int:
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(launches, "free_port", refuse)


def _executor_bug(w: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def launch(req: object) -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(w.fx, "launch", launch)


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (_bind_to_a_group_it_lacks, "binds task nope-0 to task group 'nope', which it lacks"),
        (_no_free_port, "Address already in use"),
        (_executor_bug, "RuntimeError('boom')"),
    ],
)
def test_a_job_whose_launch_breaks_fails_its_attempt_and_frees_its_resources(
    w: World, monkeypatch: pytest.MonkeyPatch, fault: object, said: str
) -> None:
    fault(w, monkeypatch)  # type: ignore[operator]
    retried = w.submit(job("retried").task(2, gpu=1).build())
    once = w.submit(replace(job("once").task(gpu=1).build(), restart_policy=RestartPolicy.NEVER))
    w.sched.step()
    assert w.fx.launched == []
    assert _all_free(w)  # nothing held by either
    row = w.state(retried)
    assert (row["state"], row["failures"]) == ("pending", 1)  # retried after its backoff
    assert row["not_before"] is not None
    row = w.state(once)
    assert row["state"] == "failed"
    assert said in str(row["message"])
    for jid in (retried, once):
        with w.store.read() as tx:
            assert {t["state"] for t in tx.tasks_of(jid)} == {"exited"}
            events = tx.events_of(jid)
        # Placed, never started: no task of it was made.
        assert "started" not in [e["kind"] for e in events]
        assert [e["kind"] for e in events][:3] == ["submitted", "placed", "task-exited"]
        assert "could not start" in events[2]["message"] and said in events[2]["message"]


def test_a_bug_applying_one_decision_strands_none_of_the_launches_before_it(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle binds two jobs and applying the second raises (a bug): the first, applied
    already (running, its tasks launching, in the batch the loop retries), is launched with
    that batch instead of being left launching for ever."""
    real = w.sched._apply_bind
    applied: list[str] = []

    def apply(d: Bind, batch: object, now: float) -> object:
        applied.append(d.job_id)
        if len(applied) == 2:
            raise RuntimeError("a bug")
        return real(d, batch, now)  # type: ignore[arg-type]

    monkeypatch.setattr(w.sched, "_apply_bind", apply)
    futures = [w.sched.submit(job(name).task(gpu=1).build()) for name in ("a", "b")]
    with pytest.raises(RuntimeError, match="a bug"):
        w.sched.step()
    monkeypatch.undo()
    w.sched.step()  # as the loop does after a failed step: the batch it kept is stored
    ids = [str(f.result(0)["id"]) for f in futures]
    assert [t.job_id for t in w.fx.launched] == [ids[0]]
    w.clock.t += w.sched.config.cycle_interval_s
    w.sched.step()  # the next cycle binds the second
    assert sorted({t.job_id for t in w.fx.launched}) == sorted(ids)
    for jid in ids:
        with w.store.read() as tx:
            assert [t["state"] for t in tx.tasks_of(jid)] == ["running"]

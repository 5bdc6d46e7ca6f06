"""The cycle's work-saving paths decide exactly what the plain walk decides: allocate's walk by
shapes over the kept order (`core.actions.shape_walk`, one queue or several), with its
statuses stated by rule, preempt's skip of settled shapes, and the simulator's skipped cycles
(`_settled`). Each replay is run twice, once with those paths and once with
them turned off, and the logs and job records must be equal; the counters show that the
paths did run."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import aisched.sim.engine as engine_mod
from aisched.core.actions import shape_walk
from aisched.core.actions.allocate import Allocate
from aisched.core.cycle import CycleResult
from aisched.core.pending import PendingQueue
from aisched.core.policy import Policy, preset
from aisched.core.session import Session
from aisched.core.snapshot import PendingJob, Snapshot
from aisched.model.queue import DEFAULT_QUEUE, Queue, QueueTree
from aisched.model.resources import Resources
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.traces import synthetic_cluster, synthetic_trace

CONFIG = SimConfig(validate=True, checkpoint_interval_s=600.0)


def replay(policy: Policy, seed: int, queues: int) -> SimResult:
    # Busy enough that a queue builds up on one 8-GPU node.
    trace = synthetic_trace(250, seed=seed, arrival_rate_per_h=90.0, num_queues=queues)
    return simulate(trace, synthetic_cluster(1), policy, CONFIG)


@pytest.mark.parametrize("name", ["fifo", "fifo-strict", "las", "sjf", "srtf-oracle"])
@pytest.mark.parametrize(("seed", "queues"), [(1, 1), (2, 1), (3, 2), (4, 3), (5, 5)])
def test_the_saving_paths_decide_as_the_plain_walk(
    name: str, seed: int, queues: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = {"shape_walk": 0}
    real_applies = shape_walk.applies

    def counted(session: object) -> bool:
        ok = real_applies(session)  # type: ignore[arg-type]
        used["shape_walk"] += ok
        return ok

    monkeypatch.setattr(shape_walk, "applies", counted)
    fast = replay(preset(name), seed, queues)
    monkeypatch.setattr(shape_walk, "applies", lambda session: False)
    monkeypatch.setattr(engine_mod, "may_settle", lambda policy: False)
    plain = replay(preset(name), seed, queues)
    assert fast.log == plain.log
    assert fast.jobs == plain.jobs
    assert used["shape_walk"] > 0
    assert fast.cycles < plain.cycles  # each of these policies may skip cycles


@pytest.mark.parametrize("name", ["fifo", "las", "srtf-oracle"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_skipped_cycles_with_a_governed_queue_decide_as_the_plain_walk(
    name: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's limit reads usage, which a job's end or a preemption moves while the free
    state may end up within what the last cycle left: a job its limit held may start then,
    so those cycles must run."""
    trace = synthetic_trace(250, seed=seed, arrival_rate_per_h=90.0, num_queues=2)
    limited = Queue("q0", limit=Resources(gpu=3))
    tree = QueueTree((limited, Queue("q1"), Queue(DEFAULT_QUEUE)))

    def run() -> SimResult:
        return simulate(trace, synthetic_cluster(1), preset(name), CONFIG, queues=tree)

    fast = run()
    monkeypatch.setattr(engine_mod, "may_settle", lambda policy: False)
    plain = run()
    assert fast.log == plain.log
    assert fast.jobs == plain.jobs
    assert fast.cycles < plain.cycles


@pytest.mark.parametrize("name", ["fifo", "fifo-strict", "las"])
@pytest.mark.parametrize(("seed", "queues"), [(2, 1), (3, 2), (4, 3), (5, 5)])
def test_each_cycle_of_the_shape_walk_is_the_general_walks(
    name: str, seed: int, queues: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cycle by cycle, on the same inputs: the same decisions, the same status for every job
    (stated by rule or one by one), and the same blocked list, in the same order, where
    actions after allocate read it."""
    blocked: list[list[str]] = []
    real_execute = Allocate.execute

    def recording(self: Allocate, session: Session) -> None:
        real_execute(self, session)
        blocked.append([pj.id for pj in session.blocked])

    monkeypatch.setattr(Allocate, "execute", recording)
    real_cycle = engine_mod.run_cycle
    walked = {"cycles": 0}

    def twice(
        snapshot: Snapshot,
        pending: Sequence[PendingJob] | PendingQueue,
        policy: Policy,
        now: float,
        **kw: bool,
    ) -> CycleResult:
        jobs = tuple(pending)
        fast = real_cycle(snapshot, pending, policy, now, **kw)
        fast_blocked = blocked[-1]
        with monkeypatch.context() as m:
            m.setattr(shape_walk, "applies", lambda session: False)
            plain = real_cycle(snapshot, jobs, policy, now, **kw)
        assert fast.decisions == plain.decisions
        assert dict(fast.diagnostics) == dict(plain.diagnostics)
        if not policy.allocate_last:  # else nothing reads it, and the walk leaves it empty
            assert fast_blocked == blocked[-1]
        walked["cycles"] += 1
        return fast

    monkeypatch.setattr(engine_mod, "run_cycle", twice)
    replay(preset(name), seed, queues)
    assert walked["cycles"] > 50


@pytest.mark.parametrize("name", ["las", "srtf-oracle"])
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_cycles_skipped_when_what_came_back_fits_nobody_decide_as_the_plain_walk(
    name: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a job's end the free state is no longer within what the last cycle left, but
    when no shape waiting may fit it (`placement.may_fit`) the cycle still places nobody: on
    several nodes, with gangs that span them, those cycles are skipped too (under a policy
    that preempts by rank; one that only places runs a cycle after every job's end)."""
    trace = synthetic_trace(300, seed=seed, arrival_rate_per_h=120.0, num_queues=2)
    skipped = {"refreshed": 0}
    real = engine_mod._Engine._nothing_fits

    def counted(self: engine_mod._Engine, settled: frozenset[object]) -> bool:
        ok = real(self, settled)  # type: ignore[arg-type]
        skipped["refreshed"] += ok
        return ok

    def run() -> SimResult:
        return simulate(trace, synthetic_cluster(3, gpus_per_node=4), preset(name), CONFIG)

    monkeypatch.setattr(engine_mod._Engine, "_nothing_fits", counted)
    fast = run()
    monkeypatch.setattr(engine_mod, "may_settle", lambda policy: False)
    plain = run()
    assert fast.log == plain.log
    assert fast.jobs == plain.jobs
    assert skipped["refreshed"] > 0

"""The cycle's work-saving paths decide exactly what the plain walk decides: allocate's bulk
in-order path (`core.actions.in_order`), preempt's skip of settled shapes, and the simulator's
skipped cycles (`_settled`). Each replay is run twice, once with those paths and once with
them turned off, and the logs and job records must be equal; the counters show that the
paths did run."""

from __future__ import annotations

import pytest

import aisched.sim.engine as engine_mod
from aisched.core.actions import in_order
from aisched.core.policy import Policy, preset
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.traces import synthetic_cluster, synthetic_trace

CONFIG = SimConfig(validate=True, checkpoint_interval_s=600.0)


def replay(policy: Policy, seed: int, queues: int) -> SimResult:
    # Busy enough that a queue builds up on one 8-GPU node.
    trace = synthetic_trace(250, seed=seed, arrival_rate_per_h=90.0, num_queues=queues)
    return simulate(trace, synthetic_cluster(1), policy, CONFIG)


@pytest.mark.parametrize("name", ["fifo", "fifo-strict", "las", "sjf"])
@pytest.mark.parametrize(("seed", "queues"), [(1, 1), (2, 1), (3, 2)])
def test_the_saving_paths_decide_as_the_plain_walk(
    name: str, seed: int, queues: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = {"in_order": 0}
    real_applies = in_order.applies

    def counted(session: object) -> bool:
        ok = real_applies(session)  # type: ignore[arg-type]
        used["in_order"] += ok
        return ok

    monkeypatch.setattr(in_order, "applies", counted)
    fast = replay(preset(name), seed, queues)
    monkeypatch.setattr(in_order, "applies", lambda session: False)
    monkeypatch.setattr(engine_mod, "only_places", lambda policy: False)
    plain = replay(preset(name), seed, queues)
    assert fast.log == plain.log
    assert fast.jobs == plain.jobs
    assert used["in_order"] > 0
    if name in ("fifo", "fifo-strict", "sjf"):  # policies that only place skip cycles
        assert fast.cycles < plain.cycles
    else:
        assert fast.cycles == plain.cycles

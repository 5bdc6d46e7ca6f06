"""Which policies read runtime estimates: those that do not decide the same whatever the
estimates are, so `--estimator auto` can skip training for them; those that do, differ."""

from __future__ import annotations

import pytest

from aisched.core.estimate_use import reads_estimates
from aisched.core.policy import PRESETS, build_policy, preset, with_eta
from aisched.sim.engine import simulate
from aisched.sim.estimators import Oracle, OwnEstimate
from aisched.sim.traces import one_queue, synthetic_trace
from aisched.testing import cluster, node

BLIND = {
    "fifo",
    "fifo-strict",
    "priority",
    "drf",
    "las",
    "fgd",
    "bestfit",
    "worstfit",
    "dotprod",
    "random",
}


def test_which_presets_read_estimates() -> None:
    blind = {name for name in PRESETS if not reads_estimates(preset(name))}
    assert blind == BLIND


def test_eta_starving_promotion_and_the_backlog_bar_read_estimates() -> None:
    assert reads_estimates(with_eta(preset("fifo")))
    starving = {"actions": [{"name": "enqueue", "starving_after_s": 60.0}, "allocate"]}
    assert reads_estimates(build_policy(starving))
    backlog = {"actions": [{"name": "enqueue", "due_after_backlog": 1.0}, "allocate"]}
    assert reads_estimates(build_policy(backlog))
    waits = {"actions": [{"name": "enqueue", "due_after_median_waits": 2.0}, "allocate"]}
    assert not reads_estimates(build_policy(waits))
    assert not reads_estimates(build_policy({"actions": ["enqueue", "allocate"]}))


def _replay(policy: str, exact: bool) -> object:
    trace = one_queue(synthetic_trace(250, seed=7, arrival_rate_per_h=240.0))
    c = cluster(node("n1").gpus(8).rack("r0"), node("n2").gpus(8).rack("r1"))
    estimator = Oracle() if exact else OwnEstimate()
    return simulate(trace, c, preset(policy), estimator=estimator).log


@pytest.mark.parametrize("policy", sorted(BLIND))
def test_a_blind_policy_decides_the_same_whatever_the_estimates(policy: str) -> None:
    assert _replay(policy, exact=True) == _replay(policy, exact=False)


@pytest.mark.parametrize("policy", ["qssf", "fifo-backfill"])
def test_a_policy_that_reads_estimates_decides_differently(policy: str) -> None:
    """The same trace is not trivial: for these the estimates change the decisions."""
    assert _replay(policy, exact=True) != _replay(policy, exact=False)

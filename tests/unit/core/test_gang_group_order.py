"""A gang's task groups are placed those needing GPUs first. Placing is greedy, group by
group: with a CPU-only group first (a parameter server), a policy that spreads work put it on
the GPU node, whose CPUs its GPU worker then lacked, and the gang waited on a cluster where it
fits (the CPU-only task on the node without GPUs)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind
from aisched.core.policy import PRESETS, preset
from aisched.core.snapshot import snapshot_of
from aisched.testing import cluster, job, node, pending

# The GPU node has CPUs for one of the two tasks only; the CPU node has no GPU.
CLUSTER = cluster(
    node("gpu").gpus(4).cpus(1.5).mem_gib(64),
    node("cpu").gpus(0).cpus(3).mem_gib(64),
)
PS_FIRST = job("ps-first").task(1, cpu=1, name="ps").task(1, gpu=1, cpu=1, name="worker")


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_a_gang_whose_cpu_only_group_comes_first_is_placed_where_it_fits(policy: str) -> None:
    result = run_cycle(snapshot_of(CLUSTER, ()), pending(PS_FIRST), preset(policy), 0.0)
    binds = [d for d in result.decisions if isinstance(d, Bind)]
    assert len(binds) == 1, result.diagnostics["ps-first"].reason
    # Where each task went, in the job's order of groups.
    assert [(t.group, t.node) for t in binds[0].tasks] == [("ps", "cpu"), ("worker", "gpu")]


def test_an_elastic_gang_keeps_its_own_order_of_groups() -> None:
    """Its tasks past the minimum are left out from its first groups that lack room, as they
    come: with only the GPU worker's room, the minimum (1) is the ps alone."""
    elastic = (
        job("elastic").task(1, cpu=1, name="ps").task(1, gpu=1, cpu=1, name="worker")
    ).build()
    elastic = replace(elastic, elastic=True, min_available=1)
    small = cluster(node("gpu").gpus(1).cpus(1).mem_gib(64))
    result = run_cycle(snapshot_of(small, ()), pending(elastic), preset("default"), 0.0)
    binds = [d for d in result.decisions if isinstance(d, Bind)]
    assert [(t.group, t.node) for b in binds for t in b.tasks] == [("ps", "gpu")]

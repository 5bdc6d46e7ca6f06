"""The combined placement score with its shortcuts (scores that say they are uniform for a job
are not computed; node capacities worked out once; no penalty subtracted for a GPU task) gives
exactly, float for float, what computing every score as before gave."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aisched.core.framework import Score, WeightedScore, combined_score
from aisched.core.plugins.score import CPU_ONLY_ON_GPU_NODE_PENALTY, GPU_WEIGHT
from aisched.core.policy import Policy, build_policy, preset
from aisched.core.session import Session
from aisched.core.snapshot import FloatArray, IntArray, snapshot_of
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE, Resources
from aisched.testing import cluster, job, node

POLICIES = {
    "fifo": preset("fifo"),
    "hetero": preset("hetero"),
    "spread": build_policy(
        {
            "actions": ["enqueue", "allocate"],
            "order": ["fifo"],
            "score": ["spread", "topology", {"name": "gpu-preference", "weight": 0.5}],
        }
    ),
}


def utilisation_before(session: Session, request: Resources, nodes: IntArray) -> FloatArray:
    """`utilisation_after` as it was, capacities taken per call."""
    a, f = session.arrays, session.free
    cap_cpu = np.maximum(a.cap_cpu[nodes], 1)
    cap_mem = np.maximum(a.cap_mem[nodes], 1)
    total = (cap_cpu - f.cpu[nodes] + request.milli_cpu) / cap_cpu
    total = total + (cap_mem - f.mem[nodes] + request.mem_mib) / cap_mem
    weight = 2.0
    if request.gpu or request.gpu_milli:
        ngpu = np.maximum(a.num_gpus[nodes], 1)
        used = ngpu * GPU_MILLI_WHOLE - f.gpu_total[nodes]
        add = request.gpu * GPU_MILLI_WHOLE + request.gpu_milli
        total = total + GPU_WEIGHT * (used + add) / (ngpu * GPU_MILLI_WHOLE)
        weight += GPU_WEIGHT
    return np.asarray(total / weight, dtype=np.float64)


class ComputedAsBefore:
    """A policy score without its shortcuts: no `uniform` (so it is computed for every job),
    binpack and spread by the formula as it was, their penalty array subtracted always."""

    def __init__(self, plugin: Score) -> None:
        self.plugin, self.name = plugin, plugin.name

    def score(self, session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
        if self.name not in ("binpack", "spread"):
            return self.plugin.score(session, job, request, nodes)
        util = utilisation_before(session, request, nodes)
        if request.gpu or request.gpu_milli:
            penalty = np.zeros(len(nodes), dtype=np.float64)
        else:
            has_gpu = session.arrays.num_gpus[nodes] > 0
            penalty = np.where(has_gpu, CPU_ONLY_ON_GPU_NODE_PENALTY, 0.0)
        return np.asarray((util if self.name == "binpack" else -util) - penalty)


def combined_before(session: Session, job: Job, request: Resources, nodes: IntArray) -> FloatArray:
    """Every score computed, combined by the framework as the policy's own are."""
    plain = [WeightedScore(ComputedAsBefore(ws.plugin), ws.weight) for ws in session.policy.scores]
    return combined_score(plain, session, job, request, nodes)


@settings(max_examples=200, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(0, 8), st.sampled_from(["A100", "H100"]), st.integers(8, 96)),
        min_size=1,
        max_size=6,
    ),
    used=st.lists(st.tuples(st.integers(0, 40000), st.integers(0, 200000), st.integers(0, 8))),
    tasks=st.integers(1, 3),
    gpu=st.integers(0, 2),
    share=st.sampled_from([0, 250]),
    cpu=st.sampled_from([0, 1, 4]),
    preferred=st.sampled_from([(), ("H100",)]),
    policy=st.sampled_from(sorted(POLICIES)),
)
def test_combined_score_with_its_shortcuts_equals_every_score_computed(
    shapes: list[tuple[int, str, int]],
    used: list[tuple[int, int, int]],
    tasks: int,
    gpu: int,
    share: int,
    cpu: int,
    preferred: tuple[str, ...],
    policy: str,
) -> None:
    nodes = [
        node(f"n{i}").gpus(g, model).cpus(c).mem_gib(256) for i, (g, model, c) in enumerate(shapes)
    ]
    chosen: Policy = POLICIES[policy]
    session = Session(snapshot_of(cluster(*nodes)), chosen, 0.0, ())
    free = session.free
    for i, (cpu_used, mem_used, gpus_used) in enumerate(used[: len(nodes)]):
        free.cpu[i] -= min(cpu_used, int(free.cpu[i]))
        free.mem[i] -= min(mem_used, int(free.mem[i]))
        free.gpu_total[i] -= min(gpus_used, int(session.arrays.num_gpus[i])) * GPU_MILLI_WHOLE
    b = job("j").task(tasks, gpu=0 if share else gpu, gpu_milli=share, cpu=cpu)
    j = replace(b.build(), gpu_models_preferred=preferred)
    req = j.groups[0].request
    at = np.arange(len(nodes), dtype=np.int64)
    got = combined_score(session.policy.scores, session, j, req, at)
    assert got.tolist() == combined_before(session, j, req, at).tolist()

"""`placement.may_fit` never rules out a job that a cycle would place: the simulator skips a
cycle after capacity came back when no waiting shape may fit (`sim.engine._settled`), so a
wrong "cannot fit" would lose a placement. Checked against real cycles under policies that
score, pack and spread differently, on free states left by earlier placements; and its kept
fit counts, followed through takes and gives, equal counts computed afresh."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aisched.core import placement
from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind
from aisched.core.placement import may_fit
from aisched.core.policy import preset
from aisched.core.snapshot import RunningJob, Snapshot, snapshot_of
from aisched.model.cluster import TopologyLevel
from aisched.model.job import Job, TopologyMode
from aisched.model.resources import Resources
from aisched.testing import cluster, job, node, pending

POLICIES = ("fifo", "fgd", "bestfit", "worstfit", "hetero")


def _cluster(gpus: list[int]) -> Snapshot:
    nodes = [
        node(f"n{i}").gpus(g).cpus(16).mem_gib(64).rack(f"r{i % 2}") for i, g in enumerate(gpus)
    ]
    return snapshot_of(cluster(*nodes))


@st.composite
def jobs(draw: st.DrawFn, name: str) -> Job:
    b = job(name)
    for g in range(draw(st.integers(1, 2))):
        share = draw(st.sampled_from([0, 0, 300, 500]))  # a share of one GPU, or whole GPUs
        b = b.task(
            draw(st.integers(1, 4)),
            gpu=0 if share else draw(st.integers(0, 4)),
            gpu_milli=share,
            gpu_mem_gib=draw(st.sampled_from([0.0, 8.0])) if share else 0.0,
            cpu=draw(st.sampled_from([1, 4, 8])),
            name=f"g{g}",
        )
    built = b.build()
    if draw(st.booleans()) and built.num_tasks > 1:
        b = b.min_available(draw(st.integers(1, built.num_tasks)))
    layout = draw(st.sampled_from(["free", "pack-node", "pack-rack", "spread"]))
    if layout == "pack-node":
        b = b.pack(TopologyLevel.NODE, TopologyMode.REQUIRED)
    elif layout == "pack-rack":
        b = b.pack(TopologyLevel.RACK, TopologyMode.PREFERRED)
    elif layout == "spread":
        b = b.spread(TopologyLevel.NODE)
    return b.build()


def _busy(snap: Snapshot, fillers: list[Job]) -> Snapshot:
    """The cluster once fifo has placed what it can of `fillers`."""
    result = run_cycle(snap, pending(*fillers), preset("fifo"), 0.0)
    by_id = {j.id: j for j in fillers}
    running = [
        RunningJob(by_id[d.job_id], d.tasks, 0.0) for d in result.decisions if isinstance(d, Bind)
    ]
    return snapshot_of(snap.arrays, running)


@settings(max_examples=150, deadline=None)
@given(
    gpus=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    fillers=st.lists(st.integers(0, 10**6), max_size=4),
    data=st.data(),
    policy=st.sampled_from(POLICIES),
)
def test_a_job_ruled_out_is_never_placed(
    gpus: list[int], fillers: list[int], data: st.DataObject, policy: str
) -> None:
    snap = _busy(_cluster(gpus), [data.draw(jobs(f"f{i}")) for i, _ in enumerate(fillers)])
    candidate = data.draw(jobs("cand"))
    if may_fit({}, snap.arrays, snap.free, candidate):
        return
    result = run_cycle(snap, pending(candidate), preset(policy), 1.0)
    assert not any(isinstance(d, Bind) for d in result.decisions)


def test_room_is_summed_over_nodes_with_an_elastic_gangs_slack() -> None:
    snap = _cluster([2, 2])
    arrays, free = snap.arrays, snap.free
    assert may_fit({}, arrays, free, job("a").task(4, gpu=1).build())  # 2 + 2 GPUs
    assert not may_fit({}, arrays, free, job("b").task(5, gpu=1).build())
    assert not may_fit({}, arrays, free, job("c").task(2, gpu=3).build())  # no node has 3
    assert may_fit({}, arrays, free, job("d").task(5, gpu=1).min_available(4).build())
    assert not may_fit({}, arrays, free, job("e").task(6, gpu=1).min_available(5).build())


def test_kept_counts_follow_takes_and_gives() -> None:
    snap = _cluster([4, 4])
    arrays, free, memo = snap.arrays, snap.free, {}
    wide = job("w").task(2, gpu=4).build()
    assert may_fit(memo, arrays, free, wide)
    holder = job("h").task(gpu=1).build()
    result = run_cycle(snap, pending(holder), preset("fifo"), 0.0)
    (bind,) = [d for d in result.decisions if isinstance(d, Bind)]
    free.take_all(arrays.index, bind.tasks)
    assert not may_fit(memo, arrays, free, wide)  # the kept counts saw the take
    assert not may_fit({}, arrays, free, wide)
    for t in bind.tasks:
        free.give(arrays.index[t.node], t)
    assert may_fit(memo, arrays, free, wide)


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    fillers=st.lists(st.integers(0, 10**6), max_size=4),
    data=st.data(),
)
def test_giving_back_in_bulk_equals_one_task_at_a_time(
    gpus: list[int], fillers: list[int], data: st.DataObject
) -> None:
    """`FreeState.given_back` (the search for room's bound over every candidate) adds up
    what `give` would, task by task; shared GPUs included."""
    snap = _busy(_cluster(gpus), [data.draw(jobs(f"f{i}")) for i, _ in enumerate(fillers)])
    tasks = [t for r in snap.running for t in r.tasks]
    one_by_one = snap.free.copy()
    for t in tasks:
        one_by_one.give(snap.arrays.index[t.node], t)
    assert snap.free.given_back(snap.arrays.index, tasks).equals(one_by_one)


@settings(max_examples=200, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(
            st.integers(0, 8), st.sampled_from(["A100", "H100"]), st.integers(0, 2), st.booleans()
        ),
        min_size=1,
        max_size=6,
    ),
    held=st.lists(st.tuples(st.integers(-4000, 64000), st.integers(-4096, 300000)), max_size=6),
    cpu=st.sampled_from([0, 500, 4000, 16000]),
    mem=st.sampled_from([0, 1024, 65536]),
    gpu=st.integers(0, 4),
    rdma=st.integers(0, 2),
    models=st.sampled_from([(), ("H100",), ("A100", "H100")]),
)
def test_fit_counts_of_a_few_nodes_in_integers_equal_numpys(
    shapes: list[tuple[int, str, int, bool]],
    held: list[tuple[int, int]],
    cpu: int,
    mem: int,
    gpu: int,
    rdma: int,
    models: tuple[str, ...],
) -> None:
    """`_fit_few` (the kept fit counts' path for a few changed nodes) gives `_fit`'s counts:
    free amounts gone negative, unhealthy nodes, RDMA and GPU models included."""
    nodes = []
    for i, (gpus, model, devices, healthy) in enumerate(shapes):
        b = node(f"n{i}").gpus(gpus, model).cpus(32).mem_gib(256).rdma(devices)
        nodes.append(b if healthy else b.unhealthy())
    snap = snapshot_of(cluster(*nodes))
    free = snap.free.copy()
    for i, (cpu_left, mem_left) in enumerate(held[: len(nodes)]):
        free.cpu[i], free.mem[i] = cpu_left, mem_left
    req = Resources(milli_cpu=cpu, mem_mib=mem, gpu=gpu, rdma=rdma)
    at = list(range(len(nodes)))
    few = placement._fit_few(snap.arrays, free, req, models, at)
    assert few == placement._fit(snap.arrays, free, req, models, np.array(at)).tolist()

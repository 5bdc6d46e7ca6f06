"""`placement.pick_gpus` for whole GPUs, worked out in plain integers, picks what the numpy
version before it picked (kept here as the reference): the tightest NVLink group that holds the
request, else the first free GPUs; GPU memory and busy GPUs included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aisched.core import placement
from aisched.core.policy import preset
from aisched.core.session import Session
from aisched.core.snapshot import FreeState, snapshot_of
from aisched.model.resources import GPU_MILLI_WHOLE, Resources
from aisched.testing import cluster, node


def numpy_pick(session: Session, free: FreeState, n: int, req: Resources) -> tuple[int, ...]:
    ok = free.gpu_milli[n] == GPU_MILLI_WHOLE
    if req.gpu_mem_mib:
        ok &= session.arrays.gpu_mem_cap[n] >= -(-req.gpu_mem_mib // req.gpu)
    idx = np.flatnonzero(ok)
    groups = session.arrays.nvlink[n][idx]
    best: tuple[int, ...] | None = None
    best_size = placement.UNBOUNDED
    for grp in sorted(set(groups.tolist())):
        members = idx[groups == grp]
        if req.gpu <= len(members) < best_size:
            best, best_size = tuple(int(i) for i in members[: req.gpu]), len(members)
    return best if best is not None else tuple(int(i) for i in idx[: req.gpu])


@settings(max_examples=300, deadline=None)
@given(
    gpus=st.integers(1, 8),
    group=st.sampled_from([1, 2, 4, 8]),
    mem_gib=st.sampled_from([24, 80]),
    busy=st.lists(st.tuples(st.integers(0, 7), st.sampled_from([250, 1000])), max_size=8),
    want=st.integers(1, 8),
    gpu_mem_gib=st.sampled_from([0, 16, 40]),
)
def test_whole_gpus_picked_in_integers_as_numpy_picked(
    gpus: int,
    group: int,
    mem_gib: int,
    busy: list[tuple[int, int]],
    want: int,
    gpu_mem_gib: int,
) -> None:
    snap = snapshot_of(
        cluster(node("n0").gpus(gpus, "A100", mem_gib, group), node("n1").gpus(8, "A100", 80))
    )
    session = Session(snap, preset("fifo"), 0.0, ())
    free = session.free
    for g, milli in busy:
        if g < gpus:
            free.gpu_milli[0, g] = GPU_MILLI_WHOLE - milli
    req = Resources(gpu=want, gpu_mem_mib=gpu_mem_gib * 1024 * want)
    got, share = placement.pick_gpus(free, session, 0, req)
    assert share == GPU_MILLI_WHOLE
    assert got == numpy_pick(session, free, 0, req)

"""Where the tasks of one job go: feasibility, scoring, topology packing and GPU choice.

Works on numpy arrays over nodes. Identical tasks (one task group) share one feasibility
computation: `fit_counts` says how many replicas of a request each node can take at once, and
the group is then filled greedily in score order. All changes go through the caller's
statement; on failure this module rolls back what it did and returns a reason.

Steps of `place_job`:
1. A cached failure for the same shape and mask answers at once (capacity only shrinks between
   releases, so a failure stays a failure until something is given back).
2. A required `pack` level tries the tightest domains of that level that could hold the gang.
   A preferred one, or the `topology` score on a multi-task gang, tries node, rack, zone in
   turn before spreading freely.
3. Otherwise each task group is filled over all feasible nodes in score order.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from aisched.core.caps import node_caps
from aisched.core.caps import room as app_room
from aisched.core.decisions import TaskBinding
from aisched.core.framework import all_filters, combined_score
from aisched.core.snapshot import BoolArray, FreeState, IntArray
from aisched.model.cluster import TopologyLevel
from aisched.model.job import Job, TopologyMode
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

if TYPE_CHECKING:
    from aisched.core.session import Session
    from aisched.core.statement import Statement

UNBOUNDED = 1 << 40
MAX_DOMAIN_TRIES = 8
LEVEL_NAMES = {
    TopologyLevel.NODE: "node",
    TopologyLevel.RACK: "rack",
    TopologyLevel.ZONE: "zone",
    TopologyLevel.CLUSTER: "cluster",
}


def base_mask(session: Session, gpu_models: tuple[str, ...]) -> BoolArray:
    """Healthy nodes with an allowed GPU model (memoised per cluster)."""
    arrays = session.arrays
    key = ("base-mask", gpu_models)
    hit = arrays.memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    mask = arrays.healthy.copy()
    if gpu_models:
        codes = [i for i, m in enumerate(arrays.models) if m in gpu_models]
        mask &= np.isin(arrays.model_code, codes)
    arrays.memo[key] = mask
    return mask


def fit_counts(session: Session, req: Resources, gpu_models: tuple[str, ...] = ()) -> IntArray:
    """How many tasks of `req` each node can take at the same time (0 where none fit)."""
    f = session.free
    counts = np.full(session.arrays.num_nodes, UNBOUNDED, dtype=np.int64)
    if req.milli_cpu:
        np.minimum(counts, f.cpu // req.milli_cpu, out=counts)
    if req.mem_mib:
        np.minimum(counts, f.mem // req.mem_mib, out=counts)
    if req.rdma:
        np.minimum(counts, f.rdma // req.rdma, out=counts)
    if req.gpu:
        whole = f.whole
        if req.gpu_mem_mib:
            need = -(-req.gpu_mem_mib // req.gpu)
            ok = (f.gpu_milli == GPU_MILLI_WHOLE) & (session.arrays.gpu_mem_cap >= need)
            whole = ok.sum(axis=1)
        np.minimum(counts, whole // req.gpu, out=counts)
        gpu_models_needed = True
    elif req.gpu_milli:
        slots = f.gpu_milli // req.gpu_milli
        if req.gpu_mem_mib:
            slots = np.minimum(slots, f.gpu_mem // req.gpu_mem_mib)
        np.minimum(counts, slots.sum(axis=1), out=counts)
        gpu_models_needed = True
    else:
        gpu_models_needed = False
    counts[counts < 0] = 0
    if gpu_models_needed or gpu_models:
        counts[~base_mask(session, gpu_models)] = 0
    else:
        counts[~session.arrays.healthy] = 0
    return counts


def placement_shape(session: Session, job: Job) -> Hashable:
    """What a placement's outcome depends on besides the free state and the policy: the job's
    shape, or the job itself under a score that draws per job. Caches of placement outcomes
    (failures, never-fits, admission, victim searches) are keyed by it."""
    if session.policy.per_job_placement:
        return (job.shape_id, job.id)
    if node_caps(session.arrays) is not None:  # a node's cap counts the job's app (core.caps)
        return (job.shape_id, job.app)
    return job.shape_id


def known_failure(session: Session, job: Job, mask_key: Hashable = None) -> str | None:
    """The cached reason a job of this shape did not fit under this mask, if any."""
    return session.fail_cache.get((placement_shape(session, job), mask_key))


def place_job(
    session: Session,
    st: Statement,
    job: Job,
    allowed: BoolArray | None = None,
    mask_key: Hashable = None,
) -> tuple[TaskBinding, ...] | str:
    """Place every task of `job` (at least `gang_min`) via `st`; return the bindings, or a
    reason when the job does not fit now. `allowed` limits the nodes it may use."""
    key = (placement_shape(session, job), mask_key)
    cached = session.fail_cache.get(key)
    if cached is not None:
        return cached
    session.placement_attempts += 1
    result = _place(session, st, job, allowed)
    if isinstance(result, str):
        session.fail_cache[key] = result
    return result


def _place(
    session: Session, st: Statement, job: Job, allowed: BoolArray | None
) -> tuple[TaskBinding, ...] | str:
    topo = job.topology
    if topo.pack is not None and topo.pack != TopologyLevel.CLUSTER:
        res = _place_in_domains(session, st, job, topo.pack, allowed)
        if not isinstance(res, str) or topo.mode == TopologyMode.REQUIRED:
            return res
    elif job.num_tasks > 1 and _wants_locality(session):
        for level in (TopologyLevel.NODE, TopologyLevel.RACK, TopologyLevel.ZONE):
            res = _place_in_domains(session, st, job, level, allowed)
            if not isinstance(res, str):
                return res
    return _place_groups(session, st, job, allowed)


def _wants_locality(session: Session) -> bool:
    return session.policy.locality


def _place_in_domains(
    session: Session, st: Statement, job: Job, level: TopologyLevel, allowed: BoolArray | None
) -> tuple[TaskBinding, ...] | str:
    arrays = session.arrays
    dom = arrays.domain(level)
    ndom = int(dom.max()) + 1 if len(dom) else 0
    ok = np.ones(ndom, dtype=np.bool_)
    left = app_room(session, job)
    for g in job.groups:
        c = fit_counts(session, g.request, job.gpu_models)
        if left is not None:
            c = np.minimum(c, left)
        if allowed is not None:
            c = np.where(allowed, c, 0)
        if job.topology.spread == TopologyLevel.NODE:
            c = np.minimum(c, 1)
        sums = np.bincount(dom, weights=np.minimum(c, g.replicas), minlength=ndom)
        ok &= sums >= min(g.replicas, job.gang_min)
    candidates = np.flatnonzero(ok)
    name = LEVEL_NAMES[level]
    if len(candidates) == 0:
        return f"no {name} has room for all {job.num_tasks} tasks of the gang"
    # Tightest domain first (least free GPU, then CPU): keeps big holes for big gangs.
    free_gpu = np.bincount(dom, weights=session.free.gpu_total, minlength=ndom)
    free_cpu = np.bincount(dom, weights=session.free.cpu, minlength=ndom)
    order = np.lexsort((candidates, free_cpu[candidates], free_gpu[candidates]))
    last = ""
    for d in candidates[order][:MAX_DOMAIN_TRIES].tolist():
        mask = dom == d
        if allowed is not None:
            mask &= allowed
        res = _place_groups(session, st, job, mask)
        if not isinstance(res, str):
            return res
        last = res
    return f"no {name} could take all {job.num_tasks} tasks ({last})"


def _place_groups(
    session: Session, st: Statement, job: Job, allowed: BoolArray | None
) -> tuple[TaskBinding, ...] | str:
    """Fill each task group over the allowed nodes in score order; all or nothing."""
    undo_mark = _Mark(st)
    placed: list[TaskBinding] = []
    slack = job.num_tasks - job.gang_min  # tasks that may be left out (elastic part)
    policy = session.policy
    spread = job.topology.spread
    spread_dom = session.arrays.domain(spread) if spread is not None else None
    used_domains: set[int] = set()
    left = app_room(session, job)  # per-node caps on the app's tasks, lowered as they go
    for g in job.groups:
        req = g.request
        counts = fit_counts(session, req, job.gpu_models)
        if left is not None:
            counts = np.minimum(counts, left)
        mask = allowed
        fmask = all_filters(policy.filters, session, job, req) if policy.filters else None
        if fmask is not None:
            mask = fmask if mask is None else (mask & fmask)
        if mask is not None:
            counts = np.where(mask, counts, 0)
        if spread_dom is not None:
            # At most one task of the job per domain, across all its groups.
            counts = np.minimum(counts, 1)
            if used_domains:
                counts[np.isin(spread_dom, list(used_domains))] = 0
        nodes = np.flatnonzero(counts)
        room = int(np.minimum(counts[nodes], g.replicas).sum()) if len(nodes) else 0
        if spread_dom is not None and job.topology.spread != TopologyLevel.NODE:
            room = min(room, len(np.unique(spread_dom[nodes])))
        short = max(g.replicas - room, 0)
        if short > slack:
            undo_mark.rollback()
            return f"room for {room} of {g.replicas} '{g.name}' tasks ({req.describe()} each)"
        slack -= short
        want = g.replicas - short
        if want == 0:
            continue
        scores = combined_score(policy.scores, session, job, req, nodes)
        if want == 1:
            chosen = [int(nodes[int(np.argmax(scores))])]
            takes = [1]
        else:
            order = nodes[np.lexsort((nodes, -scores))]
            chosen, takes = _fill(session, job, order, counts, want)
        if spread_dom is not None:
            used_domains.update(int(spread_dom[n]) for n in chosen)
        if left is not None:
            left[chosen] -= takes
        index = 0
        for node, k in zip(chosen, takes, strict=True):
            for _ in range(k):
                t = _bind_one(session, node, g.name, index, req, job)
                st.take(node, t)
                placed.append(t)
                index += 1
    if not placed:
        undo_mark.rollback()
        return "nothing to place"
    return tuple(placed)


def _fill(
    session: Session, job: Job, order: IntArray, counts: IntArray, want: int
) -> tuple[list[int], list[int]]:
    chosen: list[int] = []
    takes: list[int] = []
    spread = job.topology.spread
    seen_domains: set[int] = set()
    dom = session.arrays.domain(spread) if spread is not None else None
    remaining = want
    for node in order.tolist():
        if dom is not None and spread != TopologyLevel.NODE:
            d = int(dom[node])
            if d in seen_domains:
                continue
            seen_domains.add(d)
        k = 1 if spread is not None else min(int(counts[node]), remaining)
        chosen.append(node)
        takes.append(k)
        remaining -= k
        if remaining == 0:
            break
    return chosen, takes


def _bind_one(
    session: Session, node: int, group: str, index: int, req: Resources, job: Job | None = None
) -> TaskBinding:
    gpus, milli = pick_gpus(session.free, session, node, req, job)
    return TaskBinding(
        group=group,
        index=index,
        node=session.arrays.names[node],
        gpus=gpus,
        gpu_milli=milli,
        milli_cpu=req.milli_cpu,
        mem_mib=req.mem_mib,
        gpu_mem_mib=req.gpu_mem_mib,
        rdma=req.rdma,
    )


def pick_gpus(
    free: FreeState, session: Session, node: int, req: Resources, job: Job | None = None
) -> tuple[tuple[int, ...], int]:
    """Concrete GPU indices for one task on `node`, and the share taken on each.

    Whole GPUs come from one NVLink group when one can hold them (the tightest such group, so
    larger groups stay whole); a GPU share goes where the policy's GPU chooser says (with
    `job` known), else to the fullest GPU it fits on (best fit).
    """
    if req.gpu:
        row = free.gpu_milli[node]
        ok = row == GPU_MILLI_WHOLE
        if req.gpu_mem_mib:
            ok &= session.arrays.gpu_mem_cap[node] >= -(-req.gpu_mem_mib // req.gpu)
        idx = np.flatnonzero(ok)
        groups = session.arrays.nvlink[node][idx]
        best: tuple[int, ...] | None = None
        best_size = UNBOUNDED
        for grp in np.unique(groups).tolist():
            members = idx[groups == grp]
            if req.gpu <= len(members) < best_size:
                best, best_size = tuple(int(i) for i in members[: req.gpu]), len(members)
        if best is None:
            best = tuple(int(i) for i in idx[: req.gpu])
        return best, GPU_MILLI_WHOLE
    if req.gpu_milli:
        row = free.gpu_milli[node]
        ok = row >= req.gpu_milli
        if req.gpu_mem_mib:
            ok &= free.gpu_mem[node] >= req.gpu_mem_mib
        idx = np.flatnonzero(ok)
        chooser = session.policy.gpu_chooser if job is not None else None
        if chooser is not None and job is not None and len(idx) > 1:
            pick = chooser.choose_gpu(session, job, req, node, idx)
        else:
            pick = int(idx[int(np.argmin(row[idx]))])
        return (pick,), req.gpu_milli
    return (), 0


class _Mark:
    """Rolls a statement back to where it stood when the mark was made."""

    __slots__ = ("_st", "_at")

    def __init__(self, st: Statement) -> None:
        self._st = st
        self._at = st.depth()

    def rollback(self) -> None:
        self._st.rollback_to(self._at)


def never_fits(session: Session, job: Job) -> str | None:
    """Why `job` could not run even on the empty cluster, or None if it could."""
    arrays = session.arrays
    key = ("never-fits", placement_shape(session, job), session.policy.locality)
    if key in arrays.memo:
        return arrays.memo[key]  # type: ignore[return-value]
    from aisched.core.statement import Statement

    with session.scratch(FreeState.empty(arrays)):
        session.imagine_empty = True
        st = Statement(session)
        try:
            res = _place(session, st, job, None)
        finally:
            st.discard()
            session.imagine_empty = False
    reason = f"can never fit this cluster: {res}" if isinstance(res, str) else None
    arrays.memo[key] = reason
    return reason

"""Where the tasks of one job go: feasibility, scoring, topology packing and GPU choice.

Works on numpy arrays over nodes. Identical tasks (one task group) share one feasibility
computation: `fit_counts` says how many replicas of a request each node can take at once, and
the group is then filled greedily in score order. All changes go through the caller's
statement; on failure this module rolls back what it did and returns a reason. A reason is
kept for the shape and read by other jobs of it, so it names a task group by its place
(`status.group_ref`), never by the name one job gave it.

Steps of `place_job`:
1. A cached failure for the same shape and mask answers at once (capacity only shrinks between
   releases, so a failure stays a failure until something is given back).
2. A required `pack` level tries the tightest domains of that level that could hold the gang.
   A preferred one, or the `topology` score on a multi-task gang, tries node, rack, zone in
   turn before spreading freely.
3. Otherwise each task group is filled over all feasible nodes in score order.

Its length (just over the house's ~600 lines) is kept on purpose: the steps above, the kept
per-node fit counts and per-domain sums they share, and the GPU choice are one algorithm on
one set of memoised arrays; split, each part would reach into the others' memo keys.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from aisched.core.caps import room as app_room
from aisched.core.decisions import TaskBinding
from aisched.core.framework import all_filters, combined_score
from aisched.core.gpu_unmet import unmet_gpu_asks
from aisched.core.kept_placements import current_key, kept_placements
from aisched.core.session import ShapeBy
from aisched.core.snapshot import BoolArray, ClusterArrays, FreeState, IntArray
from aisched.core.status import group_ref
from aisched.core.taskmix import TaskMix, mix_of
from aisched.model.cluster import TopologyLevel
from aisched.model.job import Job, TopologyMode
from aisched.model.resources import GPU_MILLI_WHOLE, Resources

if TYPE_CHECKING:
    from aisched.core.session import Session
    from aisched.core.statement import Statement

UNBOUNDED = 1 << 40
MAX_DOMAIN_TRIES = 8
# A bounded sample of feasible nodes is scored, not every one, once the cluster has this many
# nodes (unless the policy says otherwise with `node_sample`); AUTO_SAMPLE nodes are scored.
AUTO_SAMPLE_FROM_NODES = 10_000
AUTO_SAMPLE = 256
LEVEL_NAMES = {
    TopologyLevel.NODE: "node",
    TopologyLevel.RACK: "rack",
    TopologyLevel.ZONE: "zone",
    TopologyLevel.CLUSTER: "cluster",
}


def base_mask(session: Session, gpu_models: tuple[str, ...]) -> BoolArray:
    """Healthy nodes with an allowed GPU model (memoised per cluster)."""
    return _base_mask(session.arrays, gpu_models)


def _base_mask(arrays: ClusterArrays, gpu_models: tuple[str, ...]) -> BoolArray:
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
    """How many tasks of `req` each node can take at the same time (0 where none fit).

    Kept per request for the session's free state: a later call recomputes only the nodes a
    take or give changed since (the free state's change log), not every node. The array is
    shared and read-only; callers copy before changing it."""
    return _kept_fit_counts(session.memo, session.arrays, session.free, req, gpu_models)


def _kept_fit_counts(
    memo: dict[object, object],
    arrays: ClusterArrays,
    free: FreeState,
    req: Resources,
    gpu_models: tuple[str, ...],
) -> IntArray:
    """`fit_counts` on `free`, kept in `memo` and updated from `free`'s change log."""
    key = ("fit-counts", req, gpu_models)
    hit = cast("tuple[FreeState, int, int, IntArray] | None", memo.get(key))
    if hit is not None and hit[0] is free and hit[1] == free.generation:
        _, generation, seen, cached = hit
        log = free.changed
        if seen < len(log):
            nodes = sorted(set(log[seen:]))
            few = _fit_few(arrays, free, req, gpu_models, nodes) if len(nodes) <= _FEW else None
            cached.flags.writeable = True
            if few is not None:
                for node, count in zip(nodes, few, strict=True):
                    cached[node] = count
            else:
                idx = np.array(nodes, dtype=np.int64)
                cached[idx] = _fit(arrays, free, req, gpu_models, idx)
            cached.flags.writeable = False
            memo[key] = (free, generation, len(log), cached)
        return cached
    counts = _fit(arrays, free, req, gpu_models, None)
    counts.flags.writeable = False
    memo[key] = (free, free.generation, len(free.changed), counts)
    return counts


def may_fit(memo: dict[object, object], arrays: ClusterArrays, free: FreeState, job: Job) -> bool:
    """Whether `job` might fit `free`: false only when its task groups lack room on all the
    nodes together (fit counts) for more tasks than an elastic gang may leave out. Filters,
    per-node caps, spreads and topology domains only take room away, so a job this rules out
    fails placement whatever the policy. For a caller between cycles (the simulator's skip of
    a cycle that would place nobody); `memo` keeps the fit counts across calls on one free
    state, updated on the nodes its change log names."""
    slack = job.num_tasks - job.gang_min
    for g in job.groups:
        counts = _kept_fit_counts(memo, arrays, free, g.request, job.gpu_models)
        room = int(np.minimum(counts, g.replicas).sum())
        slack -= max(g.replicas - room, 0)
        if slack < 0:
            return False
    return True


def _changed_since(log: list[int], seen: int) -> IntArray:
    """The distinct nodes of the change log from `seen` on, ascending (a few, usually: a set
    is cheaper than numpy's unique for them)."""
    return np.array(sorted(set(log[seen:])), dtype=np.int64)


# Up to this many nodes changed, their fit counts are worked out in plain integers: numpy's
# cost per call, not per node, is most of `_fit` on a few nodes (a bind changes one).
_FEW = 6


def _fit_few(
    arrays: ClusterArrays,
    f: FreeState,
    req: Resources,
    gpu_models: tuple[str, ...],
    nodes: list[int],
) -> list[int] | None:
    """`_fit` on `nodes`, node by node in integers (the same floor divisions, so the same
    counts); None for a request with GPU memory or a GPU share, left to `_fit`."""
    if req.gpu_mem_mib or (req.gpu_milli and not req.gpu):
        return None
    mask = _base_mask(arrays, gpu_models) if req.gpu or gpu_models else arrays.healthy
    cpu, mem, rdma, whole = f.cpu, f.mem, f.rdma, f.whole
    out = []
    for node in nodes:
        count = UNBOUNDED
        if req.milli_cpu:
            count = min(count, cpu.item(node) // req.milli_cpu)
        if req.mem_mib:
            count = min(count, mem.item(node) // req.mem_mib)
        if req.rdma:
            count = min(count, rdma.item(node) // req.rdma)
        if req.gpu:
            count = min(count, whole.item(node) // req.gpu)
        out.append(count if count > 0 and mask.item(node) else 0)
    return out


def _fit(
    arrays: ClusterArrays,
    f: FreeState,
    req: Resources,
    gpu_models: tuple[str, ...],
    idx: IntArray | None,
) -> IntArray:
    """`fit_counts` computed afresh, on every node or on the nodes `idx`."""

    def at(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return a if idx is None else a[idx]

    counts = np.full(arrays.num_nodes if idx is None else len(idx), UNBOUNDED, np.int64)
    if req.milli_cpu:
        np.minimum(counts, at(f.cpu) // req.milli_cpu, out=counts)
    if req.mem_mib:
        np.minimum(counts, at(f.mem) // req.mem_mib, out=counts)
    if req.rdma:
        np.minimum(counts, at(f.rdma) // req.rdma, out=counts)
    if req.gpu:
        whole = at(f.whole)
        if req.gpu_mem_mib:
            need = -(-req.gpu_mem_mib // req.gpu)
            ok = (at(f.gpu_milli) == GPU_MILLI_WHOLE) & (at(arrays.gpu_mem_cap) >= need)
            whole = ok.sum(axis=1)
        np.minimum(counts, whole // req.gpu, out=counts)
        gpu_models_needed = True
    elif req.gpu_milli:
        slots = at(f.gpu_milli) // req.gpu_milli
        if req.gpu_mem_mib:
            slots = np.minimum(slots, at(f.gpu_mem) // req.gpu_mem_mib)
        np.minimum(counts, slots.sum(axis=1), out=counts)
        gpu_models_needed = True
    else:
        gpu_models_needed = False
    counts[counts < 0] = 0
    if gpu_models_needed or gpu_models:
        counts[~at(_base_mask(arrays, gpu_models))] = 0
    else:
        counts[~at(arrays.healthy)] = 0
    return counts


def placement_shape(session: Session, job: Job) -> Hashable:
    """What a placement's outcome depends on besides the free state and the policy: the job's
    shape, or the job itself under a score that draws per job. Caches of placement outcomes
    (failures, never-fits, admission, victim searches) are keyed by it."""
    by = session.shape_by  # decided once per cycle from the policy and the cluster
    if by is ShapeBy.SHAPE:
        return job.shape_id
    if by is ShapeBy.APP:  # a node's cap counts the job's app (core.caps)
        return (job.shape_id, job.app)
    return (job.shape_id, job.id)


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
    reason (kept for the shape: groups named by place) when the job does not fit now.
    `allowed` limits the nodes it may use."""
    key = (placement_shape(session, job), mask_key)
    cached = session.fail_cache.get(key)
    if cached is not None:
        return cached
    session.placement_attempts += 1
    # Worked out before on this very free state, in this cycle or an earlier one?
    kept = (
        kept_placements(session, sample_size(session) > 0)
        if allowed is None and not session.imagine_empty
        else None
    )
    if kept is None:
        result = _place(session, st, job, allowed)
    else:
        outcomes = kept.outcomes(current_key(session))
        # Bindings name their task groups: a job of the same shape whose groups are named
        # otherwise must not be handed another job's names (its tasks are started by them).
        kept_key = (key, job.gpu_models_preferred, tuple(g.name for g in job.groups))
        result = outcomes.get(kept_key)  # type: ignore[assignment]
        if result is None:
            result = outcomes[kept_key] = _place(session, st, job, allowed)
        elif not isinstance(result, str):
            st.take_all(result)
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
        short = _short_everywhere(session, job, allowed)
        if short is not None:  # then no node, rack or zone has room either
            return short
        for level in (TopologyLevel.NODE, TopologyLevel.RACK, TopologyLevel.ZONE):
            res = _place_in_domains(session, st, job, level, allowed)
            if not isinstance(res, str):
                return res
    return _place_groups(session, st, job, allowed)


def _wants_locality(session: Session) -> bool:
    return session.policy.locality


def _short_everywhere(session: Session, job: Job, allowed: BoolArray | None) -> str | None:
    """The reason `_place_groups` gives a gang of one task group, no spread and no node
    sample when the whole cluster lacks room for it, else None. A gang that tries one node,
    then one rack, then one zone first fails in each of them too (each has no more room than
    the whole; filters and per-node caps only take room away), and leaves nothing behind,
    so its placement fails at once, for the reason it would end with, without those tries."""
    if len(job.groups) != 1 or job.topology.spread is not None or sample_size(session):
        return None
    g = job.groups[0]
    counts = fit_counts(session, g.request, job.gpu_models)
    left = app_room(session, job)
    if left is not None:
        counts = np.minimum(counts, left)
    policy = session.policy
    mask = allowed
    fmask = all_filters(policy.filters, session, job, g.request) if policy.filters else None
    if fmask is not None:
        mask = fmask if mask is None else (mask & fmask)
    if mask is not None:
        counts = np.where(mask, counts, 0)
    room = int(np.minimum(counts, g.replicas).sum())
    short = max(g.replicas - room, 0)
    if short <= job.num_tasks - job.gang_min:
        return None
    return f"room for {room} of {g.replicas} '{group_ref(0)}' tasks ({describe(g.request)} each)"


def _place_in_domains(
    session: Session, st: Statement, job: Job, level: TopologyLevel, allowed: BoolArray | None
) -> tuple[TaskBinding, ...] | str:
    dom, ndom = _domains(session, level)
    name = LEVEL_NAMES[level]
    if not _fits_a_domain_when_empty(session, job, level):
        return f"no {name} has room for all {job.num_tasks} tasks of the gang"
    ok = np.ones(ndom, dtype=np.bool_)
    per_node = job.topology.spread == TopologyLevel.NODE
    left = app_room(session, job)  # per-node caps (max_per_node): not in the kept sums
    for g in job.groups:
        c = fit_counts(session, g.request, job.gpu_models)
        cap = 1 if per_node else g.replicas
        if allowed is None and left is None:
            sums = _domain_sums(
                session,
                level,
                ("room", g.request, job.gpu_models, cap),
                partial(_clipped, c, cap),
            )
        else:
            if left is not None:
                c = np.minimum(c, left)
            if allowed is not None:
                c = np.where(allowed, c, 0)
            sums = np.bincount(dom, weights=np.minimum(c, cap), minlength=ndom)
        ok &= sums >= min(g.replicas, job.gang_min)
    candidates = np.flatnonzero(ok)
    if len(candidates) == 0:
        return f"no {name} has room for all {job.num_tasks} tasks of the gang"
    # Tightest domain first (least free GPU, then CPU): keeps big holes for big gangs.
    free_gpu = _domain_sums(
        session, level, ("free-gpu",), lambda idx: _at(session.free.gpu_total, idx)
    )
    free_cpu = _domain_sums(session, level, ("free-cpu",), lambda idx: _at(session.free.cpu, idx))
    order = np.lexsort((candidates, free_cpu[candidates], free_gpu[candidates]))
    members = _members(session, level)
    last = ""
    for d in candidates[order][:MAX_DOMAIN_TRIES].tolist():
        res = _place_groups(session, st, job, allowed, among=members[d])
        if not isinstance(res, str):
            return res
        last = res
    return f"no {name} could take all {job.num_tasks} tasks ({last})"


def _at(a: IntArray, idx: IntArray | None) -> IntArray:
    return a if idx is None else a[idx]


def _clipped(counts: IntArray, cap: int, idx: IntArray | None) -> IntArray:
    return np.minimum(_at(counts, idx), cap)


def _domain_sums(
    session: Session,
    level: TopologyLevel,
    what: Hashable,
    values: Callable[[IntArray | None], IntArray],
) -> IntArray:
    """Per-domain sums at `level` of a per-node quantity of the free state (`values(idx)`: on
    the nodes `idx`, or on all for None). Kept like `fit_counts`: a later call adds the change
    on the nodes changed since, so it costs O(changed), not O(nodes). Read-only."""
    free = session.free
    key = ("domain-sums", level, what)
    hit = cast("tuple[FreeState, int, int, IntArray, IntArray] | None", session.memo.get(key))
    if hit is not None and hit[0] is free and hit[1] == free.generation:
        _, generation, seen, node_values, sums = hit
        log = free.changed
        if seen < len(log):
            idx = _changed_since(log, seen)
            new = values(idx)
            sums.flags.writeable = True
            np.add.at(sums, _domains(session, level)[0][idx], new - node_values[idx])
            sums.flags.writeable = False
            node_values[idx] = new
            session.memo[key] = (free, generation, len(log), node_values, sums)
        return sums
    dom, ndom = _domains(session, level)
    node_values = np.array(values(None), dtype=np.int64)
    sums = np.zeros(ndom, dtype=np.int64)
    np.add.at(sums, dom, node_values)
    sums.flags.writeable = False
    session.memo[key] = (free, free.generation, len(free.changed), node_values, sums)
    return sums


def _domains(session: Session, level: TopologyLevel) -> tuple[IntArray, int]:
    """The domain of every node at `level` and how many domains there are (memoised)."""
    arrays = session.arrays
    key = ("domains", level)
    hit = arrays.memo.get(key)
    if hit is None:
        dom = arrays.domain(level)
        hit = arrays.memo[key] = (dom, int(dom.max()) + 1 if len(dom) else 0)
    return hit  # type: ignore[return-value]


def _members(session: Session, level: TopologyLevel) -> list[IntArray]:
    """The nodes of each domain at `level`, ascending (memoised per cluster)."""
    arrays = session.arrays
    key = ("members", level)
    hit = arrays.memo.get(key)
    if hit is None:
        dom = arrays.domain(level)
        order = np.argsort(dom, kind="stable")
        bounds = np.searchsorted(dom[order], np.arange(int(dom.max()) + 2 if len(dom) else 1))
        hit = arrays.memo[key] = [order[bounds[d] : bounds[d + 1]] for d in range(len(bounds) - 1)]
    return hit  # type: ignore[return-value]


def _fits_a_domain_when_empty(session: Session, job: Job, level: TopologyLevel) -> bool:
    """Whether some domain at `level` could hold the gang on the empty cluster; when none
    could, none can now (free capacity never exceeds the empty cluster's), so the search at
    that level is skipped with the answer it would give (memoised per cluster and shape)."""
    arrays = session.arrays
    key = ("domain-fits-empty", level, job.shape_id, job.gpu_models, job.topology.spread)
    hit = arrays.memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    dom = arrays.domain(level)
    ndom = int(dom.max()) + 1 if len(dom) else 0
    ok = np.ones(ndom, dtype=np.bool_)
    with session.scratch(FreeState.empty(arrays)):
        for g in job.groups:
            c = _fit(arrays, session.free, g.request, job.gpu_models, None)
            if job.topology.spread == TopologyLevel.NODE:
                c = np.minimum(c, 1)
            sums = np.bincount(dom, weights=np.minimum(c, g.replicas), minlength=ndom)
            ok &= sums >= min(g.replicas, job.gang_min)
    fits = bool(ok.any())
    arrays.memo[key] = fits
    return fits


def _place_groups(
    session: Session,
    st: Statement,
    job: Job,
    allowed: BoolArray | None,
    among: IntArray | None = None,
) -> tuple[TaskBinding, ...] | str:
    """Fill each task group over the allowed nodes in score order; all or nothing. `among`:
    only these nodes (ascending; one topology domain), looked at alone, not the cluster."""
    undo_mark = _Mark(st)
    placed: list[TaskBinding] = []
    slack = job.num_tasks - job.gang_min  # tasks that may be left out (elastic part)
    policy = session.policy
    spread = job.topology.spread
    spread_dom = session.arrays.domain(spread) if spread is not None else None
    used_domains: set[int] = set()
    left = app_room(session, job)  # per-node caps on the app's tasks, lowered as they go
    places = _placing_order(job)
    for i in places:
        g = job.groups[i]
        req = g.request
        counts = fit_counts(session, req, job.gpu_models)
        if left is not None:
            counts = np.minimum(counts, left)
        mask = allowed
        fmask = all_filters(policy.filters, session, job, req) if policy.filters else None
        if fmask is not None:
            mask = fmask if mask is None else (mask & fmask)
        k = sample_size(session) if among is None else 0
        if k and spread_dom is None and fmask is None:
            sampled = _sampled_nodes(session, counts, mask, g.replicas, k)
            if sampled is not None:
                _bind_group(session, st, job, g.name, req, sampled, counts, g.replicas, placed)
                continue
        if mask is not None and among is None:
            counts = np.where(mask, counts, 0)
        if spread_dom is not None:
            # At most one task of the job per domain, across all its groups.
            counts = np.minimum(counts, 1)
            if used_domains:
                counts[np.isin(spread_dom, list(used_domains))] = 0
        if among is None:
            nodes = np.flatnonzero(counts)
        else:
            sub = among if mask is None else among[mask[among]]
            nodes = sub[counts[sub] > 0]
        if g.replicas == 1:  # the sum below: every node listed has room for one task
            room = len(nodes)
        else:
            room = int(np.minimum(counts[nodes], g.replicas).sum()) if len(nodes) else 0
        if spread_dom is not None and job.topology.spread != TopologyLevel.NODE:
            room = min(room, len(np.unique(spread_dom[nodes])))
        short = max(g.replicas - room, 0)
        if short > slack:
            undo_mark.rollback()
            return f"room for {room} of {g.replicas} '{group_ref(i)}' tasks ({describe(req)} each)"
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
        _take(session, st, job, g.name, req, chosen, takes, placed)
    if not placed:
        undo_mark.rollback()
        return "nothing to place"
    if places != sorted(places):  # the bindings in the job's order of groups, as always
        place_of = {g.name: k for k, g in enumerate(job.groups)}
        placed.sort(key=lambda t: place_of[t.group])
    return tuple(placed)


def _placing_order(job: Job) -> list[int]:
    """The places of a gang's task groups in the order they are placed: the groups that need
    GPUs first, then the others, each in the job's order. Placing is greedy, group by group: a
    CPU-only group placed first may take the CPUs of the only node whose free GPUs the next
    group needs (a parameter server spread onto a GPU node), and the gang then waits though an
    order that fits exists. An elastic job keeps its own order: its tasks past the minimum are
    left out from its first groups that lack room, as they come."""
    places = list(range(len(job.groups)))
    if job.num_tasks > job.gang_min:
        return places
    return sorted(places, key=lambda i: not _needs_gpu(job.groups[i].request))


def _needs_gpu(req: Resources) -> bool:
    return req.gpu > 0 or req.gpu_milli > 0


def _take(
    session: Session,
    st: Statement,
    job: Job,
    group: str,
    req: Resources,
    chosen: list[int],
    takes: list[int],
    placed: list[TaskBinding],
) -> None:
    index = 0
    for node, k in zip(chosen, takes, strict=True):
        for _ in range(k):
            t = _bind_one(session, node, group, index, req, job)
            st.take(node, t)
            placed.append(t)
            index += 1


def _bind_group(
    session: Session,
    st: Statement,
    job: Job,
    group: str,
    req: Resources,
    nodes: IntArray,
    counts: IntArray,
    want: int,
    placed: list[TaskBinding],
) -> None:
    """Place `want` tasks of a group on the best-scored of `nodes` (which have room)."""
    scores = combined_score(session.policy.scores, session, job, req, nodes)
    if want == 1:
        chosen, takes = [int(nodes[int(np.argmax(scores))])], [1]
    else:
        chosen, takes = _fill(session, job, nodes[np.lexsort((nodes, -scores))], counts, want)
    _take(session, st, job, group, req, chosen, takes, placed)


# A failure's reason names its request; the same few requests fail over and over.
describe = lru_cache(maxsize=4096)(Resources.describe)


def sample_size(session: Session) -> int:
    """Feasible nodes scored per task group; 0: every one."""
    k = session.policy.node_sample
    if k is None:
        return AUTO_SAMPLE if session.arrays.num_nodes >= AUTO_SAMPLE_FROM_NODES else 0
    return k


def _sampled_nodes(
    session: Session, counts: IntArray, mask: BoolArray | None, want: int, k: int
) -> IntArray | None:
    """About `k` feasible nodes to score, with room for `want` tasks among them; None when
    they have less (the caller then looks at every node). Costs O(k), not O(nodes), while
    feasible nodes are common.

    1. The nodes changed most recently (up to k/2): partly used ones, where packing scores
       want to go; this is the quality guard that keeps a sample's binpack close to a full
       one's.
    2. Then a window scanned on from where the last one stopped (kube-scheduler's
       nextStartNodeIndex), until k feasible nodes are found or every node was looked at.
    The start is kept in the session, so the same cycle gives the same sample."""
    n = len(counts)
    if n == 0:
        return None
    parts: list[IntArray] = []
    recent = session.free.changed[-(k // 2) :]
    if recent:
        r = np.array(sorted(set(recent)), dtype=np.int64)
        ok = counts[r] > 0
        if mask is not None:
            ok &= mask[r]
        parts.append(r[ok])
    start = cast(int, session.memo.get("sample-start", 0)) % n
    found, scanned = 0, 0
    step = max(4 * k, 512)
    while found < k and scanned < n:
        # A slice up to the end of the node range at most; the next one wraps to node 0.
        at = (start + scanned) % n
        m = min(step, n - scanned, n - at)
        ok = counts[at : at + m] > 0
        if mask is not None:
            ok &= mask[at : at + m]
        hits = np.flatnonzero(ok)[: k - found] + at
        parts.append(hits)
        found += len(hits)
        scanned += m
        if found >= k:
            session.memo["sample-start"] = int(hits[-1]) + 1
    nodes = np.unique(np.concatenate(parts))
    if len(nodes) == 0 or int(np.minimum(counts[nodes], want).sum()) < want:
        return None
    return nodes


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
        # In plain integers: a node's few GPUs cost less so than numpy's calls on them.
        whole = [
            g for g, milli in enumerate(free.gpu_milli[node].tolist()) if milli == GPU_MILLI_WHOLE
        ]
        if req.gpu_mem_mib:
            need, caps = -(-req.gpu_mem_mib // req.gpu), session.arrays.gpu_mem_cap[node].tolist()
            whole = [g for g in whole if caps[g] >= need]
        nvlink = session.arrays.nvlink[node].tolist()
        groups: dict[int, list[int]] = {}
        for g in whole:  # ascending, so each group's members are too
            groups.setdefault(nvlink[g], []).append(g)
        best: list[int] = whole
        best_size = UNBOUNDED
        for grp in sorted(groups):
            members = groups[grp]
            if req.gpu <= len(members) < best_size:
                best, best_size = members, len(members)
        return tuple(best[: req.gpu]), GPU_MILLI_WHOLE
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
    """Why `job` could not run even on the empty cluster, or None if it could (kept for its
    shape: its groups named by place, `status.named_for` names them)."""
    arrays = session.arrays
    key = ("never-fits", placement_shape(session, job), session.policy.locality)
    if key in arrays.memo:
        return arrays.memo[key]  # type: ignore[return-value]
    from aisched.core.statement import Statement

    with session.scratch(FreeState.empty(arrays)):
        # Scored as if the job were the whole workload: a mix-aware score (fgd) would
        # otherwise judge one shape differently as the queue changes, and the verdict is kept.
        # Held by the session's memo, whose entries key on a mix's id: no id reused meanwhile.
        mix = session.memo.setdefault(("imagined-mix", key), mix_of((job,)))
        session.imagine_empty, session.imagined_mix = True, cast(TaskMix, mix)
        st = Statement(session)
        try:
            res = _place(session, st, job, None)
        finally:
            st.discard()
            session.imagine_empty, session.imagined_mix = False, None
    reason = None
    if isinstance(res, str):
        unmet = unmet_gpu_asks(arrays, job)
        reason = f"can never fit this cluster: {res}" + (f"; {unmet}" if unmet else "")
    arrays.memo[key] = reason
    return reason

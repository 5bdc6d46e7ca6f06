"""Cluster autoscaling, pure: how many nodes of which pool to add, and which idle nodes to remove.

The rules are those a user of the Kubernetes Cluster Autoscaler or Karpenter expects:

Scale-up (`plan_scale_up`), given the jobs that a cycle could not place and the state of every
node pool:

1. What is free on the pool's present nodes, and nodes already asked for and not yet joined
   (empty), are the pool's open bins: pending work is packed onto them first, so a gang that
   needs one more node asks for one, and a gang waiting for its nodes does not ask again each
   cycle.
2. Each job in turn (the caller's order: who comes first gets the capacity when pools run out) is
   packed, all tasks of its gang (`gang_min` of them) in one pool, onto that pool's open bins
   and then onto new template nodes, biggest tasks first, first fit. Topology: a gang that must
   stay on one node goes on one bin; one spread over nodes puts one task per bin; a pool's
   nodes share one rack, so rack and zone packing always hold and spreading over racks or
   zones cannot be helped by one pool.
3. Of the pools that can hold the gang within their `max_nodes`, the one whose new nodes cost
   least per hour wins when pools have a cost; otherwise (and between equal costs) the one that
   adds the least capacity (GPUs, then CPUs, then memory), then the pool name. The winner's
   bins, new ones included, stay open for the jobs after.
4. A job no pool could ever hold, even empty at its maximum (a task bigger than the template, a
   GPU model no pool has, a gang wider than `max_nodes`), adds nothing and is reported; so is a
   job that would fit but finds every suitable pool at its maximum. Neither makes a pool grow,
   so a gang too big for every pool never causes endless growth.

Scale-down (`plan_scale_down`): a node with nothing running for its pool's
`scale_down_idle_s` is removed, the longest idle first (then by name), never taking a pool below
`min_nodes` (nodes still provisioning do not count towards the minimum).

The caller owns time and membership: it asks for nodes, makes them join after the pool's
`provisioning_delay_s`, and tells us which nodes are idle since when. Nothing here reads a clock
or knows about the simulator or the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aisched.model.cluster import NodePool, TopologyLevel
from aisched.model.job import Job, TopologyMode
from aisched.model.resources import GPU_MILLI_WHOLE, Resources


@dataclass(frozen=True, slots=True)
class NodeFree:
    """What is free on one present node: CPU, memory, and per GPU its free share and memory."""

    milli_cpu: int
    mem_mib: int
    gpu_milli: tuple[int, ...] = ()
    gpu_mem_mib: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolState:
    """A pool and how many of its nodes are there (`nodes`) and on their way (`provisioning`);
    `free`: what is free on present nodes of the pool that have anything free (may be left out:
    the plan then counts on new nodes only)."""

    pool: NodePool
    nodes: int
    provisioning: int = 0
    free: tuple[NodeFree, ...] = ()

    @property
    def headroom(self) -> int:
        """Nodes the pool may still add."""
        return max(self.pool.max_nodes - self.nodes - self.provisioning, 0)


@dataclass(frozen=True, slots=True)
class ScaleUp:
    """Add `count` nodes to `pool`, for the pending `jobs` with tasks packed onto them."""

    pool: str
    count: int
    jobs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ScaleUpPlan:
    """`scale_ups` in pool order (nothing for a pool that adds no node); `unhelped`: why each
    job that no new node will serve gets none."""

    scale_ups: tuple[ScaleUp, ...]
    unhelped: Mapping[str, str]

    def count(self, pool: str) -> int:
        return sum(s.count for s in self.scale_ups if s.pool == pool)


@dataclass(frozen=True, slots=True)
class IdleNode:
    """A present node of an autoscaling pool with nothing running on it since `idle_since_s`."""

    name: str
    pool: str
    idle_since_s: float


class _Bin:
    """A node of a pool as the packing sees it: what is free on it."""

    __slots__ = ("cpu", "mem", "gpu_milli", "gpu_mem", "new")

    def __init__(self, pool: NodePool, new: bool) -> None:
        t = pool.template
        self.cpu = t.milli_cpu
        self.mem = t.mem_mib
        self.gpu_milli = [GPU_MILLI_WHOLE] * len(t.gpus)
        self.gpu_mem = [g.mem_mib for g in t.gpus]
        self.new = new  # added by this plan (not present or provisioning already)

    @classmethod
    def of(cls, free: NodeFree) -> _Bin:
        b = cls.__new__(cls)
        b.cpu, b.mem, b.new = free.milli_cpu, free.mem_mib, False
        b.gpu_milli, b.gpu_mem = list(free.gpu_milli), list(free.gpu_mem_mib)
        return b

    def copy(self) -> _Bin:
        b = _Bin.__new__(_Bin)
        b.cpu, b.mem, b.new = self.cpu, self.mem, self.new
        b.gpu_milli, b.gpu_mem = list(self.gpu_milli), list(self.gpu_mem)
        return b

    def fits(self, req: Resources) -> bool:
        """True when one task of `req` fits here now (nothing changes)."""
        if req.milli_cpu > self.cpu or req.mem_mib > self.mem:
            return False
        if req.gpu:
            need = -(-req.gpu_mem_mib // req.gpu)
            whole = 0
            for i, m in enumerate(self.gpu_milli):
                if m == GPU_MILLI_WHOLE and self.gpu_mem[i] >= need:
                    whole += 1
            return whole >= req.gpu
        if req.gpu_milli:
            return any(
                m >= req.gpu_milli and self.gpu_mem[i] >= req.gpu_mem_mib
                for i, m in enumerate(self.gpu_milli)
            )
        return True

    def take(self, req: Resources) -> bool:
        """Take one task of `req` if it fits; False (and nothing changed) if not."""
        if not self.fits(req):
            return False
        if req.gpu:
            need = -(-req.gpu_mem_mib // req.gpu)
            left = req.gpu
            for i, m in enumerate(self.gpu_milli):
                if left and m == GPU_MILLI_WHOLE and self.gpu_mem[i] >= need:
                    self.gpu_milli[i] = 0
                    self.gpu_mem[i] -= need
                    left -= 1
        elif req.gpu_milli:
            # Best fit: the fullest GPU that still takes it.
            _, i = min(
                (m, i)
                for i, m in enumerate(self.gpu_milli)
                if m >= req.gpu_milli and self.gpu_mem[i] >= req.gpu_mem_mib
            )
            self.gpu_milli[i] -= req.gpu_milli
            self.gpu_mem[i] -= req.gpu_mem_mib
        self.cpu -= req.milli_cpu
        self.mem -= req.mem_mib
        return True


def plan_scale_up(pending: Sequence[Job], pools: Sequence[PoolState]) -> ScaleUpPlan:
    """Steps 1-4 of the module docstring. `pending`: the jobs a cycle could not place, in the
    order they should get capacity."""
    bins = {
        ps.pool.name: [_Bin.of(f) for f in ps.free]
        + [_Bin(ps.pool, new=False) for _ in range(ps.provisioning)]
        for ps in pools
    }
    headroom = {ps.pool.name: ps.headroom for ps in pools}
    costed = any(ps.pool.cost_per_node_hour is not None for ps in pools)
    served: dict[str, list[str]] = {ps.pool.name: [] for ps in pools}
    unhelped: dict[str, str] = {}
    never: dict[int, str | None] = {}  # shape id -> why no pool can ever hold it
    # (shape id, pool) that did not fit: bins only fill up and headroom only shrinks as the plan
    # goes on, so a later job of that shape will not fit that pool either.
    failed: set[tuple[int, str]] = set()
    for job in pending:
        if not any(headroom.values()) and not any(bins.values()):
            unhelped[job.id] = "every node pool is at its maximum"
            continue
        if job.shape_id not in never:
            never[job.shape_id] = _never_held(job, pools)
        reason = never[job.shape_id]
        if reason is not None:
            unhelped[job.id] = reason
            continue
        best: tuple[tuple[float, int, int, int, str], str, list[_Bin]] | None = None
        for ps in pools:
            name = ps.pool.name
            if not _model_ok(job, ps.pool) or (job.shape_id, name) in failed:
                continue
            packed = _pack(job, bins[name], ps.pool, headroom[name])
            if packed is None:
                failed.add((job.shape_id, name))
                continue
            added = sum(1 for b in packed if b.new) - sum(1 for b in bins[name] if b.new)
            t = ps.pool.template
            cost = added * (ps.pool.cost_per_node_hour or 0.0) if costed else 0.0
            key = (cost, added * len(t.gpus), added * t.milli_cpu, added * t.mem_mib, name)
            if best is None or key < best[0]:
                best = (key, name, packed)
        if best is None:
            unhelped[job.id] = "every node pool that could hold it is at its maximum"
            continue
        _, name, packed = best
        old = bins[name]
        headroom[name] -= sum(1 for b in packed if b.new) - sum(1 for b in old if b.new)
        # `_pack` copies a bin before it changes it: a changed new bin is a new object.
        if any(b.new and (j >= len(old) or b is not old[j]) for j, b in enumerate(packed)):
            served[name].append(job.id)  # some of its tasks are on the new nodes
        bins[name] = packed
    ups = []
    for ps in pools:
        name = ps.pool.name
        count = sum(1 for b in bins[name] if b.new)
        if count:
            ups.append(ScaleUp(name, count, tuple(served[name])))
    return ScaleUpPlan(tuple(ups), unhelped)


def plan_scale_down(
    idle: Iterable[IdleNode], pools: Sequence[PoolState], now: float
) -> tuple[str, ...]:
    """The idle nodes to remove now: idle for at least their pool's `scale_down_idle_s`, the
    longest idle first, never below a pool's `min_nodes` (of present nodes)."""
    by_name = {ps.pool.name: ps for ps in pools}
    left = {name: ps.nodes - ps.pool.min_nodes for name, ps in by_name.items()}
    out: list[str] = []
    for node in sorted(idle, key=lambda n: (n.idle_since_s, n.name)):
        ps = by_name.get(node.pool)
        if ps is None or left[node.pool] <= 0:
            continue
        if now - node.idle_since_s >= ps.pool.scale_down_idle_s:
            out.append(node.name)
            left[node.pool] -= 1
    return tuple(out)


def _tasks(job: Job) -> list[Resources]:
    """The gang's tasks to pack (its first `gang_min`), biggest first."""
    tasks = [g.request for g in job.groups for _ in range(g.replicas)][: job.gang_min]
    return sorted(
        tasks,
        key=lambda r: (r.gpu, r.gpu_milli, r.gpu_mem_mib, r.milli_cpu, r.mem_mib),
        reverse=True,
    )


def _model_ok(job: Job, pool: NodePool) -> bool:
    # As the core's filter: a job that names GPU models goes only to nodes of those models.
    return not job.gpu_models or pool.template.gpu_model in job.gpu_models


def _pack(job: Job, bins: list[_Bin], pool: NodePool, headroom: int) -> list[_Bin] | None:
    """`bins` with the gang packed on (new template nodes added, at most `headroom`), or None
    when it does not fit; `bins` itself is left as it was."""
    top = job.topology
    required = top.mode == TopologyMode.REQUIRED
    one_node = required and top.pack == TopologyLevel.NODE
    one_each = top.spread == TopologyLevel.NODE
    tasks = _tasks(job)
    if top.spread is not None and top.spread > TopologyLevel.NODE and len(tasks) > 1:
        return None  # a pool's nodes share one rack and zone
    out = list(bins)  # copy-on-write: a bin is copied before it is first changed
    added = 0
    if one_node:
        for i, b in enumerate(out):
            if not b.fits(tasks[0]):
                continue
            trial = b.copy()
            if all(trial.take(r) for r in tasks):
                out[i] = trial
                return out
        if headroom < 1:
            return None
        fresh = _Bin(pool, new=True)
        return out + [fresh] if all(fresh.take(r) for r in tasks) else None
    copied: set[int] = set()
    used_by_gang: set[int] = set()
    for r in tasks:
        placed = False
        for i, b in enumerate(out):
            if (one_each and i in used_by_gang) or not b.fits(r):
                continue
            if i not in copied:
                b = out[i] = b.copy()
                copied.add(i)
            b.take(r)
            used_by_gang.add(i)
            placed = True
            break
        if placed:
            continue
        if added >= headroom:
            return None
        fresh = _Bin(pool, new=True)
        if not fresh.take(r):
            return None
        out.append(fresh)
        copied.add(len(out) - 1)
        used_by_gang.add(len(out) - 1)
        added += 1
    return out


def _never_held(job: Job, pools: Sequence[PoolState]) -> str | None:
    """Why no pool could hold the gang even when empty at its maximum, or None."""
    for ps in pools:
        if _model_ok(job, ps.pool) and _pack(job, [], ps.pool, ps.pool.max_nodes) is not None:
            return None
    if not any(_model_ok(job, ps.pool) for ps in pools):
        return f"no node pool has GPU model {' or '.join(job.gpu_models)}"
    return "larger than any node pool can hold at its maximum"

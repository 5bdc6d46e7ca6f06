"""Autoscaling node pools in the simulator: nodes asked for when jobs wait for capacity,
joining after their provisioning delay, removed after their idle time (the core's
`plan_scale_up` / `plan_scale_down` decide), and the billed nodes and cost sampled at every
change. `NodePools` is the engine's base: it declares what of the engine it uses."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aisched.core.cluster_autoscale import (
    IdleNode,
    NodeFree,
    PoolState,
    plan_scale_down,
    plan_scale_up,
)
from aisched.core.decisions import TaskBinding
from aisched.core.pending import PendingQueue
from aisched.core.policy import Policy
from aisched.core.snapshot import ClusterArrays, FreeState, Snapshot, build_arrays
from aisched.core.status import JobStatus, StatusCode
from aisched.lifecycle.admission import never_fits_now
from aisched.lifecycle.holdings import Holdings
from aisched.model.cluster import Cluster, Node, NodePool
from aisched.model.queue import QueueTree
from aisched.sim.events import IDLE, JOIN
from aisched.sim.results import LogEntry, NodeSample
from aisched.sim.sim_job import SimJob

# Statuses of a pending job that more nodes could help: it waits for capacity, not for its
# queue's share or its dependencies.
_WANTS_NODES = frozenset(
    {
        StatusCode.WAIT_RESOURCES,
        StatusCode.RESERVED,
        StatusCode.WAIT_RESERVATION,
        StatusCode.NOT_CONSIDERED,
        StatusCode.NEVER_FITS,
    }
)


class NodePools:
    # The engine's, set in its __init__ (`_Engine`); used here.
    arrays: ClusterArrays
    index: dict[str, int]
    held: Holdings
    cluster: Cluster
    policy: Policy
    queues: QueueTree
    jobs: dict[str, SimJob]
    pending: PendingQueue
    running: dict[str, SimJob]
    log: list[LogEntry]
    capacity_gpus: float

    @property
    def free(self) -> FreeState:
        return self.held.free

    def _push(self, t: float, kind: int, job_id: str, attempt: int) -> None:
        raise NotImplementedError  # the engine's event heap

    def _changed(self, now: float) -> None:
        raise NotImplementedError  # the engine's

    # --- autoscaling node pools -------------------------------------------------------------

    def _init_pools(self, cluster: Cluster) -> None:
        self.pools: dict[str, NodePool] = {p.name: p for p in cluster.node_pools}
        self.present: dict[str, Node] = {n.name: n for n in cluster.nodes}
        self.coming: dict[str, Node] = {}  # asked for, not joined yet
        self.pool_of: dict[str, str] = {}  # present or coming pool node -> its pool
        self.pool_present = dict.fromkeys(self.pools, 0)
        self.pool_coming = dict.fromkeys(self.pools, 0)
        self.next_index = dict.fromkeys(self.pools, 0)
        # Running tasks per present pool node (empty without pools: the hooks then cost nothing),
        # and since when each task-less one has been idle, with a stamp that voids old checks.
        self.node_tasks: dict[str, int] = {}
        self.idle_since: dict[str, float] = {}
        self.idle_stamp: dict[str, int] = {}
        self.membership_dirty = False
        self.nodes_added = 0
        self.nodes_removed = 0
        self.priced = any(p.cost_per_node_hour is not None for p in cluster.node_pools)
        self.node_samples: list[NodeSample] = []
        self.ceiling: Snapshot | None = None
        for n in cluster.nodes:
            pool = cluster.pool_of(n.name)
            if pool is None:
                continue
            self.pool_of[n.name] = pool.name
            self.pool_present[pool.name] += 1
            self.node_tasks[n.name] = 0
            index = int(n.name.rpartition("-")[2])
            self.next_index[pool.name] = max(self.next_index[pool.name], index + 1)
        if self.pools:
            # What "never fits" means with autoscaling: not even with every pool at its maximum.
            top = build_arrays(cluster.at_max())
            self.ceiling = Snapshot(top, FreeState.empty(top), (), self.queues)
            self.capacity_gpus = float(top.num_gpus[top.healthy].sum())

    def _start_pools(self, now: float) -> None:
        for name in self.node_tasks:
            self._mark_idle(name, now)
        self._bill(now)

    def _bill(self, now: float) -> None:
        """Sample the billed nodes, present GPUs and cost rate (after any change to them)."""
        cost = 0.0
        for pool_name in self.pool_of.values():
            cost += self.pools[pool_name].cost_per_node_hour or 0.0
        gpus = sum(len(n.gpus) for n in self.present.values() if n.healthy)
        point = (now, len(self.present) + len(self.coming), float(gpus), cost)
        samples = self.node_samples
        if samples and samples[-1][1:] == point[1:]:
            return
        if samples and samples[-1][0] == now:
            samples[-1] = point
        else:
            samples.append(point)

    def _never_fits(self, job_id: str, reason: str) -> str | None:
        """Why a job the present nodes can never hold is rejected; None when it would fit once
        the pools have grown, so it waits instead."""
        end = never_fits_now(self.jobs[job_id].job, reason, self.policy, self.ceiling)
        return None if end is None else end.why

    def _pool_states(self, with_free: bool = False) -> list[PoolState]:
        free: dict[str, list[NodeFree]] = {name: [] for name in self.pools}
        if with_free and self.node_tasks:
            # What the present pool nodes have free (the arrays are current: a cycle just ran).
            # Only nodes with a free GPU share, or without GPUs: a full GPU node serves no gang.
            a, f = self.arrays, self.free
            names = list(self.node_tasks)
            rows = np.array([self.index[n] for n in names], dtype=np.int64)
            keep = np.flatnonzero((a.num_gpus[rows] == 0) | (f.gpu_total[rows] > 0)).tolist()
            cpu, mem = f.cpu[rows].tolist(), f.mem[rows].tolist()
            milli, gmem = f.gpu_milli[rows].tolist(), f.gpu_mem[rows].tolist()
            valid = a.gpu_valid[rows].tolist()
            for j in keep:
                v = valid[j]
                free[self.pool_of[names[j]]].append(
                    NodeFree(
                        cpu[j],
                        mem[j],
                        tuple(x for x, ok in zip(milli[j], v, strict=True) if ok),
                        tuple(x for x, ok in zip(gmem[j], v, strict=True) if ok),
                    )
                )
        return [
            PoolState(p, self.pool_present[name], self.pool_coming[name], tuple(free[name]))
            for name, p in self.pools.items()
        ]

    def _scale_up(self, now: float, diagnostics: Mapping[str, JobStatus]) -> None:
        if not self.pending:
            return
        states = self._pool_states()
        if not any(ps.headroom or ps.provisioning for ps in states):
            return  # every pool at its maximum with nothing on the way: nothing to plan
        waiting = []
        for pj in self.pending.values():
            status = diagnostics.get(pj.id)  # None: preempted by this cycle, wants room again
            if status is None or status.code in _WANTS_NODES:
                waiting.append(pj.job)
        if not waiting:
            return
        plan = plan_scale_up(waiting, self._pool_states(with_free=True))
        for up in plan.scale_ups:
            pool = self.pools[up.pool]
            names = []
            for _ in range(up.count):
                node = pool.node(self.next_index[up.pool])
                self.next_index[up.pool] += 1
                self.coming[node.name] = node
                self.pool_of[node.name] = up.pool
                self.pool_coming[up.pool] += 1
                self._push(now + pool.provisioning_delay_s, JOIN, node.name, 0)
                names.append(node.name)
            self.nodes_added += up.count
            self.log.append((now, "scale-up", up.pool, tuple(names)))
        if plan.scale_ups:
            self._bill(now)

    def _join(self, name: str, now: float) -> None:
        node = self.coming.pop(name)
        pool = self.pool_of[name]
        self.pool_coming[pool] -= 1
        self.pool_present[pool] += 1
        self.present[name] = node
        self.node_tasks[name] = 0
        self.membership_dirty = True
        self._mark_idle(name, now)
        self.log.append((now, "join", name, ()))
        self._bill(now)
        self._changed(now)

    def _mark_idle(self, name: str, now: float) -> None:
        self.idle_since[name] = now
        stamp = self.idle_stamp.get(name, 0) + 1
        self.idle_stamp[name] = stamp
        self._push(now + self.pools[self.pool_of[name]].scale_down_idle_s, IDLE, name, stamp)

    def _busy(self, tasks: tuple[TaskBinding, ...]) -> None:
        counts = self.node_tasks
        for t in tasks:
            c = counts.get(t.node)
            if c is None:
                continue  # not a pool node
            if c == 0:
                del self.idle_since[t.node]
            counts[t.node] = c + 1

    def _unbusy(self, tasks: tuple[TaskBinding, ...], now: float) -> None:
        counts = self.node_tasks
        for t in tasks:
            c = counts.get(t.node)
            if c is None:
                continue
            counts[t.node] = c - 1
            if c == 1:
                self._mark_idle(t.node, now)

    def _idle_check(self, name: str, stamp: int, now: float) -> None:
        if name not in self.idle_since or self.idle_stamp.get(name) != stamp:
            return  # busy again, or idle again since: a later check stands
        idle = [IdleNode(n, self.pool_of[n], since) for n, since in self.idle_since.items()]
        gone = plan_scale_down(idle, self._pool_states(), now)
        for n in gone:
            pool = self.pool_of.pop(n)
            del self.present[n], self.node_tasks[n], self.idle_since[n]
            self.pool_present[pool] -= 1
            self.nodes_removed += 1
            self.membership_dirty = True
            self.log.append((now, "remove", n, ()))
        if gone:
            self._bill(now)

    def _rebuild(self) -> None:
        """New node arrays for the present nodes; every running binding taken again."""
        arrays = build_arrays(Cluster(tuple(self.present.values()), self.cluster.links))
        self.held.rebuild(arrays)
        self.arrays, self.index = arrays, arrays.index
        self.membership_dirty = False

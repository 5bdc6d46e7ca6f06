"""The resources that running attempts hold, and the view of them the core is given.

`Holdings` is the one ledger both drivers keep: the free capacity of every node, the running
usage per (queue, user), and one `RunningJob` view per job holding resources. An attempt's
bindings are taken whole when it starts (`take`) and given back whole when it has ended
(`give`); nothing else changes them, so the free capacity is never rebuilt from the running set
except when the nodes themselves change (`rebuild`).

Invariants (checked by `problems`, which validate mode calls after every change):
- the free capacity equals the nodes' capacity less every held binding, and is never negative;
- the usage per (queue, user) is the sum of the held views' usage;
- a job holds at most one attempt: `take` of a job already holding raises `HoldingError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from aisched.core.decisions import TaskBinding
from aisched.core.snapshot import (
    ADDED,
    CHANGE_LOG_LIMIT,
    GONE,
    IN_PLACE,
    ZERO,
    ClusterArrays,
    FreeState,
    RunningChanges,
    RunningJob,
    Snapshot,
    Usage,
    add_usage,
    usage_by_user,
    validate_free,
)
from aisched.model.queue import QueueTree

# Float sums of usage differ from a fresh sum by rounding only; this much is not drift.
_USAGE_TOLERANCE = 1e-6


class HoldingError(RuntimeError):
    """A driver asked for something the ledger cannot do (a bug, never bad input)."""


class Holdings:
    def __init__(self, arrays: ClusterArrays) -> None:
        self.arrays = arrays
        self.free = FreeState.empty(arrays)
        self.usage: dict[tuple[str, str], Usage] = {}
        # Insertion-ordered: the running tuple a cycle gets is in the order attempts started.
        self.views: dict[str, RunningJob] = {}
        # The jobs holding a task on each node, for `holders_on`.
        self.on_node: dict[str, set[str]] = {}
        # `running()`, kept until the views change: the core keeps what it derives from the
        # running set across cycles and knows it unchanged when handed the same tuple.
        self._running: tuple[RunningJob, ...] | None = None
        # Every view taken and given back, in order (`RunningChanges`): the core's kept ranks
        # follow it rather than compare whole running sets. Bounded as the free state's log.
        self.log: list[tuple[RunningJob, int]] = []
        self._snapshot: Snapshot | None = None  # the last `snapshot`, while it still holds

    def take(self, view: RunningJob) -> None:
        """Hold `view`'s bindings for its job; the job must hold nothing yet."""
        job_id = view.job.id
        if job_id in self.views:
            raise HoldingError(f"job {job_id} already holds an attempt")
        index, free = self.arrays.index, self.free
        for t in view.tasks:
            node = index.get(t.node)
            if node is None:
                raise HoldingError(f"job {job_id}: bound to unknown node {t.node}")
            free.take(node, t)
        for t in view.tasks:
            self.on_node.setdefault(t.node, set()).add(job_id)
        self.views[job_id] = view
        self._changed(view, ADDED)
        self._add_usage(view, 1.0)

    def give(self, job_id: str) -> RunningJob:
        """Give back everything `job_id` holds; returns the view it held."""
        view = self.views.pop(job_id, None)
        if view is None:
            raise HoldingError(f"job {job_id} holds nothing")
        index, free, on_node = self.arrays.index, self.free, self.on_node
        for t in view.tasks:
            free.give(index[t.node], t)
            holders = on_node.get(t.node)  # None after another of its tasks on the node
            if holders is not None:
                holders.discard(job_id)
                if not holders:
                    del on_node[t.node]
        self._changed(view, GONE)
        self._add_usage(view, -1.0)
        return view

    def update(self, view: RunningJob) -> None:
        """Replace a held view by one with the same tasks (e.g. now terminating)."""
        old = self.views.get(view.job.id)
        if old is None or old.tasks != view.tasks:
            raise HoldingError(f"job {view.job.id}: update must keep the tasks it holds")
        self.views[view.job.id] = view
        self._changed(old, GONE)
        self._changed(view, IN_PLACE)

    def short_nodes(self, tasks: Sequence[TaskBinding]) -> frozenset[str]:
        """The nodes where `tasks`, taken together, need more than is free now (CPU, memory,
        RDMA, or a GPU's share or memory): empty when they all fit beside what is held."""
        index, free = self.arrays.index, self.free
        need: dict[str, list[int]] = {}
        gpu_need: dict[tuple[str, int], list[int]] = {}
        for t in tasks:
            n = need.setdefault(t.node, [0, 0, 0])
            n[0] += t.milli_cpu
            n[1] += t.mem_mib
            n[2] += t.rdma
            per_gpu_mem = t.gpu_mem_mib // len(t.gpus) if t.gpus else 0
            for g in t.gpus:
                gn = gpu_need.setdefault((t.node, g), [0, 0])
                gn[0] += t.gpu_milli
                gn[1] += per_gpu_mem
        short = {
            node
            for node, (cpu, mem, rdma) in need.items()
            if node not in index
            or cpu > free.cpu[index[node]]
            or mem > free.mem[index[node]]
            or rdma > free.rdma[index[node]]
        }
        for (node, g), (milli, gmem) in gpu_need.items():
            i = index.get(node)
            if i is None or milli > free.gpu_milli[i, g] or gmem > free.gpu_mem[i, g]:
                short.add(node)
        return frozenset(short)

    def holders_on(self, nodes: frozenset[str]) -> frozenset[str]:
        """The jobs holding a task on any of `nodes`."""
        on_node = self.on_node
        return frozenset(j for node in nodes for j in on_node.get(node, ()))

    def holds(self, job_id: str) -> bool:
        return job_id in self.views

    def running(self) -> tuple[RunningJob, ...]:
        """The held views in the order their attempts started (one tuple until a change)."""
        if self._running is None:
            self._running = tuple(self.views.values())
        return self._running

    def snapshot(self, queues: QueueTree) -> Snapshot:
        """The core's view of what is held: the last one again while nothing changed (the
        free state and usage it holds are the ledger's own, so they are current anyway)."""
        last, running, log = self._snapshot, self.running(), self.log
        if (
            last is not None
            and last.running is running
            and last.queues is queues
            and last.free is self.free
            and last.arrays is self.arrays
            and last.changes is not None
            and last.changes.log is log
            and last.changes.upto == len(log)
        ):
            return last
        changes = RunningChanges(log, len(log))
        snap = Snapshot(self.arrays, self.free, running, queues, self.usage, None, changes)
        self._snapshot = snap
        return snap

    def _changed(self, view: RunningJob, came: int) -> None:
        self._running = None
        if len(self.log) >= CHANGE_LOG_LIMIT:
            self.log = []  # a new list: a reader of the old one compares whole sets
        self.log.append((view, came))

    def rebuild(self, arrays: ClusterArrays) -> FreeState:
        """The nodes changed: new arrays, every held binding taken again; returns the new free
        state (the caller swaps it in where readers see it)."""
        free = FreeState.empty(arrays)
        for view in self.views.values():
            free.take_all(arrays.index, view.tasks)
        self.arrays, self.free = arrays, free
        return free

    def problems(self) -> list[str]:
        """Every broken invariant, as readable lines (empty when all hold)."""
        snap = Snapshot(self.arrays, self.free, self.running(), QueueTree())
        out = validate_free(snap)
        on_node: dict[str, set[str]] = {}
        for job_id, view in self.views.items():
            for t in view.tasks:
                on_node.setdefault(t.node, set()).add(job_id)
        if on_node != self.on_node:
            out.append("the index of jobs per node differs from the held views")
        want = usage_by_user(self.views.values())
        for key in sorted(set(want) | set(self.usage)):
            w, g = want.get(key, ZERO), self.usage.get(key, ZERO)
            if any(abs(a - b) > _USAGE_TOLERANCE for a, b in zip(w, g, strict=True)):
                out.append(f"usage of queue {key[0]} user {key[1]} drifted: {g} vs {w}")
        return out

    def _add_usage(self, view: RunningJob, sign: float) -> None:
        key = (view.job.queue, view.job.account)
        self.usage[key] = add_usage(self.usage.get(key, ZERO), view.usage, sign)

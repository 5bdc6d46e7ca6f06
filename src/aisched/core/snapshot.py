"""The cluster as the core sees it: static node arrays, free capacity, running and pending work.

`ClusterArrays` is built once per cluster shape and never changes. `FreeState` holds what is
free on each node and each GPU; callers keep one up to date incrementally (`take`/`give`) so a
cycle need not rebuild it from the running tasks. A cycle never mutates the `FreeState` it is
given: it works on a copy.

Invariant (checked by `validate_free`): free = capacity − Σ running tasks, per node and per GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from aisched.core.decisions import TaskBinding
from aisched.core.taskmix import TaskMix
from aisched.model.cluster import Cluster, Node, TopologyLevel
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.model.resources import GPU_MILLI_WHOLE

# (milli_cpu, mem_mib, gpu_milli): three numbers, kept as a plain tuple because numpy's
# per-call overhead dominates on vectors this small.
Usage = tuple[float, float, float]
ZERO: Usage = (0.0, 0.0, 0.0)


def add_usage(a: Usage, b: Usage, sign: float = 1.0) -> Usage:
    return (a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2])


IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

# Entries of a FreeState's change log before it starts a new generation (see FreeState).
CHANGE_LOG_LIMIT = 4096


# Entries a cluster's memo keeps: far more than one cycle's distinct shapes and queues need.
MEMO_ENTRIES = 65_536


class BoundedMemo(dict[object, object]):
    """A dict that drops its oldest entry when a new one would pass `limit` entries. A memo
    entry is only ever a shortcut, so dropping one costs a recomputation, never an answer."""

    __slots__ = ("limit",)

    def __init__(self, limit: int = MEMO_ENTRIES) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: object, value: object) -> None:
        if key not in self and len(self) >= self.limit:
            del self[next(iter(self))]
        super().__setitem__(key, value)

    def setdefault(self, key: object, default: object = None) -> object:
        if key not in self:
            self[key] = default
        return self[key]


@dataclass(frozen=True, slots=True, eq=False)
class ClusterArrays:
    """Per-node static facts as arrays indexed by node position (nodes sorted by name)."""

    cluster: Cluster
    names: tuple[str, ...]
    index: dict[str, int]
    cap_cpu: IntArray
    cap_mem: IntArray
    num_gpus: IntArray
    gpu_valid: BoolArray  # (nodes, max_gpus): True where the node has that GPU index
    gpu_mem_cap: IntArray  # (nodes, max_gpus)
    nvlink: IntArray  # (nodes, max_gpus)
    model_code: IntArray  # index into `models`, -1 for CPU-only nodes
    models: tuple[str, ...]
    rack: IntArray  # index into `racks`
    racks: tuple[str, ...]
    zone: IntArray
    zones: tuple[str, ...]
    healthy: BoolArray
    nodes: tuple[Node, ...]
    cap_rdma: IntArray
    # Memo of pure functions of this (static) cluster, e.g. "can this shape ever fit";
    # bounded, so a long-running service that sees ever new shapes does not grow with them.
    memo: dict[object, object] = field(default_factory=lambda: BoundedMemo())

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def max_gpus(self) -> int:
        return int(self.gpu_valid.shape[1])

    def domain(self, level: TopologyLevel) -> IntArray:
        """Domain id of every node at `level` (node index, rack, zone or 0 for the cluster)."""
        if level == TopologyLevel.NODE:
            return np.arange(self.num_nodes, dtype=np.int64)
        if level == TopologyLevel.RACK:
            return self.rack
        if level == TopologyLevel.ZONE:
            return self.zone
        return np.zeros(self.num_nodes, dtype=np.int64)

    def domain_name(self, level: TopologyLevel, idx: int) -> str:
        if level == TopologyLevel.NODE:
            return self.names[idx]
        if level == TopologyLevel.RACK:
            return self.racks[idx]
        if level == TopologyLevel.ZONE:
            return self.zones[idx]
        return "cluster"

    def totals(self) -> tuple[int, int, int]:
        """Cluster capacity as (milli_cpu, mem_mib, gpu_milli) over healthy nodes."""
        h = self.healthy
        return (
            int(self.cap_cpu[h].sum()),
            int(self.cap_mem[h].sum()),
            int(self.num_gpus[h].sum()) * GPU_MILLI_WHOLE,
        )


def build_arrays(cluster: Cluster) -> ClusterArrays:
    nodes = tuple(sorted(cluster.nodes, key=lambda n: n.name))
    n = len(nodes)
    g = max((len(x.gpus) for x in nodes), default=0)
    g = max(g, 1)  # keep 2-D arrays non-degenerate on CPU-only clusters
    models = tuple(sorted({x.gpu_model for x in nodes if x.gpu_model is not None}))
    racks = tuple(sorted({x.rack for x in nodes}))
    zones = tuple(sorted({x.zone for x in nodes}))
    model_idx = {m: i for i, m in enumerate(models)}
    rack_idx = {r: i for i, r in enumerate(racks)}
    zone_idx = {z: i for i, z in enumerate(zones)}
    gpu_valid = np.zeros((n, g), dtype=np.bool_)
    gpu_mem = np.zeros((n, g), dtype=np.int64)
    nvlink = np.zeros((n, g), dtype=np.int64)
    for i, node in enumerate(nodes):
        for gpu in node.gpus:
            if not 0 <= gpu.index < g:
                raise ValueError(f"node {node.name}: GPU index {gpu.index} out of range")
            gpu_valid[i, gpu.index] = True
            gpu_mem[i, gpu.index] = gpu.mem_mib
            nvlink[i, gpu.index] = gpu.nvlink_group
    return ClusterArrays(
        cluster=cluster,
        names=tuple(x.name for x in nodes),
        index={x.name: i for i, x in enumerate(nodes)},
        cap_cpu=np.array([x.milli_cpu for x in nodes], dtype=np.int64),
        cap_mem=np.array([x.mem_mib for x in nodes], dtype=np.int64),
        num_gpus=gpu_valid.sum(axis=1).astype(np.int64),
        gpu_valid=gpu_valid,
        gpu_mem_cap=gpu_mem,
        nvlink=nvlink,
        model_code=np.array(
            [model_idx[x.gpu_model] if x.gpu_model is not None else -1 for x in nodes],
            dtype=np.int64,
        ),
        models=models,
        rack=np.array([rack_idx[x.rack] for x in nodes], dtype=np.int64),
        racks=racks,
        zone=np.array([zone_idx[x.zone] for x in nodes], dtype=np.int64),
        zones=zones,
        healthy=np.array([x.healthy for x in nodes], dtype=np.bool_),
        nodes=nodes,
        cap_rdma=np.array([x.rdma for x in nodes], dtype=np.int64),
    )


@dataclass(slots=True, eq=False)
class FreeState:
    """Free capacity per node and per GPU. Mutable; `copy()` before tentative work.

    Every change goes through `take`/`give`, which log the node (`changed`), so a cache of
    something derived per node (placement's fit counts) updates only the nodes changed since
    it last looked. The log is bounded: past CHANGE_LOG_LIMIT entries it starts again with a
    new `generation`, and a cache of an older generation recomputes in full.
    """

    cpu: IntArray
    mem: IntArray
    gpu_milli: IntArray  # (nodes, max_gpus); 0 where the GPU does not exist
    gpu_mem: IntArray  # (nodes, max_gpus)
    whole: IntArray  # GPUs per node with nothing allocated on them
    gpu_total: IntArray  # free milli-GPU per node, summed over its GPUs
    rdma: IntArray  # free RDMA devices per node
    changed: list[int] = field(default_factory=list, repr=False)
    generation: int = 0

    @classmethod
    def empty(cls, arrays: ClusterArrays) -> FreeState:
        milli = np.where(arrays.gpu_valid, GPU_MILLI_WHOLE, 0).astype(np.int64)
        return cls(
            cpu=arrays.cap_cpu.copy(),
            mem=arrays.cap_mem.copy(),
            gpu_milli=milli,
            gpu_mem=arrays.gpu_mem_cap.copy(),
            whole=arrays.num_gpus.copy(),
            gpu_total=milli.sum(axis=1),
            rdma=arrays.cap_rdma.copy(),
        )

    def copy(self) -> FreeState:
        return FreeState(
            self.cpu.copy(),
            self.mem.copy(),
            self.gpu_milli.copy(),
            self.gpu_mem.copy(),
            self.whole.copy(),
            self.gpu_total.copy(),
            self.rdma.copy(),
        )

    def take(self, node: int, t: TaskBinding) -> None:
        self._apply(node, t, -1)

    def give(self, node: int, t: TaskBinding) -> None:
        self._apply(node, t, +1)

    def take_all(self, index: Mapping[str, int], tasks: Iterable[TaskBinding]) -> None:
        """Take every binding of `tasks`, each on its node (`index`: node name -> row)."""
        for t in tasks:
            self._apply(index[t.node], t, -1)

    def given_back(self, index: Mapping[str, int], tasks: Iterable[TaskBinding]) -> FreeState:
        """A new state: this one with every binding of `tasks` given back, added up in bulk
        (a what-if over many tasks at once; the copy starts with an empty change log)."""
        out = self.copy()
        nodes: list[int] = []
        cpu: list[int] = []
        mem: list[int] = []
        rdma: list[int] = []
        gpu_at: tuple[list[int], list[int]] = ([], [])
        milli: list[int] = []
        gpu_mem: list[int] = []
        for t in tasks:
            n = index[t.node]
            nodes.append(n)
            cpu.append(t.milli_cpu)
            mem.append(t.mem_mib)
            rdma.append(t.rdma)
            k = len(t.gpus)
            if k:
                gpu_at[0].extend([n] * k)
                gpu_at[1].extend(t.gpus)
                milli.extend([t.gpu_milli] * k)
                gpu_mem.extend([t.gpu_mem_mib // k] * k)
        np.add.at(out.cpu, nodes, cpu)
        np.add.at(out.mem, nodes, mem)
        np.add.at(out.rdma, nodes, rdma)
        np.add.at(out.gpu_milli, gpu_at, milli)
        np.add.at(out.gpu_mem, gpu_at, gpu_mem)
        out.whole = (out.gpu_milli == GPU_MILLI_WHOLE).sum(axis=1)
        out.gpu_total = out.gpu_milli.sum(axis=1)
        return out

    def _apply(self, node: int, t: TaskBinding, sign: int) -> None:
        if len(self.changed) >= CHANGE_LOG_LIMIT:
            self.changed = []
            self.generation += 1
        self.changed.append(node)
        self.cpu[node] += sign * t.milli_cpu
        self.mem[node] += sign * t.mem_mib
        if t.rdma:
            self.rdma[node] += sign * t.rdma
        if not t.gpus:
            return
        row = self.gpu_milli[node]
        mem_row = self.gpu_mem[node]
        self.gpu_total[node] += sign * t.gpu_milli * len(t.gpus)
        per_gpu_mem = t.gpu_mem_mib // len(t.gpus)
        if t.gpu_milli == GPU_MILLI_WHOLE:
            # Whole GPUs: each is whole before a take and after a give, and nothing before a
            # give and after a take (validate mode checks the counts against the shares).
            # One GPU at a time: cheaper than numpy's fancy indexing for a task's few GPUs.
            step = sign * GPU_MILLI_WHOLE
            for g in t.gpus:
                row[g] += step
            if per_gpu_mem:
                for g in t.gpus:
                    mem_row[g] += sign * per_gpu_mem
            self.whole[node] += sign * len(t.gpus)
            return
        for gi in t.gpus:
            was_whole = row[gi] == GPU_MILLI_WHOLE
            row[gi] += sign * t.gpu_milli
            mem_row[gi] += sign * per_gpu_mem
            now_whole = row[gi] == GPU_MILLI_WHOLE
            self.whole[node] += int(now_whole) - int(was_whole)

    def within(self, other: FreeState) -> bool:
        """Whether every free amount here is at most `other`'s, node for node and GPU for GPU
        (the same cluster): whatever does not fit `other` does not fit this state either."""
        if self.gpu_milli.shape != other.gpu_milli.shape:
            return False
        return bool(
            (self.gpu_total <= other.gpu_total).all()  # first: what a job's end gives back
            and (self.cpu <= other.cpu).all()
            and (self.mem <= other.mem).all()
            and (self.gpu_milli <= other.gpu_milli).all()
            and (self.gpu_mem <= other.gpu_mem).all()
            and (self.rdma <= other.rdma).all()
        )

    def equals(self, other: FreeState) -> bool:
        return (
            np.array_equal(self.cpu, other.cpu)
            and np.array_equal(self.mem, other.mem)
            and np.array_equal(self.gpu_milli, other.gpu_milli)
            and np.array_equal(self.gpu_mem, other.gpu_mem)
            and np.array_equal(self.whole, other.whole)
            and np.array_equal(self.gpu_total, other.gpu_total)
            and np.array_equal(self.rdma, other.rdma)
        )


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting to run, with what the caller knows about it now.

    `estimate_s` / `estimate_upper_s` come from the user or a predictor (attached before the
    cycle; the core never predicts). `attained_gpu_s` is GPU-service received in earlier
    attempts (Tiresias' attained service).
    """

    job: Job
    attained_gpu_s: float = 0.0
    restarts: int = 0
    estimate_s: float | None = None
    estimate_upper_s: float | None = None
    id: str = field(init=False, repr=False, compare=False)  # the job's id, read very often

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", self.job.id)

    @property
    def runtime_bound_s(self) -> float | None:
        """The longest this job is expected to run: the upper estimate, else the estimate
        (attached, else the user's), else its time limit; None when nothing bounds it."""
        for v in (
            self.estimate_upper_s,
            self.estimate_s,
            self.job.estimate_s,
            self.job.time_limit_s,
        ):
            if v is not None:
                return v
        return None


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding resources: its tasks, when this attempt started, when it should end.

    Fixed for the whole attempt, so a caller can keep one object per running job rather than
    rebuild it every cycle: what grows with time is derived from `now` (`attained_at`,
    `checkpoint_at`). `attained_gpu_s` is GPU-service received before this attempt.
    `last_checkpoint_s`, when the caller knows it, overrides the periodic estimate from
    `checkpoint_interval_s`; with neither, the attempt's start counts as its checkpoint.
    `terminating`: a live executor is already stopping it (preempted or cancelled, within its
    grace period); it still holds its resources but is never chosen as a victim again.
    `waited_end_s`: the end the bound it waited with gives, when its caller calibrated a new
    bound as the attempt started (the simulator and the service with `calib_refresh`); None
    when the two are the same. Only the backlog's drain time may read it
    (`Enqueue.backlog_bound`); everything else reads `expected_end_s`.
    """

    job: Job
    tasks: tuple[TaskBinding, ...]
    started_s: float
    attained_gpu_s: float = 0.0
    expected_end_s: float | None = None
    last_checkpoint_s: float | None = None
    checkpoint_interval_s: float | None = None
    terminating: bool = False
    waited_end_s: float | None = None
    # (milli_cpu, mem_mib, gpu_milli) held, summed once: every cycle reads it.
    usage: Usage = field(init=False, repr=False, compare=False)
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", self.job.id)
        cpu = mem = gpu = 0.0
        for t in self.tasks:
            cpu += t.milli_cpu
            mem += t.mem_mib
            gpu += t.gpu_milli * len(t.gpus)
        object.__setattr__(self, "usage", (cpu, mem, gpu))

    def attained_at(self, now: float) -> float:
        """GPU-seconds received up to `now`, this attempt included."""
        return self.attained_gpu_s + self.usage[2] / GPU_MILLI_WHOLE * max(
            now - self.started_s, 0.0
        )

    def checkpoint_at(self, now: float) -> float:
        """Time of the last checkpoint at or before `now`."""
        if self.last_checkpoint_s is not None:
            return self.last_checkpoint_s
        ck = self.checkpoint_interval_s
        if ck is None or ck <= 0 or now <= self.started_s:
            return self.started_s
        return self.started_s + ((now - self.started_s) // ck) * ck


# What an entry of a running log says of its view (true when the view came): GONE, ADDED
# (last in the running order), or IN_PLACE: it replaced the job's view logged GONE just before
# it (the same attempt changed, e.g. now terminating), where that view stood in the order.
GONE, ADDED, IN_PLACE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class RunningChanges:
    """Where a caller's log of running views stood at a snapshot: `log` holds every view
    that came (ADDED, IN_PLACE) and went (GONE) since the list was started, in order, and
    its first `upto` entries lead to the snapshot's running set. A caller bounds it by
    starting a new list, never by clearing one. A reader that followed the same list to an
    earlier point applies `log[seen:upto]` to what it kept rather than compare whole running
    sets; any other reader compares whole sets."""

    log: list[tuple[RunningJob, int]]
    upto: int


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """What a cycle sees. `usage`, when the caller keeps it, is the running jobs' usage summed
    per (queue, user); it must equal that sum (validate mode checks), and saves the cycle an
    O(running) pass. `task_mix`, when the caller keeps one, is the distribution of task GPU
    shapes seen so far (for the fragmentation score); without it that score uses the running and
    pending jobs of the cycle. `changes`, when the caller keeps a log of the running set, says
    what changed in it (`RunningChanges`)."""

    arrays: ClusterArrays
    free: FreeState
    running: tuple[RunningJob, ...] = ()
    queues: QueueTree = field(default_factory=QueueTree)
    usage: Mapping[tuple[str, str], Usage] | None = None
    task_mix: TaskMix | None = None
    changes: RunningChanges | None = None

    def user_usage(self) -> Mapping[tuple[str, str], Usage]:
        """The running usage per (queue, user): the caller's `usage`, else summed now."""
        return self.usage if self.usage is not None else usage_by_user(self.running)


def usage_by_user(running: Iterable[RunningJob]) -> dict[tuple[str, str], Usage]:
    """Running usage summed per (queue, user's account), the form `Snapshot.usage` takes: the
    user is the job's `account` key (`model.job.account_key`), so that two accounts that had
    one name (one deleted, its name given to another) are counted apart."""
    out: dict[tuple[str, str], Usage] = {}
    for r in running:
        key = (r.job.queue, r.job.account)
        out[key] = add_usage(out.get(key, ZERO), r.usage)
    return out


def free_from_running(arrays: ClusterArrays, running: Iterable[RunningJob]) -> FreeState:
    free = FreeState.empty(arrays)
    for r in running:
        free.take_all(arrays.index, r.tasks)
    return free


def snapshot_of(
    cluster: Cluster | ClusterArrays,
    running: Iterable[RunningJob] = (),
    queues: QueueTree | None = None,
) -> Snapshot:
    """A snapshot whose free state is derived from the running jobs (simple, O(tasks))."""
    arrays = cluster if isinstance(cluster, ClusterArrays) else build_arrays(cluster)
    running = tuple(running)
    return Snapshot(arrays, free_from_running(arrays, running), running, queues or QueueTree())


def validate_free(snapshot: Snapshot) -> list[str]:
    """Problems with the snapshot's free state: over-allocation or drift from the tasks."""
    want = free_from_running(snapshot.arrays, snapshot.running)
    got = snapshot.free
    problems: list[str] = []
    a = snapshot.arrays
    for name, w, g in (
        ("cpu", want.cpu, got.cpu),
        ("mem", want.mem, got.mem),
        ("gpu_milli", want.gpu_milli, got.gpu_milli),
        ("gpu_mem", want.gpu_mem, got.gpu_mem),
        ("whole", want.whole, got.whole),
        ("gpu_total", want.gpu_total, got.gpu_total),
        ("rdma", want.rdma, got.rdma),
    ):
        if not np.array_equal(w, g):
            bad = np.argwhere(w != g)[0]
            problems.append(f"free {name} drifted on node {a.names[int(bad[0])]}")
    for name, arr in (
        ("cpu", got.cpu),
        ("mem", got.mem),
        ("gpu_milli", got.gpu_milli),
        ("rdma", got.rdma),
    ):
        if (arr < 0).any():
            bad = np.argwhere(arr < 0)[0]
            problems.append(f"{name} over-allocated on node {a.names[int(bad[0])]}")
    return problems

"""Property tests of the scheduling core (STYLE.md, Tests 5 and 6).

Hypothesis draws small clusters (1–8 nodes, 0–8 GPUs each, 1–3 racks, 1–2 GPU models), a
queue tree, a running set (made by a first fifo cycle on the empty cluster, so it is one the
core itself could have produced) and 1–15 pending jobs, and every preset policy must then:

- never over-allocate a node, a GPU or a queue's limit;
- give a gang all of its tasks (at least `gang_min`) or none, with the requested resources
  and inside its topology constraints;
- pick victims that were running, are preemptible and rank below the job they make room for;
- honour reservations, and leave waiting only jobs that really do not fit;
- leave the input snapshot untouched, and `Statement.discard()` restore the session exactly;
- give the same decisions for the same input, whatever the order of the pending list;
- say something about every pending job, and NEVER_FITS exactly of the jobs that cannot fit
  the empty cluster;
- pass its own validate mode.

The checks that read one cycle's result share one example (`test_one_cycle_...`): generating
an example costs more than checking it, and the file has to stay fast. A failure names the
`check_*` function that caught it.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from aisched.core.actions.preempt import Preempt as PreemptAction
from aisched.core.cycle import CycleResult, run_cycle
from aisched.core.decisions import Reserve, TaskBinding
from aisched.core.eviction import evict, shrink
from aisched.core.placement import place_job
from aisched.core.plugins.order import Las, PredictedGpuTime
from aisched.core.plugins.victims import LeastWorkLost, time_left_s
from aisched.core.policy import PRESETS, Policy, preset
from aisched.core.reservation import find_reservation
from aisched.core.session import Session
from aisched.core.snapshot import (
    FreeState,
    PendingJob,
    RunningJob,
    Snapshot,
    snapshot_of,
    validate_free,
)
from aisched.core.statement import Statement
from aisched.core.status import StatusCode
from aisched.model.cluster import Cluster, TopologyLevel
from aisched.model.job import Job, TopologyMode
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import GPU_MILLI_WHOLE, Dim, Resources
from aisched.testing import cluster, job, node

POLICIES = (
    "fifo",
    "fifo-strict",
    "fifo-backfill",
    "priority",
    "drf",
    "las",
    "sjf",
    "qssf",
    "qssf-backfill",
    "sjf-oracle",
    "srtf-oracle",
    "default",
    "fgd",
    "bestfit",
    "worstfit",
    "dotprod",
    "random",
    "hetero",
)
assert set(POLICIES) == set(PRESETS), "a preset was added or removed: update POLICIES"

MODELS = ("A100", "H100")
SETTINGS = settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------


def packed(**fields: Sequence[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Several fields from one integer draw (mixed radix), each an option of its table.

    Hypothesis pays per draw, and one draw per field made generation cost more than the
    cycles under test. Shrinking still works: smaller integers mean earlier options, so each
    table lists its plainest option first.
    """
    tables = list(fields.items())

    def decode(n: int) -> dict[str, Any]:
        out = {}
        for name, options in tables:
            n, digit = divmod(n, len(options))
            out[name] = options[digit]
        return out

    return st.integers(0, math.prod(len(o) for _, o in tables) - 1).map(decode)


_NODE = packed(
    gpus=(8, 4, 8, 0, 2, 8, 1, 6, 3, 5, 7),  # 0–8, mostly full boxes
    rack=(0, 1, 2),  # modulo the cluster's rack count
    model=(0, 1),  # modulo the cluster's model count
    gpu_gib=(80, 16),
    nvlink=(4, 2, 8),
    cores=(64, 32, 8, 2),
    mem_gib=(512, 64, 8),
    healthy=(True,) * 11 + (False,),
)
_CLUSTER = st.tuples(st.integers(1, 2), st.integers(1, 3), st.sampled_from(tuple(range(1, 9))))

_QUEUE = packed(
    guarantee=(Resources(), Resources(gpu=2), Resources(gpu=8), Resources(milli_cpu=16_000)),
    limit=(None, None, None, Resources(gpu=4), Resources(gpu=16), Resources()),
    # The resources a limit names: None, those above 0 in it; GPU, a limit of `{gpus: 0}`
    # keeps the queue off GPUs (with `Resources()`).
    limit_named=(None, None, frozenset({Dim.GPU})),
    borrowing=(True, True, True, False),
)
_QUEUES = st.tuples(st.lists(_QUEUE, min_size=1, max_size=3), st.booleans())

# One draw per job: see `packed`.
_JOB = packed(
    # elastic: a gang of `tasks` that runs with min_available (default 1) up to all of them.
    shape=("whole", "whole", "share", "gang", "gang", "ps-workers", "elastic"),
    tasks=(2, 3, 4),  # gang size (ps-workers: one ps and tasks-1 workers)
    # Whole GPUs per task (0–8, mostly few); a share task takes (this+1)/10 of a GPU.
    gpu=(1, 0, 2, 1, 4, 2, 8, 1, 3, 5, 6, 7),
    cpu=(1, 0, 0.5, 2, 4, 16),
    mem_gib=(1, 0, 4, 16, 64),
    gpu_mem=(False, False, True),
    # Priority 0–20, with ties common enough that "strictly lower" is put to the test.
    priority=(0, 10, 5, 20, 1, 10, 0, 3, 15, 7, 20, 12),
    queue=(0, 1, 2) * 6 + (None,),  # index modulo the tree's size; None: unknown
    user=("alice", "bob"),
    submit_s=(0.0, 1.0, 2.0, 3.0, 4.0, 5.0),
    estimate_s=(None, None, 60.0, 600.0, 3600.0, 36_000.0),
    time_limit_s=(None, None, None, None, 100.0, 10_000.0),
    preemptible=(True,) * 5 + (False,),
    gpu_models=((), (), (), ("A100",), ("H100",), ("T4",), ("A100", "H100")),
    topology=(  # gangs only
        None,
        None,
        None,
        ("pack", TopologyLevel.RACK, TopologyMode.REQUIRED),
        ("pack", TopologyLevel.RACK, TopologyMode.PREFERRED),
        ("pack", TopologyLevel.NODE, TopologyMode.REQUIRED),
        ("spread", TopologyLevel.NODE),
        ("spread", TopologyLevel.RACK),
    ),
    min_available=(None, None, 1, 2, 3),  # gangs only, capped at the gang size
    attained_gpu_s=(0.0, 0.0, 100.0, 5000.0, 50_000.0),
    caller_estimate_s=(None, None, None, 30.0, 7200.0),
)
_RUN = packed(
    started_s=(0.0, 500.0, 1000.0, 30_000.0),  # capped at now
    runtime_s=(None, 500.0, 5000.0, 1e6),
    checkpoint_after_s=(None, 0.0, 100.0),
    attained_gpu_s=(0.0, 1000.0, 10_000.0, 100_000.0),
)
# Counts drawn uniformly (Hypothesis favours small integers and short lists, and then few
# examples have a busy cluster); the first option is what shrinking goes to.
_FIRST = st.sampled_from((0, *range(1, 11)))  # jobs offered to the first cycle
_PENDING = st.sampled_from(tuple(range(1, 16)))
_NOW = st.sampled_from((0.0, 1000.0, 40_000.0))


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    n_models, n_racks, n_nodes = draw(_CLUSTER)
    specs = draw(st.lists(_NODE, min_size=n_nodes, max_size=n_nodes))
    nodes = []
    for i, f in enumerate(specs):
        rack = f["rack"] % n_racks
        b = node(f"n{i}").rack(f"r{rack}").zone("z1" if rack == 2 else "z0")
        b.cpus(f["cores"]).mem_gib(f["mem_gib"])
        if f["gpus"]:
            model = MODELS[f["model"] % n_models]
            b.gpus(f["gpus"], model=model, mem_gib=f["gpu_gib"], nvlink_group_size=f["nvlink"])
        if not f["healthy"]:
            b.unhealthy()
        nodes.append(b)
    return cluster(*nodes)


def accepted(f: dict[str, Any]) -> dict[str, Any]:
    """A queue's fields as a tree accepts them: one that may not borrow without a guarantee
    borrows, and a limit below the guarantee on GPUs is raised to it."""
    guarantee, limit = f["guarantee"], f["limit"]
    borrowing = f["borrowing"] or guarantee.is_zero()
    if limit is not None and limit.gpu < guarantee.gpu:
        limit = replace(limit, gpu=guarantee.gpu)
    return {**f, "borrowing": borrowing, "limit": limit}


@st.composite
def queue_trees(draw: st.DrawFn) -> QueueTree:
    specs, nested = draw(_QUEUES)
    return QueueTree(
        tuple(
            # The third queue may sit below the second, to exercise hierarchical usage.
            Queue(f"q{i}", parent="q1" if i == 2 and nested else "root", **accepted(f))
            for i, f in enumerate(specs)
        )
    )


def make_job(
    job_id: str, x: dict[str, Any], queues: Sequence[str], running: bool = False
) -> PendingJob:
    """The job a packed draw describes. Jobs that will be running get a lower priority, so
    that pending ones often outrank them and preemption is exercised (ties still happen)."""
    shape, gpu, cpu, mem = x["shape"], x["gpu"], x["cpu"], x["mem_gib"]
    b = job(job_id)
    if shape == "whole":
        b.task(gpu=gpu, cpu=cpu, mem_gib=mem, gpu_mem_gib=20 * gpu if x["gpu_mem"] else 0)
    elif shape == "share":
        milli = min(100 * (gpu + 1), 900)
        b.task(gpu_milli=milli, cpu=cpu, mem_gib=mem, gpu_mem_gib=8 if x["gpu_mem"] else 0)
    elif shape in ("gang", "elastic"):
        b.task(x["tasks"], gpu=gpu, cpu=cpu, mem_gib=mem, name="worker")
    else:
        b.task(1, cpu=cpu, mem_gib=mem, name="ps")
        b.task(x["tasks"] - 1, gpu=gpu // 2, cpu=cpu, mem_gib=mem, name="worker")
    q = x["queue"]
    b.priority(x["priority"] // 2 if running else x["priority"]).queue(
        "nope" if q is None else queues[q % len(queues)]
    )
    b.user(x["user"]).submitted(x["submit_s"])
    if x["estimate_s"] is not None:
        b.estimate(x["estimate_s"])
    if x["time_limit_s"] is not None:
        b.time_limit(x["time_limit_s"])
    if not x["preemptible"]:
        b.not_preemptible()
    if x["gpu_models"]:
        b.models(*x["gpu_models"])
    if shape == "elastic":
        b.elastic().min_available(min(x["min_available"] or 1, x["tasks"] - 1))
    elif shape in ("gang", "ps-workers"):
        topo = x["topology"]
        if topo is not None and topo[0] == "pack":
            b.pack(topo[1], topo[2])
        elif topo is not None:
            b.spread(topo[1])
        if x["min_available"] is not None:
            b.min_available(min(x["min_available"], x["tasks"]))
    return PendingJob(
        b.build(), attained_gpu_s=x["attained_gpu_s"], estimate_s=x["caller_estimate_s"]
    )


@dataclass(frozen=True)
class Scenario:
    cluster: Cluster
    queues: QueueTree
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]
    now: float

    def snapshot(self) -> Snapshot:
        return snapshot_of(self.cluster, self.running, self.queues)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    # Sizes first: Hypothesis's mutations tend to cut draws late in an example short.
    n_first, n_pending = draw(_FIRST), draw(_PENDING)
    c = draw(clusters())
    queues = draw(queue_trees())
    names = [q.name for q in queues.queues]
    now = draw(_NOW)
    # A running set the core could have produced: a first fifo cycle on the empty cluster.
    first = [
        make_job(f"r{i}", s, names, running=True) for i, s in enumerate(draw(jobs_of(n_first)))
    ]
    placed = run_cycle(snapshot_of(c, (), queues), first, policy_of("fifo"), 0.0)
    by_id = {p.id: p.job for p in first}
    running = []
    for b in placed.binds:
        f = draw(_RUN)
        started = min(f["started_s"], now)
        running.append(
            RunningJob(
                by_id[b.job_id],
                b.tasks,
                started_s=started,
                attained_gpu_s=f["attained_gpu_s"],
                expected_end_s=None if f["runtime_s"] is None else started + f["runtime_s"],
                last_checkpoint_s=(
                    None if f["checkpoint_after_s"] is None else started + f["checkpoint_after_s"]
                ),
            )
        )
    pending = tuple(make_job(f"p{i}", s, names) for i, s in enumerate(draw(jobs_of(n_pending))))
    return Scenario(c, queues, tuple(running), pending, now)


@functools.cache
def jobs_of(n: int) -> st.SearchStrategy[list[dict[str, Any]]]:
    # A count drawn first and then a list of exactly that size: plain lists favour very short
    # ones, and then hardly any example has contention.
    return st.lists(_JOB, min_size=n, max_size=n)


@functools.cache
def policy_of(name: str) -> Policy:
    return preset(name)


def cycle(
    scn: Scenario,
    policy: str,
    *,
    snapshot: Snapshot | None = None,
    pending: Sequence[PendingJob] | None = None,
    validate: bool = False,
) -> CycleResult:
    return run_cycle(
        snapshot if snapshot is not None else scn.snapshot(),
        scn.pending if pending is None else pending,
        policy_of(policy),
        scn.now,
        validate=validate,
    )


def running_after(scn: Scenario, result: CycleResult) -> tuple[RunningJob, ...]:
    """The running set once the cycle's decisions are applied: victims out, shrunk jobs on
    the tasks they keep, binds in."""
    victims = {p.job_id for p in result.preempts}
    shrunk = {d.job_id: d.keep for d in result.shrinks}
    jobs_by_id = {p.id: p.job for p in scn.pending}
    kept = [
        replace(r, tasks=shrunk[r.id]) if r.id in shrunk else r
        for r in scn.running
        if r.id not in victims
    ]
    new = [RunningJob(jobs_by_id[b.job_id], b.tasks, started_s=scn.now) for b in result.binds]
    return (*kept, *new)


def usage(tasks: Sequence[TaskBinding]) -> np.ndarray:
    return np.array(
        [
            sum(t.milli_cpu for t in tasks),
            sum(t.mem_mib for t in tasks),
            sum(t.gpu_milli * len(t.gpus) for t in tasks),
        ],
        dtype=np.int64,
    )


def governed(r: Resources) -> np.ndarray:
    return np.array([r.milli_cpu, r.mem_mib, r.gpu_equivalent_milli], dtype=np.int64)


def caps_of(q: Queue) -> list[np.ndarray]:
    """What `q`'s usage may not go above, as `governed` vectors with -1 where nothing is
    capped: its limit on the resources it names (a 0 among them), and its guarantee on those
    it guarantees some of when it may not borrow."""
    caps = [(q.limit, q.limit_caps())] if q.limit is not None else []
    if not q.borrowing:
        caps.append((q.guarantee, q.guarantees()))
    return [
        np.array([v if Dim(i) in dims else -1 for i, v in enumerate(cap.per_dim())])
        for cap, dims in caps
    ]


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


def check_never_over_allocates(scn: Scenario, result: CycleResult) -> None:
    """Victims out and binds in, no node, GPU or queue limit is over capacity, and every GPU
    index bound is a real GPU of its node."""
    pending_ids = {p.id for p in scn.pending}
    assert {b.job_id for b in result.binds} <= pending_ids
    after = running_after(scn, result)
    arrays = scn.snapshot().arrays
    for r in after:
        for t in r.tasks:
            i = arrays.index[t.node]
            assert len(set(t.gpus)) == len(t.gpus), (r.id, t)
            for g in t.gpus:
                assert 0 <= g < arrays.max_gpus and arrays.gpu_valid[i, g], (r.id, t)
    snap = snapshot_of(scn.cluster, after, scn.queues)
    assert validate_free(snap) == []
    free = snap.free
    assert (free.gpu_mem >= 0).all()
    assert (free.gpu_milli <= np.where(arrays.gpu_valid, GPU_MILLI_WHOLE, 0)).all()
    # Queue limits (and guarantees of queues that may not borrow) hold, descendants included.
    per_queue: dict[str, np.ndarray] = {}
    for r in after:
        if not scn.queues.has(r.job.queue):
            continue
        for q in scn.queues.path(r.job.queue):
            per_queue[q] = per_queue.get(q, np.zeros(3, dtype=np.int64)) + usage(r.tasks)
    for q in scn.queues.queues:
        used = per_queue.get(q.name, np.zeros(3, dtype=np.int64))
        for c in caps_of(q):
            assert np.all((c < 0) | (used <= c)), (q.name, used, c)


def check_gangs_get_all_their_tasks_or_none(scn: Scenario, result: CycleResult) -> None:
    """A bound job has gang_min..num_tasks tasks with distinct indices per group, each with
    its group's request, on healthy nodes of an allowed model, inside one domain of a required
    `pack` level and on distinct domains of its `spread` level; a job not bound has no
    bindings, and its status says so."""
    arrays = scn.snapshot().arrays
    jobs_by_id = {p.id: p.job for p in scn.pending}
    bound_ids = [b.job_id for b in result.binds]
    assert len(bound_ids) == len(set(bound_ids)), "a job was bound twice"
    for b in result.binds:
        j = jobs_by_id[b.job_id]
        assert j.gang_min <= len(b.tasks) <= j.num_tasks, (j.id, len(b.tasks))
        groups = {g.name: g for g in j.groups}
        for g in j.groups:
            idx = [t.index for t in b.tasks if t.group == g.name]
            assert len(idx) == len(set(idx)), (j.id, g.name, idx)
            assert all(0 <= i < g.replicas for i in idx), (j.id, g.name, idx)
        for t in b.tasks:
            req = groups[t.group].request  # KeyError: a binding for a group the job lacks
            assert (t.milli_cpu, t.mem_mib, t.gpu_mem_mib) == (
                req.milli_cpu,
                req.mem_mib,
                req.gpu_mem_mib,
            )
            if req.gpu:
                assert (len(t.gpus), t.gpu_milli) == (req.gpu, GPU_MILLI_WHOLE), (j.id, t)
            elif req.gpu_milli:
                assert (len(t.gpus), t.gpu_milli) == (1, req.gpu_milli), (j.id, t)
            else:
                assert t.gpus == (), (j.id, t)
            n = arrays.nodes[arrays.index[t.node]]
            assert n.healthy, (j.id, t.node)
            if j.gpu_models:
                assert n.gpu_model in j.gpu_models, (j.id, t.node)
        topo = j.topology
        where = [arrays.index[t.node] for t in b.tasks]
        if topo.pack is not None and topo.mode == TopologyMode.REQUIRED:
            assert len({int(arrays.domain(topo.pack)[i]) for i in where}) == 1, (j.id, topo)
        if topo.spread is not None:  # at most one task of the job per domain, groups together
            ds = [int(arrays.domain(topo.spread)[i]) for i in where]
            assert len(ds) == len(set(ds)), (j.id, topo, [t.node for t in b.tasks])
    bound = set(bound_ids)
    for p in scn.pending:
        placed = result.diagnostics[p.id].code.is_placed
        assert placed == (p.id in bound), (p.id, result.diagnostics[p.id])


def check_victims_rank_below_the_job_they_make_room_for(
    scn: Scenario, result: CycleResult, policy: str
) -> None:
    """Victims were running, are preemptible, were not bound now, and rank strictly below the
    job they make room for: under las by LAS queue, under srtf-oracle by remaining GPU-time and
    under qssf by predicted remaining GPU-time (with its margin, lost work and minimum run),
    cluster-wide; under priority and default
    by priority inside the queue, and a victim in another queue comes from reclaim."""
    was_running = {r.id: r for r in scn.running}
    pending = {p.id: p for p in scn.pending}
    binds = {b.job_id: b for b in result.binds}
    victims = [p.job_id for p in result.preempts]
    actions = policy_of(policy).action_names()
    assert len(victims) == len(set(victims)), "a job was preempted twice"
    if "preempt" not in actions and "reclaim" not in actions:
        assert victims == []
    first_order = policy_of(policy).order[0]
    for p in result.preempts:
        v = was_running.get(p.job_id)
        assert v is not None, f"victim {p.job_id} was not running"
        assert v.job.preemptible, p
        assert p.job_id not in binds, p
        assert p.for_job in binds and p.job_id in binds[p.for_job].after, p
        pj = pending[p.for_job]
        if policy == "las":
            assert isinstance(first_order, Las)
            # A running job's attained service includes its current attempt.
            attained = v.attained_at(scn.now)
            theirs = first_order.key(v.job, attained, None)
            mine = first_order.key(pj.job, pj.attained_gpu_s, pj.estimate_s)
            assert theirs > mine, (p, attained, pj.attained_gpu_s)
        elif policy == "srtf-oracle":
            # Cluster-wide, by remaining GPU-time: a running job's is the time to its end, or
            # once past it, as long again as it has run.
            # The blocked job is judged by its runtime bound, as running ones are (`bound:
            # upper`, the default): its upper estimate, else its estimate, else its time limit.
            left = time_left_s(v, scn.now)
            theirs = first_order.key(v.job, v.attained_at(scn.now), left)
            mine = first_order.key(pj.job, pj.attained_gpu_s, pj.runtime_bound_s)
            assert theirs > mine, (p, left, pj.runtime_bound_s)
        elif policy == "qssf":
            # Cluster-wide, by predicted remaining GPU-time (to the victim's bound) less the work
            # it loses and its restart's cost, above `factor` times the job's own GPU-time by
            # its bound, both with the order's aging, and only after the victim's minimum run.
            pre = next(a for a in policy_of(policy).actions if isinstance(a, PreemptAction))
            assert isinstance(first_order, PredictedGpuTime)
            assert scn.now - v.started_s >= pre.min_run_of(v), (p, v.started_s)
            size = first_order.size_key(v.job, time_left_s(v, scn.now))
            size -= LeastWorkLost().key(v, scn.now) if pre.count_lost_work else 0.0
            size -= pre.restart_cost_s * max(v.usage[2] / 1000.0, 1.0)
            theirs = first_order.key_of_size(size, v.job)
            bound = pj.runtime_bound_s if pre.bound == "upper" else pj.estimate_s
            mine = first_order.size_key(pj.job, bound) * pre.factor
            assert theirs > first_order.key_of_size(mine, pj.job), (p, theirs, mine)
        elif v.job.queue != pj.job.queue:
            assert "reclaim" in actions, p
        elif policy in ("priority", "default"):
            assert v.job.priority < pj.job.priority, (p, v.job.priority, pj.job.priority)
        else:
            pytest.fail(f"{policy}: victim {p.job_id} in the same queue as {p.for_job}")
    # Shrunk jobs: running elastic jobs, preemptible, neither bound nor evicted now, that keep
    # min_available or more of their own tasks, for a bound job of equal or higher priority in
    # their queue (preempt) or in another queue (reclaim, or preempt with scope cluster).
    shrunk = [d.job_id for d in result.shrinks]
    assert len(shrunk) == len(set(shrunk)), "a job was shrunk twice"
    assert not set(shrunk) & set(victims), "a job was shrunk and evicted"
    if "preempt" not in actions and "reclaim" not in actions:
        assert shrunk == []
    for d in result.shrinks:
        v = was_running.get(d.job_id)
        assert v is not None and v.job.elastic and v.job.preemptible, d
        assert d.job_id not in binds, d
        assert v.job.gang_min <= len(d.keep) < len(v.tasks), d
        assert set(d.keep) < set(v.tasks), d
        assert d.for_job in binds and d.job_id in binds[d.for_job].after, d
        pj = pending[d.for_job]
        pre = next((a for a in policy_of(policy).actions if isinstance(a, PreemptAction)), None)
        if v.job.queue != pj.job.queue:
            assert "reclaim" in actions or (pre is not None and pre.scope == "cluster"), d
        else:
            assert v.job.priority <= pj.job.priority, (d, v.job.priority, pj.job.priority)
    for b in result.binds:
        assert sorted(b.after) == sorted(
            [p.job_id for p in result.preempts if p.for_job == b.job_id]
            + [d.job_id for d in result.shrinks if d.for_job == b.job_id]
        )


def check_reservations_are_honoured(scn: Scenario, result: CycleResult) -> None:
    """Reservations never share a node and start no earlier than now; at a reservation's start,
    its tasks still fit beside all that is then still running: the running jobs that do not end
    (by their expected end) before it, and every job bound in the cycle that does not (by its
    runtime bound). So work beside a reservation never delays it."""
    pending = {p.id: p for p in scn.pending}
    arrays = scn.snapshot().arrays
    held: set[str] = set()
    for d in result.decisions:
        if not isinstance(d, Reserve):
            continue
        assert not set(d.nodes) & held, d
        held |= set(d.nodes)
        assert d.start_s is None or d.start_s >= scn.now, d
        assert sorted({t.node for t in d.tasks}) == sorted(d.nodes), d
        start = d.start_s
        if start is None:
            continue
        at_start = FreeState.empty(arrays)
        bound_ends: dict[str, float | None] = {}
        for b in result.binds:
            bound = pending[b.job_id].runtime_bound_s
            bound_ends[b.job_id] = None if bound is None else scn.now + bound
        for r in running_after(scn, result):
            end = bound_ends.get(r.id, r.expected_end_s)
            if end is None or end > start:
                for t in r.tasks:
                    at_start.take(arrays.index[t.node], t)
        for t in d.tasks:
            at_start.take(arrays.index[t.node], t)
        for name in ("cpu", "mem", "gpu_milli", "gpu_mem", "rdma"):
            assert (getattr(at_start, name) >= 0).all(), (d, name)


def check_waiting_jobs_do_not_fit(scn: Scenario, result: CycleResult, policy: str) -> None:
    """Without evictions capacity only shrinks during a cycle, so a job left waiting for
    resources does not fit what is left either (cached failures must be sound). Only for jobs
    of one task group: whether such a job fits grows with the room it is given, while a gang
    of several groups is placed greedily, group by group, and may fit a smaller room that
    leads its first group elsewhere (`test_gang_group_order.py` has such a case)."""
    if result.preempts or result.shrinks:
        return
    left = snapshot_of(scn.cluster, running_after(scn, result), scn.queues)
    for pj in scn.pending:
        if len(pj.job.groups) > 1:
            continue
        if result.diagnostics[pj.id].code == StatusCode.WAIT_RESOURCES:
            session = Session(left, policy_of(policy), scn.now, (pj,))
            placed = place_job(session, Statement(session), pj.job)
            assert isinstance(placed, str), (pj.id, result.diagnostics[pj.id])


def check_snapshot_unchanged(snap: Snapshot, free_before: FreeState, scn: Scenario) -> None:
    """The cycle worked on a copy: the input's FreeState arrays are bit-identical."""
    for name in ("cpu", "mem", "gpu_milli", "gpu_mem", "whole", "gpu_total", "rdma"):
        a, b = getattr(snap.free, name), getattr(free_before, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    assert snap.running == scn.running


def check_every_job_has_a_diagnostic(scn: Scenario, result: CycleResult) -> None:
    assert set(result.diagnostics) == {p.id for p in scn.pending}


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(scn=scenarios())
def test_one_cycle_keeps_every_invariant(policy: str, scn: Scenario) -> None:
    """The properties that read one cycle's result, checked on the same example (generating
    an example costs more than checking it). validate mode is on and must never raise."""
    snap = scn.snapshot()
    free_before = copy.deepcopy(snap.free)
    result = cycle(scn, policy, snapshot=snap, validate=True)
    check_snapshot_unchanged(snap, free_before, scn)
    check_every_job_has_a_diagnostic(scn, result)
    check_never_over_allocates(scn, result)
    check_gangs_get_all_their_tasks_or_none(scn, result)
    check_victims_rank_below_the_job_they_make_room_for(scn, result, policy)
    check_reservations_are_honoured(scn, result)
    check_waiting_jobs_do_not_fit(scn, result, policy)


def has_surplus(scn: Scenario) -> bool:
    """Some running elastic job holds more than its min_available tasks (could be shrunk)."""
    return any(r.job.elastic and len(r.tasks) > r.job.gang_min for r in scn.running)


@pytest.mark.parametrize("policy", ["default", "priority", "las"])
@settings(SETTINGS, suppress_health_check=list(HealthCheck))
@given(scn=scenarios())
def test_elastic_jobs_shrink_within_their_bounds(policy: str, scn: Scenario) -> None:
    """The one-cycle properties again, on examples where an elastic job could be shrunk (few
    of the general examples have one)."""
    assume(has_surplus(scn))
    result = cycle(scn, policy, validate=True)
    check_never_over_allocates(scn, result)
    check_gangs_get_all_their_tasks_or_none(scn, result)
    check_victims_rank_below_the_job_they_make_room_for(scn, result, policy)


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(scn=scenarios(), data=st.data())
def test_statement_discard_restores_the_session(
    policy: str, scn: Scenario, data: st.DataObject
) -> None:
    session = Session(scn.snapshot(), policy_of(policy), scn.now, scn.pending)
    arrays = session.arrays
    free_before = session.free.copy()
    running_before = dict(session.running)
    usage_before = {q.name: np.array(session.usage_of(q.name)) for q in scn.queues.queues}
    st_ = Statement(session)
    ops = data.draw(
        st.lists(st.sampled_from(("take", "give", "place", "evict", "shrink")), max_size=8)
    )
    for op in ops:
        if op == "take":
            i = data.draw(st.integers(0, arrays.num_nodes - 1))
            real = np.flatnonzero(arrays.gpu_valid[i]).tolist()
            gpus = tuple(data.draw(st.lists(st.sampled_from(real), unique=True))) if real else ()
            milli = data.draw(st.sampled_from((GPU_MILLI_WHOLE, 250))) if gpus else 0
            st_.take(
                i,
                TaskBinding(
                    "g",
                    0,
                    arrays.names[i],
                    gpus,
                    milli,
                    data.draw(st.integers(0, 8000)),
                    data.draw(st.integers(0, 4096)),
                    data.draw(st.sampled_from((0, 3000))),
                ),
            )
        elif op == "give" and session.running:
            r = data.draw(st.sampled_from(sorted(session.running)))
            for t in session.running[r].tasks:
                st_.give(arrays.index[t.node], t)
        elif op == "place":
            pj = data.draw(st.sampled_from(scn.pending))
            place_job(session, st_, pj.job)
        elif op == "evict" and session.running:
            r = data.draw(st.sampled_from(sorted(session.running)))
            evict(session, st_, session.running[r])
        elif op == "shrink" and session.running:
            r = data.draw(st.sampled_from(sorted(session.running)))
            run = session.running[r]
            shrink(session, st_, run, run.tasks[: data.draw(st.integers(1, len(run.tasks)))])
    st_.discard()
    assert session.free.equals(free_before)
    assert session.running == running_before
    for q, before in usage_before.items():
        assert np.array_equal(np.array(session.usage_of(q)), before), q


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(scn=scenarios(), data=st.data())
def test_same_input_same_decisions(policy: str, scn: Scenario, data: st.DataObject) -> None:
    snap = scn.snapshot()
    first = cycle(scn, policy, snapshot=snap)
    # Again on the same snapshot: what the first run memoised about the cluster must not
    # change the answer, and neither may validate mode.
    again = cycle(scn, policy, snapshot=snap, validate=True)
    assert again.decisions == first.decisions
    assert again.diagnostics == first.diagnostics
    assert again.stats == first.stats
    # A fresh snapshot and the pending list in another order: orderings are total.
    shuffled = data.draw(st.permutations(scn.pending))
    res = cycle(scn, policy, pending=shuffled)
    assert res.decisions == first.decisions
    assert res.diagnostics == first.diagnostics


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(scn=scenarios())
def test_never_fits_only_what_cannot_fit_the_empty_cluster(policy: str, scn: Scenario) -> None:
    result = cycle(scn, policy)
    empty = snapshot_of(scn.cluster, (), scn.queues)
    for p in scn.pending:
        never = result.diagnostics[p.id].code == StatusCode.NEVER_FITS
        # Judged without the core's own never_fits: the queue tree, then a placement try.
        assert never == (not fits_alone(scn, p, policy)), (p.id, result.diagnostics[p.id])
        if never:
            alone = run_cycle(empty, [p], policy_of(policy), scn.now)
            assert alone.diagnostics[p.id].code == StatusCode.NEVER_FITS, p.id
            assert alone.binds == ()


def fits_alone(scn: Scenario, pj: PendingJob, policy: str) -> bool:
    """Whether `pj` could run by itself on the empty cluster: its queue exists, and placement
    finds room for its gang cut to the most of its first tasks, at least its minimum, that no
    queue on its path caps (a job that may start with fewer tasks is charged for those)."""
    j, tree = pj.job, scn.queues
    if not tree.has(j.queue):
        return False
    caps = [c for name in tree.path(j.queue) for c in caps_of(tree.get(name))]
    for tasks in range(j.num_tasks, j.gang_min - 1, -1):
        first = first_tasks(j, tasks)
        need = governed(first.total_request)
        if not any(np.any((c >= 0) & (need > c)) for c in caps):
            session = Session(snapshot_of(scn.cluster, (), tree), policy_of(policy), scn.now, (pj,))
            return not isinstance(place_job(session, Statement(session), first), str)
    return False


def first_tasks(j: Job, tasks: int) -> Job:
    """`j` with its first `tasks` tasks, its groups in turn."""
    groups, left = [], tasks
    for g in j.groups:
        if left > 0:
            groups.append(replace(g, replicas=min(g.replicas, left)))
            left -= g.replicas
    return replace(j, groups=tuple(groups), min_available=min(j.gang_min, tasks))


def test_strategies_reach_the_interesting_cases() -> None:
    """The properties above mean little if no example preempts, reserves or refuses a job."""
    seen: set[str] = set()

    @settings(
        max_examples=80,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(scn=scenarios())
    def probe(scn: Scenario) -> None:
        for policy in ("default", "las"):
            res = cycle(scn, policy)
            for d in res.decisions:
                seen.add(type(d).__name__)
            seen.update(s.code.value for s in res.diagnostics.values())
            if any(len(d.tasks) > 1 for d in res.binds):
                seen.add("gang")

    @settings(
        max_examples=80,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scn=scenarios())
    def probe_elastic(scn: Scenario) -> None:
        assume(has_surplus(scn))
        seen.update(type(d).__name__ for d in cycle(scn, "default").decisions)

    probe()
    probe_elastic()
    for want in ("Bind", "Preempt", "Shrink", "Reserve", "gang", "never-fits", "wait-resources"):
        assert want in seen, f"no generated example reached {want}: {sorted(seen)}"


@SETTINGS
@given(scn=scenarios())
def test_a_reservation_starts_at_the_first_release_after_which_the_job_fits(
    scn: Scenario,
) -> None:
    """The reservation search (a GPU-count bound, then gallop and bisection) gives the same
    start as trying every number of releases in end order, smallest first."""
    session = Session(scn.snapshot(), policy_of("fifo-backfill"), scn.now, scn.pending)
    arrays = session.arrays
    releases = sorted(
        session.running.values(),
        key=lambda r: (
            math.inf if r.expected_end_s is None else r.expected_end_s,
            r.started_s,
            r.id,
        ),
    )
    for pj in scn.pending:
        found = find_reservation(session, pj.job)
        scan: float | None | str = "never"
        for k in range(len(releases) + 1):
            free = session.free.copy()
            for r in releases[:k]:
                for t in r.tasks:
                    free.give(arrays.index[t.node], t)
            with session.scratch(free):
                st_ = Statement(session)
                placed = place_job(session, st_, pj.job)
                st_.discard()
            if not isinstance(placed, str):
                end = scn.now if k == 0 else releases[k - 1].expected_end_s
                scan = None if end is None else max(end, scn.now)
                break
        assert (found.start_s if found is not None else "never") == scan, pj.id

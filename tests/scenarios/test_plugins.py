"""Scenario tables for the plugins: job orders (fifo, priority, las, sjf, drf) and placement
scores (binpack, spread, CPU-only off GPU nodes, topology locality, NVLink groups).

Each case runs one cycle and compares the whole decision tuple with `==` (bindings expanded to
full `TaskBinding`s from the job's requests) and the status code of every pending job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import running

from aisched.core.cycle import run_cycle
from aisched.core.decisions import Bind, Decision, TaskBinding
from aisched.core.framework import order_key
from aisched.core.plugins.order import Fifo, Las, Priority, ShortestFirst
from aisched.core.policy import Policy, build_policy, preset
from aisched.core.snapshot import PendingJob, RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.model.cluster import TopologyLevel
from aisched.model.resources import GPU_MILLI_WHOLE
from aisched.testing import NodeBuilder, cluster, job, node

PLACED, WAIT = StatusCode.PLACED, StatusCode.WAIT_RESOURCES


def allocate_only(*scores: Any, order: tuple[Any, ...] = ("fifo",)) -> Policy:
    return build_policy(
        {"actions": ["enqueue", "allocate"], "order": list(order), "score": list(scores)}
    )


@dataclass
class Case:
    name: str
    nodes: list[NodeBuilder]
    jobs: list[PendingJob]
    policy: str | Policy
    want: list[tuple[str, ...]]  # ("bind", job, "node:gpu,gpu", ...) per task, in order
    want_status: dict[str, StatusCode]  # every pending job's code
    running: list[RunningJob] = field(default_factory=list)
    now: float = 0.0


def expand(want: list[tuple[str, ...]], pending: list[PendingJob]) -> tuple[Decision, ...]:
    """Compact ("bind", job, "node:gpus", ...) rows as the full decisions they stand for: tasks
    fill the job's groups in order, with the group's request."""
    jobs = {p.id: p.job for p in pending}
    out: list[Decision] = []
    for kind, job_id, *where in want:
        assert kind == "bind"
        slots = [(g, i) for g in jobs[job_id].groups for i in range(g.replicas)]
        tasks = []
        for (g, i), spot in zip(slots[: len(where)], where, strict=True):
            node_name, _, gpu_list = spot.partition(":")
            gpus = tuple(int(x) for x in gpu_list.split(",")) if gpu_list else ()
            r = g.request
            share = GPU_MILLI_WHOLE if r.gpu else r.gpu_milli
            tasks.append(
                TaskBinding(
                    g.name,
                    i,
                    node_name,
                    gpus,
                    share if gpus else 0,
                    r.milli_cpu,
                    r.mem_mib,
                    r.gpu_mem_mib,
                )
            )
        out.append(Bind(job_id, tuple(tasks)))
    return tuple(out)


def one_gpu_jobs(*ids_submitted: tuple[str, float], **extra: float) -> list[PendingJob]:
    return [job(j).task(gpu=1).submitted(t).pending(**extra) for j, t in ids_submitted]


# --- job order -------------------------------------------------------------------------------

ORDER_CASES = [
    Case(
        "fifo: earliest submission first, ties by job id",
        [node("n1").gpus(2)],
        one_gpu_jobs(("late", 3.0), ("b", 1.0), ("a", 1.0)),
        "fifo",
        [("bind", "a", "n1:0"), ("bind", "b", "n1:1")],
        {"a": PLACED, "b": PLACED, "late": WAIT},
    ),
    Case(
        "fifo ignores priority",
        [node("n1").gpus(1)],
        [
            job("first").task(gpu=1).pending(),
            job("vip").task(gpu=1).priority(20).submitted(1).pending(),
        ],
        "fifo",
        [("bind", "first", "n1:0")],
        {"first": PLACED, "vip": WAIT},
    ),
    Case(
        "priority: highest first, then fifo",
        [node("n1").gpus(2)],
        [
            job("lo").task(gpu=1).priority(1).pending(),
            job("hi-late").task(gpu=1).priority(9).submitted(5).pending(),
            job("hi-early").task(gpu=1).priority(9).submitted(2).pending(),
        ],
        "priority",
        [("bind", "hi-early", "n1:0"), ("bind", "hi-late", "n1:1")],
        {"lo": WAIT, "hi-early": PLACED, "hi-late": PLACED},
    ),
    Case(
        "las: a job that passed a threshold goes after a fresh one submitted later",
        [node("n1").gpus(1)],
        [
            job("old").task(gpu=1).submitted(0).pending(attained_gpu_s=4000.0),
            job("fresh").task(gpu=1).submitted(50).pending(),
        ],
        "las",
        [("bind", "fresh", "n1:0")],
        {"old": WAIT, "fresh": PLACED},
    ),
    Case(
        "las: below the first threshold a job keeps its fifo place",
        [node("n1").gpus(1)],
        [
            job("old").task(gpu=1).submitted(0).pending(attained_gpu_s=3599.0),
            job("fresh").task(gpu=1).submitted(50).pending(),
        ],
        "las",
        [("bind", "old", "n1:0")],
        {"old": PLACED, "fresh": WAIT},
    ),
    Case(
        "las: reaching a threshold exactly counts as passing it",
        [node("n1").gpus(1)],
        [
            job("old").task(gpu=1).submitted(0).pending(attained_gpu_s=3600.0),
            job("fresh").task(gpu=1).submitted(50).pending(),
        ],
        "las",
        [("bind", "fresh", "n1:0")],
        {"old": WAIT, "fresh": PLACED},
    ),
    Case(
        "las: discretised queues 0 < 1 < 2, fifo inside a queue",
        [node("n1").gpus(3)],
        [
            job("q2").task(gpu=1).submitted(0).pending(attained_gpu_s=40_000.0),
            job("q1-early").task(gpu=1).submitted(1).pending(attained_gpu_s=30_000.0),
            job("q1-late").task(gpu=1).submitted(2).pending(attained_gpu_s=5_000.0),
            job("q0").task(gpu=1).submitted(3).pending(attained_gpu_s=10.0),
        ],
        "las",
        [("bind", "q0", "n1:0"), ("bind", "q1-early", "n1:1"), ("bind", "q1-late", "n1:2")],
        {"q0": PLACED, "q1-early": PLACED, "q1-late": PLACED, "q2": WAIT},
    ),
    Case(
        "las with custom thresholds from the policy",
        [node("n1").gpus(1)],
        [
            job("used-150").task(gpu=1).submitted(0).pending(attained_gpu_s=150.0),
            job("fresh").task(gpu=1).submitted(1).pending(),
        ],
        allocate_only("binpack", order=({"name": "las", "thresholds_gpu_s": [100]}, "fifo")),
        [("bind", "fresh", "n1:0")],
        {"used-150": WAIT, "fresh": PLACED},
    ),
    Case(
        "sjf: shortest estimate first",
        [node("n1").gpus(2)],
        [
            job("long").task(gpu=1).estimate(3600).pending(),
            job("short").task(gpu=1).estimate(60).submitted(2).pending(),
            job("mid").task(gpu=1).estimate(600).submitted(1).pending(),
        ],
        "sjf",
        [("bind", "short", "n1:0"), ("bind", "mid", "n1:1")],
        {"long": WAIT, "short": PLACED, "mid": PLACED},
    ),
    Case(
        "sjf: a job without an estimate goes after every estimated one",
        [node("n1").gpus(1)],
        [
            job("unknown").task(gpu=1).pending(),
            job("huge").task(gpu=1).estimate(1e6).submitted(9).pending(),
        ],
        "sjf",
        [("bind", "huge", "n1:0")],
        {"unknown": WAIT, "huge": PLACED},
    ),
    Case(
        "sjf: without any estimate it falls back to fifo",
        [node("n1").gpus(1)],
        one_gpu_jobs(("second", 2.0), ("first", 1.0)),
        "sjf",
        [("bind", "first", "n1:0")],
        {"first": PLACED, "second": WAIT},
    ),
    Case(
        "sjf: the caller's (predicted) estimate wins over the job's own",
        [node("n1").gpus(1)],
        [
            job("said-short").task(gpu=1).estimate(10).pending(estimate_s=5000.0),
            job("said-long").task(gpu=1).estimate(9000).submitted(1).pending(estimate_s=50.0),
        ],
        "sjf",
        [("bind", "said-long", "n1:0")],
        {"said-short": WAIT, "said-long": PLACED},
    ),
    Case(
        "sjf by gpu_time: a short wide job can rank after a longer narrow one",
        [node("n1").gpus(8)],
        [
            job("wide").task(gpu=8).estimate(100).pending(),
            job("narrow").task(gpu=1).estimate(500).submitted(1).pending(),
        ],
        allocate_only("binpack", order=({"name": "sjf", "by": "gpu_time"}, "fifo")),
        [("bind", "narrow", "n1:0")],
        {"wide": WAIT, "narrow": PLACED},
    ),
    Case(
        "drf: two users of one queue alternate by dominant share",
        [node("n1").gpus(4)],
        [job(f"a{i}").task(gpu=1).user("alice").submitted(i).pending() for i in range(4)]
        + [job(f"b{i}").task(gpu=1).user("bob").submitted(10 + i).pending() for i in range(4)],
        "drf",
        [
            ("bind", "a0", "n1:0"),
            ("bind", "b0", "n1:1"),
            ("bind", "a1", "n1:2"),
            ("bind", "b1", "n1:3"),
        ],
        {
            "a0": PLACED,
            "b0": PLACED,
            "a1": PLACED,
            "b1": PLACED,
            "a2": WAIT,
            "a3": WAIT,
            "b2": WAIT,
            "b3": WAIT,
        },
    ),
    Case(
        "fifo on the same input serves the first user only",
        [node("n1").gpus(4)],
        [job(f"a{i}").task(gpu=1).user("alice").submitted(i).pending() for i in range(4)]
        + [job(f"b{i}").task(gpu=1).user("bob").submitted(10 + i).pending() for i in range(4)],
        "fifo",
        [
            ("bind", "a0", "n1:0"),
            ("bind", "a1", "n1:1"),
            ("bind", "a2", "n1:2"),
            ("bind", "a3", "n1:3"),
        ],
        {
            "a0": PLACED,
            "a1": PLACED,
            "a2": PLACED,
            "a3": PLACED,
            "b0": WAIT,
            "b1": WAIT,
            "b2": WAIT,
            "b3": WAIT,
        },
    ),
    Case(
        "drf: a user with big jobs waits while the other catches up in share",
        [node("n1").gpus(8)],
        [job(f"a{i}").task(gpu=4).user("alice").submitted(i).pending() for i in range(2)]
        + [job(f"b{i}").task(gpu=1).user("bob").submitted(10 + i).pending() for i in range(5)],
        "drf",
        [
            ("bind", "a0", "n1:0,1,2,3"),
            ("bind", "b0", "n1:4"),
            ("bind", "b1", "n1:5"),
            ("bind", "b2", "n1:6"),
            ("bind", "b3", "n1:7"),
        ],
        {
            "a0": PLACED,
            "a1": WAIT,
            "b0": PLACED,
            "b1": PLACED,
            "b2": PLACED,
            "b3": PLACED,
            "b4": WAIT,
        },
    ),
    Case(
        "drf counts what a user already runs",
        [node("n1").gpus(4)],
        [
            job("a1").task(gpu=1).user("alice").pending(),
            job("b1").task(gpu=1).user("bob").submitted(5).pending(),
            job("b2").task(gpu=1).user("bob").submitted(6).pending(),
        ],
        "drf",
        [("bind", "b1", "n1:2"), ("bind", "b2", "n1:3")],
        {"a1": WAIT, "b1": PLACED, "b2": PLACED},
        running=[running(job("a0").task(gpu=2).user("alice").build(), ("n1", (0, 1)))],
    ),
]

# --- scores ----------------------------------------------------------------------------------

HALF_FULL = running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)))

SCORE_CASES = [
    Case(
        "binpack fills the fuller node",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("j").task(gpu=1).pending()],
        allocate_only("binpack"),
        [("bind", "j", "n1:4")],
        {"j": PLACED},
        running=[HALF_FULL],
    ),
    Case(
        "spread takes the emptier node",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("j").task(gpu=1).pending()],
        allocate_only("spread"),
        [("bind", "j", "n2:0")],
        {"j": PLACED},
        running=[HALF_FULL],
    ),
    Case(
        "binpack keeps a CPU-only job off a GPU node, even a fuller one",
        [node("n1").gpus(8), node("cpu1")],
        [job("prep").task(cpu=4).pending()],
        allocate_only("binpack"),
        [("bind", "prep", "cpu1")],
        {"prep": PLACED},
        running=[HALF_FULL],
    ),
    Case(
        "spread keeps a CPU-only job off a GPU node, even an emptier one",
        [node("n1").gpus(8), node("cpu1")],
        [job("prep").task(cpu=4).pending()],
        allocate_only("spread"),
        [("bind", "prep", "cpu1")],
        {"prep": PLACED},
        running=[running(job("busy").task(cpu=60).build(), ("cpu1", ()))],
    ),
    Case(
        "a CPU-only job still runs on a GPU node when nothing else has room",
        [node("n1").gpus(8), node("cpu1").cpus(2)],
        [job("prep").task(cpu=4).pending()],
        allocate_only("binpack"),
        [("bind", "prep", "n1")],
        {"prep": PLACED},
    ),
    Case(
        "topology: a 2x4-GPU gang goes onto one 8-GPU node when it can",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("g").gang(2, gpu=4).pending()],
        "fifo",  # binpack + topology
        [("bind", "g", "n2:0,1,2,3", "n2:4,5,6,7")],
        {"g": PLACED},
        running=[running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)))],
    ),
    Case(
        "without topology binpack splits that gang over the fuller node and another",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("g").gang(2, gpu=4).pending()],
        allocate_only("binpack"),
        [("bind", "g", "n1:4,5,6,7", "n2:0,1,2,3")],
        {"g": PLACED},
        running=[running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)))],
    ),
    Case(
        "topology: a gang that must span nodes stays inside one rack",
        [
            node("a1").gpus(8).rack("ra"),
            node("a2").gpus(8).rack("ra"),
            node("b1").gpus(8).rack("rb"),
            node("b2").gpus(8).rack("rb"),
        ],
        [job("g").gang(2, gpu=4).pending()],
        "fifo",
        [("bind", "g", "a1:4,5,6,7", "a2:4,5,6,7")],
        {"g": PLACED},
        running=[
            running(job("ra1").task(gpu=4).build(), ("a1", (0, 1, 2, 3))),
            running(job("ra2").task(gpu=4).build(), ("a2", (0, 1, 2, 3))),
            running(job("rb1").task(gpu=4, cpu=48).build(), ("b1", (0, 1, 2, 3))),
            running(job("rb2").task(gpu=8).build(), ("b2", tuple(range(8)))),
        ],
    ),
    Case(
        "without topology binpack takes the fullest nodes, across racks",
        [
            node("a1").gpus(8).rack("ra"),
            node("a2").gpus(8).rack("ra"),
            node("b1").gpus(8).rack("rb"),
            node("b2").gpus(8).rack("rb"),
        ],
        [job("g").gang(2, gpu=4).pending()],
        allocate_only("binpack"),
        [("bind", "g", "b1:4,5,6,7", "a1:4,5,6,7")],
        {"g": PLACED},
        running=[
            running(job("ra1").task(gpu=4).build(), ("a1", (0, 1, 2, 3))),
            running(job("ra2").task(gpu=4).build(), ("a2", (0, 1, 2, 3))),
            running(job("rb1").task(gpu=4, cpu=48).build(), ("b1", (0, 1, 2, 3))),
            running(job("rb2").task(gpu=8).build(), ("b2", tuple(range(8)))),
        ],
    ),
    Case(
        "topology: a rack-packed gang of four nodes takes the rack that holds it",
        [
            node("a1").gpus(8).rack("ra"),
            node("a2").gpus(8).rack("ra"),
            node("b1").gpus(8).rack("rb"),
            node("b2").gpus(8).rack("rb"),
            node("b3").gpus(8).rack("rb"),
        ],
        [job("g").gang(3, gpu=8).pack(TopologyLevel.RACK).pending()],
        "fifo",
        [("bind", "g", "b1:0,1,2,3,4,5,6,7", "b2:0,1,2,3,4,5,6,7", "b3:0,1,2,3,4,5,6,7")],
        {"g": PLACED},
    ),
    Case(
        "NVLink: two GPUs from the tightest group that holds them",
        [node("n1").gpus(8, nvlink_group_size=4)],
        [job("j").task(gpu=2).pending()],
        "fifo",
        [("bind", "j", "n1:2,3")],
        {"j": PLACED},
        running=[running(job("r").task(gpu=3).build(), ("n1", (0, 1, 4)))],
    ),
    Case(
        "NVLink: three GPUs from one group, not the lowest free indices",
        [node("n1").gpus(8, nvlink_group_size=4)],
        [job("j").task(gpu=3).pending()],
        "fifo",
        [("bind", "j", "n1:5,6,7")],
        {"j": PLACED},
        running=[running(job("r").task(gpu=3).build(), ("n1", (0, 1, 4)))],
    ),
    Case(
        "NVLink: when no group can hold the task it takes the lowest free GPUs",
        [node("n1").gpus(8, nvlink_group_size=4)],
        [job("j").task(gpu=4).pending()],
        "fifo",
        [("bind", "j", "n1:2,3,5,6")],
        {"j": PLACED},
        running=[running(job("r").task(gpu=3).build(), ("n1", (0, 1, 4)))],
    ),
    Case(
        "NVLink: each task of a gang on one node gets its own group",
        [node("n1").gpus(8, nvlink_group_size=4)],
        [job("g").gang(2, gpu=4).pending()],
        "fifo",
        [("bind", "g", "n1:0,1,2,3", "n1:4,5,6,7")],
        {"g": PLACED},
    ),
    Case(
        "a GPU share goes to the fullest GPU it fits on",
        [node("n1").gpus(2)],
        [job("s").task(gpu_milli=300).pending()],
        "fifo",
        [("bind", "s", "n1:1")],
        {"s": PLACED},
        running=[
            RunningJob(
                job("half").task(gpu_milli=500).build(),
                (TaskBinding("g0", 0, "n1", (1,), 500, 1000, 1024),),
                started_s=0.0,
            )
        ],
    ),
]


@pytest.mark.parametrize("case", ORDER_CASES + SCORE_CASES, ids=lambda c: c.name)
def test_plugin_scenarios(case: Case) -> None:
    snap = snapshot_of(cluster(*case.nodes), case.running)
    policy = preset(case.policy) if isinstance(case.policy, str) else case.policy
    result = run_cycle(snap, case.jobs, policy, case.now, validate=True)
    assert result.decisions == expand(case.want, case.jobs)
    assert {k: v.code for k, v in result.diagnostics.items()} == case.want_status


# --- order keys ------------------------------------------------------------------------------


@dataclass
class KeyCase:
    name: str
    plugin: Any
    job: Any
    attained_gpu_s: float
    estimate_s: float | None
    want: float


KEY_CASES = [
    KeyCase("fifo is the submit time", Fifo(), job("j").submitted(42).build(), 0.0, None, 42.0),
    KeyCase("priority is negated", Priority(), job("j").priority(7).build(), 0.0, None, -7.0),
    KeyCase("las queue 0 below the first threshold", Las(), job("j").build(), 3599.0, None, 0.0),
    KeyCase("las queue 1 at the first threshold", Las(), job("j").build(), 3600.0, None, 1.0),
    KeyCase("las queue 2 past the last", Las(), job("j").build(), 1e9, None, 2.0),
    KeyCase("las one threshold", Las((10.0,)), job("j").build(), 11.0, None, 1.0),
    KeyCase(
        "sjf uses the caller's estimate",
        ShortestFirst(),
        job("j").estimate(9).build(),
        0.0,
        3.0,
        3.0,
    ),
    KeyCase(
        "sjf falls back to the job's", ShortestFirst(), job("j").estimate(9).build(), 0.0, None, 9.0
    ),
    KeyCase(
        "sjf without estimate is last", ShortestFirst(), job("j").build(), 0.0, None, float("inf")
    ),
    KeyCase(
        "sjf gpu_time multiplies by GPUs",
        ShortestFirst("gpu_time"),
        job("j").gang(2, gpu=4).estimate(10).build(),
        0.0,
        None,
        80.0,
    ),
    KeyCase(
        "sjf gpu_time counts a CPU job as one GPU",
        ShortestFirst("gpu_time"),
        job("j").task(cpu=2).estimate(10).build(),
        0.0,
        None,
        10.0,
    ),
    KeyCase(
        "sjf gpu_time counts a share as one GPU",
        ShortestFirst("gpu_time"),
        job("j").task(gpu_milli=250).estimate(10).build(),
        0.0,
        None,
        10.0,
    ),
]


@pytest.mark.parametrize("case", KEY_CASES, ids=lambda c: c.name)
def test_order_keys(case: KeyCase) -> None:
    assert case.plugin.key(case.job, case.attained_gpu_s, case.estimate_s) == case.want


def test_order_key_is_total_with_the_tie_break() -> None:
    a = job("a").priority(1).submitted(5).build()
    b = job("b").priority(1).submitted(5).build()
    c = job("c").priority(2).submitted(9).build()
    orders = (Las(),)
    keys = sorted((order_key(orders, j, 0.0, None), j.id) for j in (b, a, c))
    # Same LAS queue: higher priority first, then submit time, then id.
    assert [k[1] for k in keys] == ["c", "a", "b"]
    assert order_key(orders, a, 0.0, None) == (0.0, -1, 5.0, "a")


def test_las_rejects_decreasing_thresholds() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Las((100.0, 10.0))


# --- spread across racks and across task groups ---------------------------------------------


def test_spread_over_racks_puts_one_task_per_rack() -> None:
    snap = snapshot_of(cluster(node("a1").gpus(8).rack("ra"), node("b1").gpus(8).rack("rb")))
    pending = [job("g").gang(2, gpu=1).spread(TopologyLevel.RACK).pending()]
    result = run_cycle(snap, pending, preset("fifo"), 0.0, validate=True)
    assert result.decisions == expand([("bind", "g", "a1:0", "b1:0")], pending)


def test_spread_over_nodes_counts_every_group_of_the_job() -> None:
    snap = snapshot_of(cluster(node("n1"), node("n2"), node("n3")))
    pending = [
        job("j").task(1, name="ps").task(2, name="worker").spread(TopologyLevel.NODE).pending()
    ]
    result = run_cycle(snap, pending, preset("fifo"), 0.0, validate=True)
    nodes = [t.node for b in result.binds for t in b.tasks]
    assert sorted(nodes) == ["n1", "n2", "n3"]


def test_spread_over_nodes_refuses_more_tasks_than_nodes() -> None:
    snap = snapshot_of(cluster(node("n1"), node("n2")))
    pending = [
        job("j").task(1, name="ps").task(2, name="worker").spread(TopologyLevel.NODE).pending()
    ]
    result = run_cycle(snap, pending, preset("fifo"), 0.0, validate=True)
    assert (result.decisions, result.diagnostics["j"].code) == ((), StatusCode.NEVER_FITS)


def test_random_placement_judges_each_job_alone_whatever_the_pending_order() -> None:
    """`random` draws per job: of two jobs of one shape, the greedy draw for p10 puts its
    1-GPU task on the only node its 2-GPU task could use, so p10 can never fit, while p11's
    draw fits.
    What placement learns (never fits, failures) must be kept per job under such a score, or
    the first job of the shape in the pending order decides for both."""
    snap = snapshot_of(
        cluster(
            node("n0").cpus(64).mem_gib(512).gpus(1),
            node("n1").cpus(8).mem_gib(8).gpus(1),
            node("n2").cpus(32).mem_gib(64).gpus(5),
        )
    )

    def pair(job_id: str) -> PendingJob:
        b = job(job_id).task(gpu=1, cpu=0.5, mem_gib=64).task(gpu=2, cpu=0.5, mem_gib=64)
        return b.pending()

    statuses = []
    for order in (["p10", "p11"], ["p11", "p10"]):
        result = run_cycle(snap, [pair(j) for j in order], preset("random"), 0.0, validate=True)
        statuses.append({k: s.code for k, s in result.diagnostics.items()})
    assert statuses[0] == statuses[1]
    assert statuses[0]["p10"] == StatusCode.NEVER_FITS
    assert statuses[0]["p11"].is_placed

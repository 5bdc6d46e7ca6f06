"""Scenario tables for each action: enqueue, allocate, preempt, reclaim, backfill."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from helpers import running, summary

from aisched.core.cycle import run_cycle
from aisched.core.policy import build_policy, preset
from aisched.core.snapshot import RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.model.cluster import TopologyLevel
from aisched.model.job import TopologyMode
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.testing import JobBuilder, NodeBuilder, cluster, job, node


@dataclass
class Case:
    name: str
    nodes: list[NodeBuilder]
    jobs: list[JobBuilder]
    policy: str
    want: list[tuple[str, ...]]
    want_status: dict[str, StatusCode] = field(default_factory=dict)
    running: list[RunningJob] = field(default_factory=list)
    queues: QueueTree = field(default_factory=QueueTree)
    now: float = 0.0


def two_racks() -> list[NodeBuilder]:
    return [
        node("a1").gpus(8).rack("ra"),
        node("a2").gpus(8).rack("ra"),
        node("b1").gpus(8).rack("rb"),
        node("b2").gpus(8).rack("rb"),
    ]


TEAMS = QueueTree(
    (
        Queue("research", guarantee=Resources(gpu=8)),
        Queue("prod", guarantee=Resources(gpu=8)),
        Queue("capped", limit=Resources(gpu=4)),
        Queue("strict", guarantee=Resources(gpu=2), borrowing=False),
    )
)

CASES = [
    # --- enqueue -------------------------------------------------------------------------
    Case(
        "enqueue refuses a task larger than any node",
        [node("n1").gpus(8)],
        [job("big").task(gpu=16)],
        "fifo",
        [],
        {"big": StatusCode.NEVER_FITS},
    ),
    Case(
        "enqueue refuses an unknown queue",
        [node("n1").gpus(8)],
        [job("j").task(gpu=1).queue("nope")],
        "fifo",
        [],
        {"j": StatusCode.NEVER_FITS},
    ),
    Case(
        "enqueue refuses a gang that no rack can hold when rack packing is required",
        two_racks(),
        [job("g").gang(3, gpu=8).pack(TopologyLevel.RACK)],
        "fifo",
        [],
        {"g": StatusCode.NEVER_FITS},
    ),
    Case(
        "enqueue refuses a job above its queue's limit on its own",
        [node("n1").gpus(8)],
        [job("j").task(gpu=8).queue("capped")],
        "fifo",
        [],
        {"j": StatusCode.NEVER_FITS},
        queues=TEAMS,
    ),
    Case(
        "a job that fits the limit waits while the queue is at its limit",
        [node("n1").gpus(8)],
        [job("j1").task(gpu=4).queue("capped"), job("j2").task(gpu=1).queue("capped").submitted(1)],
        "fifo",
        [("bind", "j1", "n1:0,1,2,3")],
        {"j1": StatusCode.PLACED, "j2": StatusCode.WAIT_QUEUE},
        queues=TEAMS,
    ),
    Case(
        "a queue that may not borrow stays within its guarantee",
        [node("n1").gpus(8)],
        [job("j1").task(gpu=2).queue("strict"), job("j2").task(gpu=1).queue("strict").submitted(1)],
        "fifo",
        [("bind", "j1", "n1:0,1")],
        {"j2": StatusCode.WAIT_QUEUE},
        queues=TEAMS,
    ),
    # --- allocate ------------------------------------------------------------------------
    Case(
        "allocate places a gang whole and picks concrete GPUs",
        two_racks(),
        [job("g").gang(2, gpu=4)],
        "fifo",
        [("bind", "g", "a1:0,1,2,3", "a1:4,5,6,7")],
    ),
    Case(
        "allocate leaves no trace of a gang that cannot be completed",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("g").gang(2, gpu=8), job("s").task(gpu=4).submitted(1)],
        "fifo",
        [("bind", "s", "n2:4,5,6,7")],
        {"g": StatusCode.WAIT_RESOURCES, "s": StatusCode.PLACED},
        running=[running(job("r").task(gpu=4).build(), ("n2", (0, 1, 2, 3)))],
    ),
    Case(
        "allocate keeps a rack-packed gang inside one rack",
        two_racks(),
        [job("g").gang(2, gpu=8).pack(TopologyLevel.RACK)],
        "fifo",
        [("bind", "g", "b1:0,1,2,3,4,5,6,7", "b2:0,1,2,3,4,5,6,7")],
        running=[running(job("r").task(gpu=4).build(), ("a1", (0, 1, 2, 3)))],
    ),
    Case(
        "a required rack gang waits when no rack has room, though the cluster does",
        two_racks(),
        [job("g").gang(2, gpu=8).pack(TopologyLevel.RACK)],
        "fifo",
        [],
        {"g": StatusCode.WAIT_RESOURCES},
        running=[
            running(job("r1").task(gpu=1).build(), ("a1", (0,))),
            running(job("r2").task(gpu=1).build(), ("b1", (0,))),
        ],
    ),
    Case(
        "a preferred rack gang spans racks when it must",
        two_racks(),
        [job("g").gang(2, gpu=8).pack(TopologyLevel.RACK, TopologyMode.PREFERRED)],
        "fifo",
        [("bind", "g", "a2:0,1,2,3,4,5,6,7", "b2:0,1,2,3,4,5,6,7")],
        running=[
            running(job("r1").task(gpu=1).build(), ("a1", (0,))),
            running(job("r2").task(gpu=1).build(), ("b1", (0,))),
        ],
    ),
    Case(
        "min_available lets an elastic gang start with fewer tasks",
        [node("n1").gpus(8)],
        [job("e").gang(4, gpu=4).min_available(2)],
        "fifo",
        [("bind", "e", "n1:0,1,2,3", "n1:4,5,6,7")],
    ),
    Case(
        "GPU-model constraint keeps a job off other models",
        [node("t4").gpus(4, model="T4"), node("v100").gpus(4, model="V100")],
        [job("j").task(gpu=2).models("V100")],
        "fifo",
        [("bind", "j", "v100:0,1")],
    ),
    Case(
        "an unhealthy node gets nothing",
        [node("n1").gpus(8).unhealthy(), node("n2").gpus(8)],
        [job("j").task(gpu=1)],
        "fifo",
        [("bind", "j", "n2:0")],
    ),
    # --- preempt -------------------------------------------------------------------------
    Case(
        "preempt evicts lower-priority work in the same queue",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=8).priority(10)],
        "priority",
        [("preempt", "lo", "hi"), ("bind", "hi", "n1:0,1,2,3,4,5,6,7")],
        {"hi": StatusCode.PREEMPTING},
        running=[running(job("lo").task(gpu=8).priority(1).build(), ("n1", tuple(range(8))))],
    ),
    Case(
        "preempt never evicts equal or higher priority",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=8).priority(10)],
        "priority",
        [],
        {"hi": StatusCode.WAIT_RESOURCES},
        running=[running(job("eq").task(gpu=8).priority(10).build(), ("n1", tuple(range(8))))],
    ),
    Case(
        "preempt spares a job that is not preemptible",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=8).priority(10)],
        "priority",
        [],
        {"hi": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("lo").task(gpu=8).priority(1).not_preemptible().build(),
                ("n1", tuple(range(8))),
            )
        ],
    ),
    Case(
        "preempt never picks a job that is already terminating, and picks another",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=4).priority(10)],
        "priority",
        [("preempt", "other", "hi"), ("bind", "hi", "n1:4,5,6,7")],
        {"hi": StatusCode.PREEMPTING},
        running=[
            replace(
                running(job("going").task(gpu=4).priority(1).build(), ("n1", (0, 1, 2, 3))),
                terminating=True,
            ),
            running(job("other").task(gpu=4).priority(2).build(), ("n1", (4, 5, 6, 7))),
        ],
    ),
    Case(
        "preempt waits rather than evict a job that is already terminating",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=8).priority(10)],
        "priority",
        [],
        {"hi": StatusCode.WAIT_RESOURCES},
        running=[
            replace(
                running(job("going").task(gpu=8).priority(1).build(), ("n1", tuple(range(8)))),
                terminating=True,
            )
        ],
    ),
    Case(
        "preempt stays inside the queue",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=8).priority(10).queue("prod")],
        "priority",
        [],
        {"hi": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("lo").task(gpu=8).priority(1).queue("research").build(),
                ("n1", tuple(range(8))),
            )
        ],
        queues=QueueTree((Queue("research"), Queue("prod"))),
    ),
    Case(
        "preempt evicts only as much as needed, the job that loses least work first",
        [node("n1").gpus(8)],
        [job("hi").task(gpu=4).priority(10)],
        "priority",
        [("preempt", "fresh", "hi"), ("bind", "hi", "n1:4,5,6,7")],
        running=[
            running(
                job("old").task(gpu=4).priority(1).build(),
                ("n1", (0, 1, 2, 3)),
                started_s=0,
                checkpoint_s=0,
            ),
            running(
                job("fresh").task(gpu=4).priority(1).build(),
                ("n1", (4, 5, 6, 7)),
                started_s=0,
                checkpoint_s=900,
            ),
        ],
        now=1000,
    ),
    Case(
        "las preempts a job that used more service for a fresh one",
        [node("n1").gpus(8)],
        [job("new").task(gpu=8).submitted(100)],
        "las",
        [("preempt", "long", "new"), ("bind", "new", "n1:0,1,2,3,4,5,6,7")],
        running=[
            RunningJob(
                job("long").task(gpu=8).build(),
                running(job("long").task(gpu=8).build(), ("n1", tuple(range(8)))).tasks,
                started_s=0,
                attained_gpu_s=8 * 3600.0,
            )
        ],
        now=3600,
    ),
    # --- reclaim -------------------------------------------------------------------------
    Case(
        "reclaim takes back capacity another queue borrowed",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [job("p").task(gpu=8).queue("prod")],
        "priority",
        [("preempt", "borrow", "p"), ("bind", "p", "n2:0,1,2,3,4,5,6,7")],
        {"p": StatusCode.PREEMPTING},
        running=[
            running(
                job("own").task(gpu=8).queue("research").priority(5).build(),
                ("n1", tuple(range(8))),
            ),
            running(
                job("borrow").task(gpu=8).queue("research").priority(5).build(),
                ("n2", tuple(range(8))),
            ),
        ],
        queues=TEAMS,
    ),
    Case(
        "reclaim does not touch a queue within its guarantee",
        [node("n1").gpus(8)],
        [job("p").task(gpu=8).queue("prod")],
        "priority",
        [],
        {"p": StatusCode.WAIT_RESOURCES},
        running=[
            running(job("own").task(gpu=8).queue("research").build(), ("n1", tuple(range(8))))
        ],
        queues=TEAMS,
    ),
    # --- node roles ------------------------------------------------------------------------
    Case(
        "node roles: CPU-only work goes to the CPU node, never to the GPU node's spare CPUs",
        [node("cpu").cpus(8).role("cpu"), node("gpu").gpus(8).role("gpu")],
        [
            job("front").task(cpu=6).submitted(1),
            job("more").task(cpu=6).submitted(2),
            job("model").task(gpu=2, cpu=4).submitted(3),
        ],
        "fifo",
        [("bind", "front", "cpu:"), ("bind", "model", "gpu:0,1")],
        {
            "front": StatusCode.PLACED,
            "more": StatusCode.WAIT_RESOURCES,
            "model": StatusCode.PLACED,
        },
    ),
    Case(
        "without roles the second CPU job takes the GPU node's spare CPUs",
        [node("cpu").cpus(8), node("gpu").gpus(8)],
        [job("front").task(cpu=6).submitted(1), job("more").task(cpu=6).submitted(2)],
        "fifo",
        [("bind", "front", "cpu:"), ("bind", "more", "gpu:")],
        {"front": StatusCode.PLACED, "more": StatusCode.PLACED},
    ),
    # --- rdma: a node resource like CPUs ----------------------------------------------------
    Case(
        "a task asking for RDMA goes only where an RDMA device is free",
        [node("plain").gpus(8), node("ib").gpus(8).rdma(2)],
        [
            job("a").task(gpu=1, rdma=1).submitted(1),
            job("b").task(2, gpu=1, rdma=1).submitted(2),
            job("c").task(gpu=1).submitted(3),
        ],
        "fifo",
        [("bind", "a", "ib:1"), ("bind", "c", "ib:2")],
        {"a": StatusCode.PLACED, "b": StatusCode.WAIT_RESOURCES, "c": StatusCode.PLACED},
        running=[running(job("r").task(gpu=1).build(), ("ib", (0,)))],
    ),
    # --- per-node caps on one app's instances (max_per_node) -------------------------------
    Case(
        "max_per_node 1 spreads a job's tasks one per node (binpack alone would stack them)",
        [node(f"n{i}").gpus(8).max_per_node(1) for i in range(1, 5)],
        [job("decode").task(4, gpu=1)],
        "fifo",
        [("bind", "decode", "n1:0", "n2:0", "n3:0", "n4:0")],
        {"decode": StatusCode.PLACED},
    ),
    Case(
        "a service's replicas count as one app; another app may share the node",
        [node("n1").gpus(8).max_per_node(1), node("n2").gpus(8).max_per_node(1)],
        [
            job("s-r2").task(gpu=1).replica_of("s").submitted(1),
            job("s-r3").task(gpu=1).replica_of("s").submitted(2),
            job("other").task(gpu=1).submitted(3),
        ],
        "fifo",
        [("bind", "s-r2", "n2:0"), ("bind", "other", "n1:1")],
        {
            "s-r2": StatusCode.PLACED,
            "s-r3": StatusCode.WAIT_RESOURCES,
            "other": StatusCode.PLACED,
        },
        running=[running(job("s-r1").task(gpu=1).replica_of("s").build(), ("n1", (0,)))],
    ),
    Case(
        "a gang wider than the caps allow can never fit",
        [node(f"n{i}").gpus(8).max_per_node(2) for i in range(1, 3)],
        [job("wide").task(5, gpu=1)],
        "fifo",
        [],
        {"wide": StatusCode.NEVER_FITS},
    ),
    # --- fit-first and strict fifo ---------------------------------------------------------
    Case(
        "fifo is fit-first: a later job that fits starts past a blocked one",
        [node("n1").gpus(8)],
        [job("big").task(gpu=8).submitted(1), job("small").task(gpu=2).submitted(2)],
        "fifo",
        [("bind", "small", "n1:4,5")],
        {"big": StatusCode.WAIT_RESOURCES, "small": StatusCode.PLACED},
        running=[running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)))],
    ),
    Case(
        "fifo-strict stops at the first job that does not fit",
        [node("n1").gpus(8)],
        [job("big").task(gpu=8).submitted(1), job("small").task(gpu=2).submitted(2)],
        "fifo-strict",
        [],
        {"big": StatusCode.WAIT_RESOURCES, "small": StatusCode.NOT_CONSIDERED},
        running=[running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)))],
    ),
    # --- backfill ------------------------------------------------------------------------
    Case(
        "backfill reserves for the blocked head and fills the hole with a short job",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [
            job("head").task(gpu=8).submitted(1),
            job("short").task(gpu=4).estimate(500).submitted(2),
        ],
        "fifo-backfill",
        [("reserve", "head", "n1"), ("bind", "short", "n1:4,5,6,7")],
        {"head": StatusCode.RESERVED, "short": StatusCode.PLACED},
        running=[
            running(job("r1").task(gpu=4).build(), ("n1", (0, 1, 2, 3)), expected_end_s=1000),
            running(job("r2").task(gpu=4).build(), ("n2", (0, 1, 2, 3)), expected_end_s=5000),
        ],
    ),
    Case(
        "backfill keeps a job that would overrun the reservation off the reserved node",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [
            job("head").task(gpu=8).submitted(1),
            job("long").task(gpu=4).estimate(5000).submitted(2),
        ],
        "fifo-backfill",
        [("reserve", "head", "n1"), ("bind", "long", "n2:4,5,6,7")],
        {"head": StatusCode.RESERVED, "long": StatusCode.PLACED},
        running=[
            running(job("r1").task(gpu=4).build(), ("n1", (0, 1, 2, 3)), expected_end_s=1000),
            running(job("r2").task(gpu=4).build(), ("n2", (0, 1, 2, 3)), expected_end_s=5000),
        ],
    ),
    Case(
        "backfill keeps a job without a runtime bound off reserved nodes",
        [node("n1").gpus(8)],
        [job("head").task(gpu=8).submitted(1), job("nobound").task(gpu=2).submitted(2)],
        "fifo-backfill",
        [("reserve", "head", "n1")],
        {"head": StatusCode.RESERVED, "nobound": StatusCode.WAIT_RESERVATION},
        running=[running(job("r1").task(gpu=4).build(), ("n1", (0, 1, 2, 3)), expected_end_s=900)],
    ),
    # A reservation holds the reserved job's GPUs and the CPU and memory that go with them,
    # not the node (the README's `aisched up --gpus 2` box: 2 cores, a 2-GPU job running).
    Case(
        "a CPU-only job and a CPU gang without runtime bounds run beside a GPU reservation",
        [node("n1").gpus(2).cpus(4).mem_gib(23.5)],
        [
            job("waits").task(gpu=1).submitted(1),
            job("cpu").task(cpu=1, mem_gib=10).submitted(2),
            job("gang").task(2, cpu=0.5, mem_gib=2).submitted(3),
        ],
        "default",
        [("reserve", "waits", "n1"), ("bind", "cpu", "n1:"), ("bind", "gang", "n1:", "n1:")],
        {
            "waits": StatusCode.RESERVED,
            "cpu": StatusCode.PLACED,
            "gang": StatusCode.PLACED,
        },
        running=[running(job("big").task(gpu=2).build(), ("n1", (0, 1)), expected_end_s=30)],
    ),
    Case(
        "a job beside a reservation may not take the CPU the reserved job needs at its start",
        [node("n1").gpus(2).cpus(2).mem_gib(23.5)],
        [
            job("waits").task(gpu=1, cpu=1).submitted(1),
            job("cpu").task(cpu=1).submitted(2),
            job("more").task(cpu=0.5).submitted(3),
        ],
        "default",
        [("reserve", "waits", "n1"), ("bind", "cpu", "n1:")],
        {
            "waits": StatusCode.RESERVED,
            "cpu": StatusCode.PLACED,
            "more": StatusCode.WAIT_RESERVATION,
        },
        running=[running(job("big").task(gpu=2, cpu=1).build(), ("n1", (0, 1)), expected_end_s=30)],
    ),
    Case(
        "a GPU job beside a reservation takes a GPU the reserved job leaves over",
        [node("n1").gpus(4)],
        [
            job("waits").task(gpu=3).submitted(1),
            job("one").task(gpu=1).submitted(2),
            job("two").task(gpu=1).submitted(3),
        ],
        "fifo-backfill",
        [("reserve", "waits", "n1"), ("bind", "one", "n1:3")],
        {
            "waits": StatusCode.RESERVED,
            "one": StatusCode.PLACED,
            "two": StatusCode.WAIT_RESERVATION,
        },
        running=[running(job("r").task(gpu=2).build(), ("n1", (0, 1)), expected_end_s=100)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_action_scenarios(case: Case) -> None:
    snap = snapshot_of(cluster(*case.nodes), case.running, case.queues)
    pending = [j.pending() for j in case.jobs]
    result = run_cycle(snap, pending, preset(case.policy), case.now, validate=True)
    assert summary(result) == case.want
    got = {k: result.diagnostics[k].code for k in case.want_status}
    assert got == case.want_status
    assert set(result.diagnostics) == {p.id for p in pending}


def test_reservation_carries_the_start_time_as_eta() -> None:
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)), expected_end_s=1200)],
    )
    res = run_cycle(snap, [job("head").task(gpu=8).pending()], preset("fifo-backfill"), 0.0)
    assert res.diagnostics["head"].eta_s == 1200
    assert res.reserves[0].start_s == 1200


def test_a_reservation_waiting_on_work_past_its_expected_end_has_no_eta() -> None:
    """Its start was `now` at every cycle ("estimated start now" for as long as the work ran
    over), where service.md promises no estimate; the reservation itself still starts now, for
    what it keeps back."""
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [running(job("r").task(gpu=4).build(), ("n1", (0, 1, 2, 3)), expected_end_s=1200)],
    )
    pending = [job("head").task(gpu=8).pending()]
    res = run_cycle(snap, pending, preset("fifo-backfill"), 1500.0)
    assert res.diagnostics["head"].eta_s is None
    assert res.diagnostics["head"].reason == "nodes reserved once running jobs end"
    assert res.reserves[0].start_s == 1500


@pytest.mark.parametrize("replica_end", [None, 5.0], ids=["no-end", "end-passed"])
def test_no_reservation_waits_for_a_services_replica_and_the_jobs_behind_start(
    replica_end: float | None,
) -> None:
    """A replica serves until its service scales down: a job that fits only once it has
    gone would hold its reservation from every other job for ever (from 'now', once a
    predicted end had passed: no job ends before now)."""
    replica = job("web-r1").task(gpu=2).replica_of("web").build()
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [running(replica, ("n1", (0, 1)), expected_end_s=replica_end)],
    )
    pending = [
        job("whole").task(gpu=8).pending(),
        job("short").task(gpu=1).submitted(1).pending(estimate_s=60),
    ]
    res = run_cycle(snap, pending, preset("default"), 100.0)
    assert summary(res) == [("bind", "short", "n1:2")]
    assert res.diagnostics["whole"].code == StatusCode.WAIT_RESOURCES


def test_queue_depth_cuts_the_list() -> None:
    policy = build_policy({"actions": ["enqueue", "allocate"], "queue_depth": 1})
    snap = snapshot_of(cluster(node("n1").gpus(8)))
    res = run_cycle(
        snap,
        [job("a").task(gpu=1).pending(), job("b").task(gpu=1).submitted(1).pending()],
        policy,
        0.0,
    )
    assert summary(res) == [("bind", "a", "n1:0")]
    assert res.diagnostics["b"].code == StatusCode.NOT_CONSIDERED


def test_drf_across_queues_shares_a_contended_cluster() -> None:
    queues = QueueTree((Queue("a"), Queue("b")))
    snap = snapshot_of(cluster(node("n1").gpus(4)), queues=queues)
    jobs = [job(f"a{i}").task(gpu=1).queue("a").submitted(i).pending() for i in range(4)]
    jobs += [job(f"b{i}").task(gpu=1).queue("b").submitted(10 + i).pending() for i in range(4)]
    res = run_cycle(snap, jobs, preset("fifo"), 0.0)
    placed = sorted(b.job_id for b in res.binds)
    assert placed == ["a0", "a1", "b0", "b1"]


def test_least_work_lost_counts_periodic_checkpoints() -> None:
    """Both started at 0; `hourly` checkpointed at 3600 and loses 400 s, `daily` loses 4000 s."""
    a = running(job("daily").task(gpu=4).priority(1).build(), ("n1", (0, 1, 2, 3)))
    b = running(job("hourly").task(gpu=4).priority(1).build(), ("n1", (4, 5, 6, 7)))
    victims = [
        RunningJob(a.job, a.tasks, 0.0, checkpoint_interval_s=86_400.0),
        RunningJob(b.job, b.tasks, 0.0, checkpoint_interval_s=3600.0),
    ]
    snap = snapshot_of(cluster(node("n1").gpus(8)), victims)
    res = run_cycle(snap, [job("hi").task(gpu=4).priority(9).pending()], preset("priority"), 4000.0)
    assert summary(res) == [("preempt", "hourly", "hi"), ("bind", "hi", "n1:4,5,6,7")]


def test_a_parent_queue_limit_holds_for_all_its_children() -> None:
    queues = QueueTree(
        (
            Queue("org", limit=Resources(gpu=8)),
            Queue("team-a", parent="org"),
            Queue("team-b", parent="org"),
            Queue("other"),
        )
    )
    snap = snapshot_of(
        cluster(node("n1").gpus(8), node("n2").gpus(8)),
        [running(job("a1").task(gpu=8).queue("team-a").build(), ("n1", tuple(range(8))))],
        queues,
    )
    pending = [
        job("b1").task(gpu=1).queue("team-b").pending(),
        job("o1").task(gpu=1).queue("other").submitted(1).pending(),
    ]
    res = run_cycle(snap, pending, preset("fifo"), 0.0, validate=True)
    assert summary(res) == [("bind", "o1", "n2:0")]
    assert res.diagnostics["b1"].code == StatusCode.WAIT_QUEUE
    assert res.diagnostics["b1"].reason == "queue org would exceed its GPU limit"


def test_hierarchical_fair_share_serves_the_emptier_parent_first() -> None:
    queues = QueueTree(
        (
            Queue("busy"),
            Queue("busy-child", parent="busy"),
            Queue("idle"),
            Queue("idle-child", parent="idle"),
        )
    )
    snap = snapshot_of(
        cluster(node("n1").gpus(8), node("n2").gpus(8)),
        [running(job("r").task(gpu=6).queue("busy-child").build(), ("n1", tuple(range(6))))],
        queues,
    )
    pending = [
        job("b").task(gpu=2).queue("busy-child").pending(),
        job("i").task(gpu=8).queue("idle-child").submitted(5).pending(),
    ]
    res = run_cycle(snap, pending, preset("fifo"), 0.0, validate=True)
    # "idle" has the lower dominant share, so its later job is placed first and takes n2.
    assert [b.job_id for b in res.binds] == ["i", "b"]


def test_a_tiny_cpu_job_behind_thousands_of_gpu_jobs_starts_beside_the_reservation() -> None:
    """The default preset, one 2-GPU box busy with a job of unknown length, 5,000 GPU jobs
    waiting: the head holds a reservation, and a 0.5-core job at the back of the queue still
    starts now (the reservation holds the head's GPU, CPU and memory, not the node)."""
    box = node("box").gpus(2).cpus(4).mem_gib(23.5)
    busy = running(job("busy").task(gpu=2).build(), ("box", (0, 1)))
    gpu_jobs = [job(f"g{i:04d}").task(gpu=1).submitted(1 + i).pending() for i in range(5000)]
    tiny = job("tiny").task(cpu=0.5, mem_gib=0.5).submitted(10_000).pending()
    snap = snapshot_of(cluster(box), [busy])
    result = run_cycle(snap, [*gpu_jobs, tiny], preset("default"), 0.0)
    assert summary(result) == [("reserve", "g0000", "box"), ("bind", "tiny", "box:")]
    assert result.diagnostics["g0000"].code == StatusCode.RESERVED
    assert {result.diagnostics[p.id].code for p in gpu_jobs[1:]} == {StatusCode.WAIT_RESERVATION}

"""Scenario tables for the policies that use runtime estimates: qssf order, shortest-remaining
preemption, starving-gang reservations without backfill, and the eta action."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import pytest
from helpers import running, summary

from aisched.core.cycle import run_cycle
from aisched.core.policy import PRESETS, Policy, PolicyError, build_policy, preset, with_eta
from aisched.core.snapshot import PendingJob, RunningJob, snapshot_of
from aisched.core.status import StatusCode
from aisched.testing import NodeBuilder, cluster, job, node


@dataclass
class Case:
    name: str
    nodes: list[NodeBuilder]
    pending: list[PendingJob]
    policy: str
    want: list[tuple[str, ...]]
    want_status: dict[str, StatusCode] = field(default_factory=dict)
    running: list[RunningJob] = field(default_factory=list)
    now: float = 0.0


HALF = (0, 1, 2, 3)
OTHER_HALF = (4, 5, 6, 7)
DAY = 86_400.0
HOUR = 3600.0
NOISY_NOW = 7120.509637180191  # (NOISY_NOW + 1200) - NOISY_NOW > 1200 in floats

CASES = [
    Case(
        "qssf orders by predicted GPU-time, not by runtime",
        [node("n1").gpus(8)],
        [
            job("wide").task(gpu=8).pending(estimate_s=100.0),  # 800 GPU-s
            job("narrow").task(gpu=1).submitted(1).pending(estimate_s=500.0),  # 500 GPU-s
        ],
        "qssf",
        [("bind", "narrow", "n1:0")],
        {"wide": StatusCode.WAIT_RESOURCES},
    ),
    Case(
        "qssf puts a job without an estimate last",
        [node("n1").gpus(1)],
        [
            job("unknown").task(gpu=1).pending(),
            job("known").task(gpu=1).submitted(1).pending(estimate_s=9e6),
        ],
        "qssf",
        [("bind", "known", "n1:0")],
    ),
    Case(
        "srtf preempts the running job with the most remaining GPU-time",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=100.0)],
        "srtf-oracle",
        [("preempt", "far", "short"), ("bind", "short", "n1:4,5,6,7")],
        running=[
            running(job("near").task(gpu=4).build(), ("n1", HALF), expected_end_s=500.0),
            running(job("far").task(gpu=4).build(), ("n1", OTHER_HALF), expected_end_s=9000.0),
        ],
    ),
    Case(
        # The running job's time left is read back as `expected_end - now`, which here comes
        # out 1,200.000000000001: a tie all the same. Evicting on it made two such jobs evict
        # each other at one instant for ever in the simulator (each, restarted, read longer).
        "srtf leaves an equal job alone though rounding reads it a hair longer",
        [node("n1").gpus(8)],
        [job("waiting").task(gpu=8).pending(estimate_s=1200.0)],
        "srtf-oracle",
        [],
        {"waiting": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("equal").task(gpu=8).build(),
                ("n1", HALF + OTHER_HALF),
                started_s=NOISY_NOW,
                expected_end_s=NOISY_NOW + 1200.0,
            )
        ],
        now=NOISY_NOW,
    ),
    Case(
        "srtf leaves running work alone when the waiting job is longer",
        [node("n1").gpus(8)],
        [job("long").task(gpu=4).pending(estimate_s=50_000.0)],
        "srtf-oracle",
        [],
        {"long": StatusCode.WAIT_RESOURCES},
        running=[
            running(job("r1").task(gpu=4).build(), ("n1", HALF), expected_end_s=500.0),
            running(job("r2").task(gpu=4).build(), ("n1", OTHER_HALF), expected_end_s=9000.0),
        ],
    ),
    # qssf preempts with predictions: factor 2, an hour's minimum run, lost work counted.
    Case(
        "qssf evicts work with over twice the waiting job's predicted GPU-time left",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],  # 2,400 GPU-s
        "qssf",
        [("preempt", "long", "short"), ("bind", "short", "n1:0,1,2,3")],
        running=[
            running(
                job("long").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=100_000.0,
                checkpoint_s=HOUR,
            )
        ],
        now=HOUR,
    ),
    Case(
        "qssf evicts the running job with the most predicted GPU-time left",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],
        "qssf",
        [("preempt", "far", "short"), ("bind", "short", "n1:4,5,6,7")],
        running=[
            running(
                job("near").task(gpu=4).build(),
                ("n1", HALF),
                expected_end_s=20_000.0,
                checkpoint_s=HOUR,
            ),
            running(
                job("far").task(gpu=4).build(),
                ("n1", OTHER_HALF),
                expected_end_s=90_000.0,
                checkpoint_s=HOUR,
            ),
        ],
        now=HOUR,
    ),
    Case(
        "qssf leaves alone work that has run less than an hour",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],
        "qssf",
        [],
        {"short": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("long").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                started_s=HOUR / 2,
                expected_end_s=100_000.0,
            )
        ],
        now=HOUR,
    ),
    Case(
        "qssf does not evict for less than twice the gain",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],  # bar: 4,800 GPU-s
        "qssf",
        [],
        {"short": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("near").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=HOUR + 500,  # 4,000 GPU-s left
                checkpoint_s=HOUR,
            )
        ],
        now=HOUR,
    ),
    Case(
        "qssf counts the work a victim would lose since its checkpoint",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],
        "qssf",
        [],
        {"short": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("mid").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=2 * HOUR + 1000,  # 8,000 GPU-s left, 7,200 of them to redo
                checkpoint_s=2 * HOUR - 900,
            )
        ],
        now=2 * HOUR,
    ),
    Case(
        "qssf evicts the same job right after its checkpoint",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],
        "qssf",
        [("preempt", "mid", "short"), ("bind", "short", "n1:0,1,2,3")],
        running=[
            running(
                job("mid").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=2 * HOUR + 1000,
                checkpoint_s=2 * HOUR,
            )
        ],
        now=2 * HOUR,
    ),
    Case(
        "qssf takes a job past its expected end as long as it has run",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],
        "qssf",
        [("preempt", "overdue", "short"), ("bind", "short", "n1:0,1,2,3")],
        running=[
            running(
                job("overdue").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=HOUR / 2,
                checkpoint_s=HOUR,
            )
        ],
        now=HOUR,
    ),
    Case(
        "qssf judges the waiting job by its upper estimate, as it does the running one",
        [node("n1").gpus(8)],
        # Median 600 s (bar 4,800 GPU-s), but upper 3,000 s: bar 2 x 12,000 = 24,000 GPU-s.
        [job("short").task(gpu=4).pending(estimate_s=600.0, estimate_upper_s=3000.0)],
        "qssf",
        [],
        {"short": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("mid").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=HOUR + 2000,  # 16,000 GPU-s left to its upper estimate
                checkpoint_s=HOUR,
            )
        ],
        now=HOUR,
    ),
    Case(
        "qssf evicts when the running job's bound is over twice the waiting job's",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0, estimate_upper_s=3000.0)],
        "qssf",
        [("preempt", "long", "short"), ("bind", "short", "n1:0,1,2,3")],
        running=[
            running(
                job("long").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                expected_end_s=HOUR + 3100,  # 24,800 GPU-s, 24,320 after the restart's cost
                checkpoint_s=HOUR,
            )
        ],
        now=HOUR,
    ),
    Case(
        "qssf counts the restart's cost against the gain",
        [node("n1").gpus(8)],
        [job("short").task(gpu=4).pending(estimate_s=600.0)],  # bar: 4,800 GPU-s
        "qssf",
        [],
        {"short": StatusCode.WAIT_RESOURCES},
        running=[
            running(
                job("near").task(gpu=8).build(),
                ("n1", tuple(range(8))),
                # 5,040 GPU-s left, nothing to redo, but 8 x 60 s to restart: 4,560 < 4,800.
                expected_end_s=HOUR + 630,
                checkpoint_s=HOUR,
            )
        ],
        now=HOUR,
    ),
    Case(
        "a starving gang goes first and holds a reservation without backfill",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [
            job("gang").gang(2, gpu=8).pending(estimate_s=5000.0),
            job("fits-before").task(gpu=4).submitted(DAY).pending(estimate_s=100.0),
            job("too-long")
            .task(gpu=4)
            .submitted(DAY)
            .pending(estimate_s=200.0, estimate_upper_s=5000.0),
        ],
        "qssf",
        [("reserve", "gang", "n1", "n2"), ("bind", "fits-before", "n1:4,5,6,7")],
        {
            "gang": StatusCode.RESERVED,
            "fits-before": StatusCode.PLACED,
            "too-long": StatusCode.WAIT_RESERVATION,
        },
        running=[
            running(job("r1").task(gpu=4).build(), ("n1", HALF), expected_end_s=DAY + 1000),
            running(job("r2").task(gpu=4).build(), ("n2", HALF), expected_end_s=DAY + 1000),
        ],
        now=DAY,
    ),
    Case(
        "only the oldest starving gang holds a reservation",
        [node("n1").gpus(8), node("n2").gpus(8), node("n3").gpus(8), node("n4").gpus(8)],
        [
            job("old-gang").gang(2, gpu=8).pending(estimate_s=5000.0),
            job("young-gang").gang(2, gpu=8).submitted(1).pending(estimate_s=5000.0),
        ],
        "qssf",
        [("reserve", "old-gang", "n1", "n2")],
        {"old-gang": StatusCode.RESERVED, "young-gang": StatusCode.WAIT_RESERVATION},
        running=[
            running(job(f"r{i}").task(gpu=4).build(), (f"n{i}", HALF), expected_end_s=DAY + 1000)
            for i in range(1, 5)
        ],
        now=DAY,
    ),
    Case(
        "a younger starving gang keeps off the reserved nodes of an older one",
        [node("n1").gpus(8), node("n2").gpus(8), node("n3").gpus(8)],
        [
            job("old-gang").gang(3, gpu=8).pending(estimate_s=5000.0),
            job("young-gang").gang(2, gpu=8).submitted(1).pending(estimate_s=5000.0),
        ],
        "qssf",
        [("reserve", "old-gang", "n1", "n2", "n3")],
        {"old-gang": StatusCode.RESERVED, "young-gang": StatusCode.WAIT_RESERVATION},
        running=[running(job("r3").task(gpu=4).build(), ("n3", HALF), expected_end_s=DAY + 1000)],
        now=DAY,
    ),
    Case(
        "a job kept off a starving gang's nodes may evict elsewhere, never on them",
        [node("n1").gpus(8), node("n2").gpus(8), node("n3").gpus(8)],
        [
            job("gang").gang(2, gpu=8).pending(estimate_s=5000.0),
            job("short")
            .task(gpu=4)
            .submitted(DAY)
            .pending(estimate_s=600.0, estimate_upper_s=5000.0),
        ],
        "qssf",
        [
            ("reserve", "gang", "n1", "n2"),
            ("preempt", "long", "short"),
            ("bind", "short", "n3:0,1,2,3"),
        ],
        {"gang": StatusCode.RESERVED, "short": StatusCode.PREEMPTING},
        running=[
            running(job("r1").task(gpu=4).build(), ("n1", HALF), expected_end_s=DAY + 1000),
            running(job("r2").task(gpu=4).build(), ("n2", HALF), expected_end_s=DAY + 1000),
            running(
                job("long").task(gpu=8).build(),
                ("n3", tuple(range(8))),
                expected_end_s=DAY + 100_000,
                checkpoint_s=DAY,
            ),
        ],
        now=DAY,
    ),
    Case(
        "a gang that has not waited long enough is not promoted",
        [node("n1").gpus(8), node("n2").gpus(8)],
        [
            job("gang").gang(2, gpu=8).submitted(DAY - 100).pending(estimate_s=5000.0),
            job("small")
            .task(gpu=4)
            .submitted(DAY)
            .pending(estimate_s=200.0, estimate_upper_s=5000.0),
        ],
        "qssf",
        [("bind", "small", "n1:4,5,6,7")],
        {"gang": StatusCode.WAIT_RESOURCES},
        running=[
            running(job("r1").task(gpu=4).build(), ("n1", HALF), expected_end_s=DAY + 1000),
            running(job("r2").task(gpu=4).build(), ("n2", HALF), expected_end_s=DAY + 1000),
        ],
        now=DAY,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_learned_policy_scenarios(case: Case) -> None:
    snap = snapshot_of(cluster(*case.nodes), case.running)
    result = run_cycle(snap, case.pending, preset(case.policy), case.now, validate=True)
    assert summary(result) == case.want
    assert {k: result.diagnostics[k].code for k in case.want_status} == case.want_status
    assert set(result.diagnostics) == {p.id for p in case.pending}


def test_eta_walks_the_queue_over_expected_ends() -> None:
    """8 GPUs, all held until t=100. a (4 GPUs, 50 s) starts at 100; b (8 GPUs) needs a's GPUs
    back too, so 150; c (4 GPUs) waits for b to end at 160; d's GPUs never come back after c,
    which has no bound, so d has no ETA."""
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [running(job("r").task(gpu=8).build(), ("n1", tuple(range(8))), expected_end_s=100.0)],
    )
    pending = [
        job("a").task(gpu=4).submitted(1).pending(estimate_s=50.0),
        job("b").task(gpu=8).submitted(2).pending(estimate_s=10.0),
        job("c").task(gpu=4).submitted(3).pending(),
        job("d").task(gpu=8).submitted(4).pending(estimate_s=1.0),
    ]
    res = run_cycle(snap, pending, with_eta(preset("fifo")), 0.0, validate=True)
    assert {k: s.eta_s for k, s in res.diagnostics.items()} == {
        "a": 100.0,
        "b": 150.0,
        "c": 160.0,
        "d": None,
    }
    assert {s.code for s in res.diagnostics.values()} == {StatusCode.WAIT_RESOURCES}


def test_eta_gives_none_to_a_job_the_pool_could_start_now_that_the_cycle_left_waiting() -> None:
    """8 GPUs and 16 CPUs; r holds 4 GPUs and 12 CPUs until t=100. `gpus-free` has its 2 GPUs
    free but not its 8 CPUs, and `cpu-only` needs no GPU but 8 CPUs: neither starts, and an
    ETA of "now" at every cycle would be no estimate, so they get none. They take nothing
    from the pool: `after` (8 GPUs) starts when r's GPUs come back. Before, `gpus-free` and
    `cpu-only` were "now", and `after` had none: `gpus-free` has no runtime bound, so the 2
    GPUs it was taken to start on now never came back."""
    snap = snapshot_of(
        cluster(node("n1").gpus(8).cpus(16)),
        [running(job("r").task(gpu=4, cpu=12).build(), ("n1", HALF), expected_end_s=100.0)],
    )
    pending = [
        job("gpus-free").task(gpu=2, cpu=8).submitted(1).pending(),  # no runtime bound
        job("cpu-only").task(cpu=8).submitted(2).pending(estimate_s=50.0),
        job("after").task(gpu=8, cpu=1).submitted(3).pending(estimate_s=10.0),
    ]
    res = run_cycle(snap, pending, with_eta(preset("fifo")), 0.0, validate=True)
    assert {k: s.eta_s for k, s in res.diagnostics.items()} == {
        "gpus-free": None,
        "cpu-only": None,
        "after": 100.0,
    }


def test_eta_gives_none_to_a_job_waiting_on_work_past_its_expected_end() -> None:
    """r was expected to end at t=100 and still runs at t=200: the 8-GPU job behind it would
    be "now" at every cycle until r ends, so it has no estimate."""
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [running(job("r").task(gpu=8).build(), ("n1", tuple(range(8))), expected_end_s=100.0)],
    )
    pending = [job("next").task(gpu=8).submitted(1).pending(estimate_s=50.0)]
    res = run_cycle(snap, pending, with_eta(preset("fifo")), 200.0, validate=True)
    assert res.diagnostics["next"].code == StatusCode.WAIT_RESOURCES
    assert res.diagnostics["next"].eta_s is None


def test_eta_keeps_a_reservation_start_and_skips_what_never_fits() -> None:
    snap = snapshot_of(
        cluster(node("n1").gpus(8)),
        [running(job("r").task(gpu=4).build(), ("n1", HALF), expected_end_s=1200.0)],
    )
    pending = [job("head").task(gpu=8).pending(), job("huge").task(gpu=64).pending()]
    res = run_cycle(snap, pending, with_eta(preset("fifo-backfill")), 0.0)
    assert res.diagnostics["head"].eta_s == 1200.0
    assert res.diagnostics["huge"].code == StatusCode.NEVER_FITS
    assert res.diagnostics["huge"].eta_s is None


def test_with_eta_adds_the_action_once_and_default_has_it() -> None:
    p = with_eta(preset("qssf"))
    assert p.action_names() == ("enqueue", "allocate", "preempt", "eta")
    assert with_eta(p) is p
    assert preset("default").action_names()[-1] == "eta"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"actions": [{"name": "enqueue", "starving_after_s": -1}]},
            "policy.actions[0]: starving_after_s must be 0 (off) or more",
        ),
        (
            {"actions": [{"name": "enqueue", "starving_after_backlog": -0.5}]},
            "policy.actions[0]: starving_after_backlog must be 0 (off) or more",
        ),
        (
            {"actions": [{"name": "preempt", "by": "order", "factor": 0.5}]},
            "policy.actions[0]: factor must be at least 1, got 0.5",
        ),
        (
            {"actions": ["enqueue"], "order": [{"name": "qssf", "aging": -1.0}]},
            "policy.order[0]: qssf: aging must be 0 or more, got -1.0",
        ),
        (
            {"actions": [{"name": "preempt", "by": "order", "bound": "median"}]},
            "policy.actions[0]: bound must be 'estimate' or 'upper', not 'median'",
        ),
        (
            {"actions": ["enqueue"], "order": [{"name": "qssf", "aging": 1, "halve_after_s": 1}]},
            "policy.order[0]: qssf: set at most one of aging, halve_after_s and bucket",
        ),
        (
            {"actions": ["enqueue"], "order": [{"name": "qssf", "bucket": 2, "aging": 0.1}]},
            "policy.order[0]: qssf: set at most one of aging, halve_after_s and bucket",
        ),
        (
            {"actions": ["enqueue"], "order": [{"name": "qssf", "bucket": 1.0}]},
            "policy.order[0]: qssf: bucket must be 0 (off) or above 1, got 1.0",
        ),
        (
            {"actions": ["enqueue"], "victims": ["longest-remainder"]},
            "policy.victims[0]: unknown victims 'longest-remainder'",
        ),
    ],
)
def test_bad_arguments_are_named(config: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as e:
        build_policy(config)
    assert str(e.value).startswith(message)


def _aged_qssf(aging: float) -> Policy:
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["order"] = [{"name": "qssf", "aging": aging}, "fifo"]
    return build_policy(cfg, name="qssf")


@pytest.mark.parametrize(("aging", "first"), [(0.0, "young"), (0.5, "young"), (2.0, "old")])
def test_aging_lets_a_long_job_pass_younger_short_ones_once_it_has_waited(
    aging: float, first: str
) -> None:
    """old: 10,000 GPU-s, submitted at 0; young: 100 GPU-s, submitted at 9,000. Keys at aging a:
    old 10,000, young 100 + 9,000 a: young goes first below a = 1.1, old above."""
    snap = snapshot_of(cluster(node("n1").gpus(1)), [])
    pending = [
        job("old").task(gpu=1).submitted(0).pending(estimate_s=10_000.0),
        job("young").task(gpu=1).submitted(9000).pending(estimate_s=100.0),
    ]
    res = run_cycle(snap, pending, _aged_qssf(aging), 9000.0, validate=True)
    assert summary(res) == [("bind", first, "n1:0")]


def test_with_aging_the_preemption_margin_is_on_the_size_and_the_age_is_a_shift() -> None:
    """A running job submitted at 0 with 50,000 GPU-s left; a waiting job submitted at 10,000
    of 1,000 GPU-s. Factor 2 on the sizes: 50,000 > 2,000; the age gap costs aging x 10,000.
    At aging 1 the victim's key (50,000) is over the bar (2,000 + 10,000): preempted. At
    aging 5 (bar 2,000 + 50,000) it is not: the older job is protected by its age."""
    victim = running(
        job("old").task(gpu=1).submitted(0).build(),
        ("n1", (0,)),
        started_s=0.0,
        expected_end_s=DAY + 50_000.0,
        checkpoint_s=DAY,  # checkpointed just now: nothing would be lost
    )
    pending = [job("new").task(gpu=1).submitted(10_000).pending(estimate_s=1000.0)]
    snap = snapshot_of(cluster(node("n1").gpus(1)), [victim])
    res = run_cycle(snap, pending, _aged_qssf(1.0), DAY, validate=True)
    assert summary(res) == [("preempt", "old", "new"), ("bind", "new", "n1:0")]
    res = run_cycle(snap, pending, _aged_qssf(5.0), DAY, validate=True)
    assert summary(res) == []


def _checkpointing(r: RunningJob, interval_s: float) -> RunningJob:
    return replace(r, last_checkpoint_s=None, checkpoint_interval_s=interval_s)


@pytest.mark.parametrize(
    ("interval_s", "evicted"),
    [(600.0, True), (1200.0, False), (None, False)],
    ids=["past its first checkpoint", "before its first checkpoint", "no checkpoints: an hour"],
)
def test_qssf_minimum_run_is_the_victims_own_checkpoint_interval(
    interval_s: float | None, evicted: bool
) -> None:
    """A job that has run 15 minutes, with its whole runtime bound still far away: evicted once
    it has written its first checkpoint (interval 10 min), not before (20 min), and a job that
    never checkpoints keeps the hour's minimum run."""
    r = running(job("long").task(gpu=8).build(), ("n1", tuple(range(8))), expected_end_s=DAY)
    if interval_s is not None:
        r = _checkpointing(r, interval_s)
    snap = snapshot_of(cluster(node("n1").gpus(8)), [r])
    pending = [job("short").task(gpu=4).submitted(1).pending(estimate_s=600.0)]
    res = run_cycle(snap, pending, preset("qssf"), 900.0, validate=True)
    want = [("preempt", "long", "short"), ("bind", "short", "n1:0,1,2,3")] if evicted else []
    assert summary(res) == want


def _bare_qssf(**preempt: object) -> Policy:
    """qssf's order and victims with no margin and nothing counted: only `preempt`'s extra
    arguments differ."""
    return build_policy(
        {
            "actions": [
                "enqueue",
                "allocate",
                {"name": "preempt", "by": "order", "scope": "cluster", **preempt},
            ],
            "order": ["qssf", "fifo"],
            "victims": ["longest-remaining", "least-work-lost"],
        }
    )


@pytest.mark.parametrize("preempt", [{}, {"bound": "upper"}], ids=["default", "bound upper"])
def test_both_sides_are_judged_by_their_upper_estimate_by_default(
    preempt: dict[str, object],
) -> None:
    """One GPU. a runs with 2,500 s to its upper estimate; b waits, median 1,000 s, upper
    3,000 s. Judged by its median (the default before), b evicted a; a, requeued (median
    2,000 s, upper 2,500 s), then evicted b, whose bound still had 3,000 s to go: back and
    forth at one instant, for ever (srtf-oracle with --estimator predict aborted). Judged by
    its upper estimate, as a running job is, b never evicts a in the first place."""
    n1 = node("n1").gpus(1)
    a = job("a").task(gpu=1).build()
    b = job("b").task(gpu=1).submitted(1).build()
    policy = _bare_qssf(**preempt)
    snap = snapshot_of(cluster(n1), [running(a, ("n1", (0,)), expected_end_s=2500.0)])
    first = run_cycle(snap, [PendingJob(b, 0, 0, 1000.0, 3000.0)], policy, 0.0, validate=True)
    assert summary(first) == []


def test_judging_by_the_median_needs_a_minimum_run() -> None:
    """`bound: estimate` alone lets two jobs evict each other for ever, so it is refused; with
    `min_run_s` the job that just started cannot be evicted back at that instant."""
    with pytest.raises(PolicyError) as info:
        _bare_qssf(bound="estimate")
    assert str(info.value).startswith(
        "policy.actions[2]: bound: estimate judges a waiting job by its median"
    )
    n1 = node("n1").gpus(1)
    a = job("a").task(gpu=1).build()
    b = job("b").task(gpu=1).submitted(1).build()
    policy = _bare_qssf(bound="estimate", min_run_s=60.0)
    snap = snapshot_of(cluster(n1), [running(a, ("n1", (0,)), expected_end_s=2500.0)])
    first = run_cycle(snap, [PendingJob(b, 0, 0, 1000.0, 3000.0)], policy, 100.0, validate=True)
    assert summary(first) == [("preempt", "a", "b"), ("bind", "b", "n1:0")]
    b_runs = running(b, ("n1", (0,)), expected_end_s=3100.0, started_s=100.0)
    snap = snapshot_of(cluster(n1), [b_runs])
    second = run_cycle(snap, [PendingJob(a, 0, 1, 2000.0, 2500.0)], policy, 100.0, validate=True)
    assert summary(second) == []


def _qssf_ordered(**order: float) -> Policy:
    """The qssf preset with the order's arguments `order` (its aging form), the order alone."""
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["actions"][0] = {**cfg["actions"][0], "due_after_backlog": 0.0}
    cfg["order"] = [{"name": "qssf", **order}, "fifo"]
    return build_policy(cfg, name="qssf")


@pytest.mark.parametrize(
    ("gpus", "halve_after_s", "first"),
    [(1, 2 * HOUR, "young"), (1, HOUR, "old"), (8, 2 * HOUR, "young"), (8, HOUR, "old")],
)
def test_halving_ages_every_size_alike(gpus: int, halve_after_s: float, first: str) -> None:
    """old has waited 6 h longer, with 16 times the GPU-time of young (4 halvings): young goes
    first while 6 h is under 4 half-lives (3 of 2 h), old once it is over (6 of 1 h); whether
    both are one GPU wide or eight does not matter, only the ratio does (linear aging would hold
    the wide job back 8 times as long)."""
    snap = snapshot_of(cluster(node("n1").gpus(gpus)), [])
    pending = [
        job("old").task(gpu=gpus).submitted(0).pending(estimate_s=1600.0),
        job("young").task(gpu=gpus).submitted(6 * HOUR).pending(estimate_s=100.0),
    ]
    policy = _qssf_ordered(halve_after_s=halve_after_s)
    res = run_cycle(snap, pending, policy, 6 * HOUR, validate=True)
    assert [d[:2] for d in summary(res)] == [("bind", first)]


@pytest.mark.parametrize(
    ("young_estimate_s", "bucket", "first"),
    [
        (1800.0, 4.0, "old"),  # 1,800 and 2,520 GPU-s: one band of 4 ([1,024, 4,096))
        (360.0, 4.0, "young"),  # a band lower
        (1800.0, 2.0, "young"),  # bands of 2: [1,024, 2,048) against [2,048, 4,096)
        (1800.0, 0.0, "young"),  # no bands: shortest first
    ],
)
def test_within_a_band_the_older_job_goes_first(
    young_estimate_s: float, bucket: float, first: str
) -> None:
    """old (a burst's last job, 0.7 h) and young (submitted an hour later) on one GPU: with
    bands, young passes old only from a lower band, else they go in submission order."""
    snap = snapshot_of(cluster(node("n1").gpus(1)), [])
    pending = [
        job("old").task(gpu=1).submitted(0).pending(estimate_s=2520.0),
        job("young").task(gpu=1).submitted(HOUR).pending(estimate_s=young_estimate_s),
    ]
    res = run_cycle(snap, pending, _qssf_ordered(bucket=bucket), HOUR, validate=True)
    assert [d[:2] for d in summary(res)] == [("bind", first)]


def _overdue_qssf(k: float) -> Policy:
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["actions"][0] = {
        **cfg["actions"][0],
        "due_after_median_waits": k,
        "due_after_backlog": 0.0,
    }
    cfg["order"] = ["qssf", "fifo"]
    return build_policy(cfg, name="qssf")


@pytest.mark.parametrize(
    ("now", "k", "want"),
    [
        # Waits at 10 h: long 10 h, the others 4, 3 and 2 h. The median wait (of four, the
        # upper one) is 4 h, the bar 8 h: long is due, then c and b by GPU-time.
        (10 * HOUR, 2.0, ["long", "c"]),
        # The same queue with a bar of 4 median waits (16 h): nobody is due, shortest first.
        (10 * HOUR, 4.0, ["c", "b"]),
        # At 7 h only long (7 h), b (1 h) and c (just now) wait: median 1 h, bar 2 h.
        (7 * HOUR, 2.0, ["long", "c"]),
    ],
    ids=["overdue", "bar above the oldest", "overdue early in a burst"],
)
def test_an_overdue_job_goes_first_oldest_first(now: float, k: float, want: list[str]) -> None:
    """Two GPUs, four waiting jobs. long, the oldest, has by far the most predicted GPU-time;
    once it has waited more than k times the median wait of the waiting jobs it goes first,
    and the rest follow in the order (shortest first) behind it."""
    snap = snapshot_of(cluster(node("n1").gpus(2)), [])
    pending = [
        job("long").task(gpu=1).submitted(0).pending(estimate_s=90_000.0),
        job("b").task(gpu=1).submitted(6 * HOUR).pending(estimate_s=200.0),
        job("c").task(gpu=1).submitted(7 * HOUR).pending(estimate_s=100.0),
        job("d").task(gpu=1).submitted(8 * HOUR).pending(estimate_s=300.0),
    ]
    pending = [p for p in pending if p.job.submit_time_s <= now]
    res = run_cycle(snap, pending, _overdue_qssf(k), now, validate=True)
    assert [d[1] for d in summary(res) if d[0] == "bind"] == want


def _backlog_qssf(k: float) -> Policy:
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["actions"][0] = {
        **cfg["actions"][0],
        "due_after_median_waits": 0.0,
        "due_after_backlog": k,
    }
    cfg["order"] = ["qssf", "fifo"]
    return build_policy(cfg, name="qssf")


@pytest.mark.parametrize(
    ("k", "busy_until_s", "want"),
    [
        # Backlog 90,600 GPU-s (90,000 + 200 + 100 + 300) on 2 GPUs: 12.6 h to drain. long has
        # waited 10 h: under one drain time, so nobody is due and shortest goes first.
        (1.0, None, ["c", "b"]),
        # Half a drain time (6.3 h): long is due; b (4 h) is not.
        (0.5, None, ["long", "c"]),
        # A second node, its 2 GPUs busy (not preemptible) for 40 h more (288,000 GPU-s):
        # 378,600 GPU-s on 4 GPUs is 26.3 h to drain, half of it 13.1 h: the work ahead holds
        # long back again.
        (0.5, 50 * HOUR, ["c", "b"]),
    ],
    ids=["under the drain time", "past half of it", "running work raises the bar"],
)
def test_a_job_waiting_past_the_backlogs_drain_time_goes_first(
    k: float, busy_until_s: float | None, want: list[str]
) -> None:
    """The same four waiting jobs as above, at 10 h, with the overdue bar set by the backlog:
    k times the GPU-time still to do (waiting jobs' bounds, running jobs' time left) over the
    cluster's GPUs."""
    nodes = [node("n1").gpus(2)]
    busy: list[RunningJob] = []
    if busy_until_s is not None:
        nodes.append(node("n2").gpus(2))
        r = job("r").task(gpu=2).not_preemptible().build()
        busy.append(running(r, ("n2", (0, 1)), expected_end_s=busy_until_s))
    snap = snapshot_of(cluster(*nodes), busy)
    pending = [
        job("long").task(gpu=1).submitted(0).pending(estimate_s=90_000.0),
        job("b").task(gpu=1).submitted(6 * HOUR).pending(estimate_s=200.0),
        job("c").task(gpu=1).submitted(7 * HOUR).pending(estimate_s=100.0),
        job("d").task(gpu=1).submitted(8 * HOUR).pending(estimate_s=300.0),
    ]
    res = run_cycle(snap, pending, _backlog_qssf(k), 10 * HOUR, validate=True)
    assert [d[1] for d in summary(res) if d[0] == "bind"] == want


@pytest.mark.parametrize(
    ("backlog_bound", "want"),
    [
        # To its started bound (50 h): 40 h left on 2 GPUs, 378,600 GPU-s on 4 GPUs, half of
        # the drain time 13.1 h: long (10 h) is not due, shortest goes first.
        ("started", ["c", "b"]),
        # To the bound it waited with (15 h): 5 h left, 126,600 GPU-s, half of it 4.4 h: long
        # is due, b (4 h) is not.
        ("waited", ["long", "c"]),
    ],
)
def test_the_backlog_can_read_the_bound_a_running_job_waited_with(
    backlog_bound: str, want: list[str]
) -> None:
    """The third case above with the running job's bound calibrated again as it started
    (expected end 50 h) where it waited with a narrower one (15 h): `backlog_bound: waited`
    takes its time left from the one it waited with."""
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["actions"][0] = {
        **cfg["actions"][0],
        "due_after_median_waits": 0.0,
        "due_after_backlog": 0.5,
        "backlog_bound": backlog_bound,
    }
    cfg["order"] = ["qssf", "fifo"]
    r = job("r").task(gpu=2).not_preemptible().build()
    busy = replace(running(r, ("n2", (0, 1)), expected_end_s=50 * HOUR), waited_end_s=15 * HOUR)
    snap = snapshot_of(cluster(node("n1").gpus(2), node("n2").gpus(2)), [busy])
    pending = [
        job("long").task(gpu=1).submitted(0).pending(estimate_s=90_000.0),
        job("b").task(gpu=1).submitted(6 * HOUR).pending(estimate_s=200.0),
        job("c").task(gpu=1).submitted(7 * HOUR).pending(estimate_s=100.0),
        job("d").task(gpu=1).submitted(8 * HOUR).pending(estimate_s=300.0),
    ]
    policy = build_policy(cfg, name="qssf")
    res = run_cycle(snap, pending, policy, 10 * HOUR, validate=True)
    assert [d[1] for d in summary(res) if d[0] == "bind"] == want


def test_an_unknown_backlog_bound_is_refused() -> None:
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["actions"][0] = {**cfg["actions"][0], "backlog_bound": "median"}
    with pytest.raises(PolicyError, match="backlog_bound"):
        build_policy(cfg, name="qssf")


def test_an_overdue_job_that_does_not_fit_holds_nothing_back() -> None:
    """An overdue 4-GPU job on a node with 2 free GPUs: no reservation, and the next jobs
    start in the order beside it."""
    busy = running(job("r").task(gpu=2).build(), ("n1", (0, 1)), expected_end_s=DAY)
    snap = snapshot_of(cluster(node("n1").gpus(4)), [busy])
    pending = [
        job("wide").task(gpu=4).submitted(0).pending(estimate_s=100.0),
        job("b").task(gpu=1).submitted(9 * HOUR).pending(estimate_s=10.0),
        job("c").task(gpu=1).submitted(9 * HOUR).pending(estimate_s=20.0),
    ]
    res = run_cycle(snap, pending, _overdue_qssf(2.0), 10 * HOUR, validate=True)
    assert summary(res) == [("bind", "b", "n1:2"), ("bind", "c", "n1:3")]
    assert res.diagnostics["wide"].code == StatusCode.WAIT_RESOURCES


@pytest.mark.parametrize(
    ("k", "want", "wide_status"),
    [
        # Off: wide is only the oldest job; it does not fit and b and c start beside it.
        (0.0, [("bind", "b", "n1:2"), ("bind", "c", "n1:3")], StatusCode.WAIT_RESOURCES),
        # The backlog: r's 14 h left on 2 GPUs and 430 GPU-s waiting, on 4 GPUs: 7.0 h to
        # drain. wide has waited 10 h, past it: it starves and holds n1; b and c would end
        # (upper estimate, 20 h) after r's end frees n1, so they keep off it.
        (1.0, [("reserve", "wide", "n1")], StatusCode.RESERVED),
        # Twice the drain time (14.1 h) is past wide's wait: not starving yet.
        (2.0, [("bind", "b", "n1:2"), ("bind", "c", "n1:3")], StatusCode.WAIT_RESOURCES),
    ],
    ids=["off", "past the drain time", "under twice the drain time"],
)
def test_a_wide_job_waiting_past_the_backlogs_drain_time_starves_and_holds_a_reservation(
    k: float, want: list[tuple[str, ...]], wide_status: StatusCode
) -> None:
    """`starving_after_backlog`: the starving bar (with a reservation) set by the load, as the
    overdue bar is, for jobs of `starving_min_gpus` GPUs or more; without it the wide job keeps
    failing to fit while narrower ones take the GPUs that free up."""
    cfg = copy.deepcopy(PRESETS["qssf"])
    cfg["actions"][0] = {
        "name": "enqueue",
        "starving_min_gpus": 4,
        "starving_after_backlog": k,
    }
    r = job("r").task(gpu=2).not_preemptible().build()
    busy = running(r, ("n1", (0, 1)), expected_end_s=DAY)
    snap = snapshot_of(cluster(node("n1").gpus(4)), [busy])
    pending = [
        job("wide").task(gpu=4).submitted(0).pending(estimate_s=100.0),
        job("b")
        .task(gpu=1)
        .submitted(9 * HOUR)
        .pending(estimate_s=10.0, estimate_upper_s=20 * HOUR),
        job("c")
        .task(gpu=1)
        .submitted(9 * HOUR)
        .pending(estimate_s=20.0, estimate_upper_s=20 * HOUR),
    ]
    res = run_cycle(snap, pending, build_policy(cfg, name="qssf"), 10 * HOUR, validate=True)
    assert summary(res) == want
    assert res.diagnostics["wide"].code == wide_status

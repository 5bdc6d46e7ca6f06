"""The discrete-event engine on tiny hand-made traces whose outcome can be worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

import aisched.sim.engine as engine_mod
from aisched.core.cycle import CycleResult, CycleStats, run_cycle
from aisched.core.decisions import Bind, TaskBinding
from aisched.core.policy import Policy, load_policy
from aisched.core.snapshot import PendingJob, Snapshot
from aisched.model.cluster import Cluster
from aisched.model.queue import Queue, QueueTree
from aisched.model.resources import Resources
from aisched.sim.engine import SimConfig, SimResult, SimulationError, simulate
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import Trace, TraceJob, synthetic_cluster, synthetic_trace
from aisched.testing import cluster, job, node

VALIDATE = SimConfig(validate=True)


def one_node(gpus: int = 8) -> Cluster:
    return cluster(node("n1").gpus(gpus))


def tj(
    job_id: str,
    submit: float,
    duration: float,
    gpus: int = 8,
    *,
    priority: int = 0,
    estimate: float | None = None,
) -> TraceJob:
    b = job(job_id).task(gpu=gpus).submitted(submit).priority(priority)
    if estimate is not None:
        b = b.estimate(estimate)
    return TraceJob(b.build(), duration)


def run(
    jobs: Sequence[TraceJob],
    policy: str = "fifo",
    config: SimConfig = VALIDATE,
    c: Cluster | None = None,
) -> SimResult:
    return simulate(Trace("t", tuple(jobs)), c or one_node(), load_policy(policy), config)


def rec(result: SimResult, job_id: str) -> engine_mod.JobRecord:
    return next(r for r in result.jobs if r.job_id == job_id)


def test_job_on_empty_cluster_finishes_at_submit_plus_duration() -> None:
    r = run([tj("a", 10.0, 100.0)])
    assert r.log == ((10.0, "bind", "a", ("n1",)), (110.0, "finish", "a", ()))
    a = rec(r, "a")
    assert (a.first_start_s, a.finish_s, a.gpu_s) == (10.0, 110.0, 800.0)
    assert r.end_s == 110.0


def test_second_job_waits_for_the_first() -> None:
    r = run([tj("a", 0.0, 100.0), tj("b", 10.0, 50.0)])
    assert r.log == (
        (0.0, "bind", "a", ("n1",)),
        (100.0, "finish", "a", ()),
        (100.0, "bind", "b", ("n1",)),
        (150.0, "finish", "b", ()),
    )
    m = compute_metrics(r)
    assert m.avg_queueing_s == pytest.approx(45.0)  # (0 + 90) / 2
    assert m.avg_jct_s == pytest.approx((100.0 + 140.0) / 2)


def test_preempted_job_loses_work_since_checkpoint_and_pays_restart_cost() -> None:
    # a: low priority, 10,000 s of work, checkpoints each 3,600 s; b (high) arrives at 5,000 s.
    config = SimConfig(checkpoint_interval_s=3600.0, restart_cost_s=60.0, validate=True)
    r = run(
        [tj("a", 0.0, 10_000.0, priority=0), tj("b", 5000.0, 100.0, priority=10)],
        policy="priority",
        config=config,
    )
    kinds = [(t, k, j) for t, k, j, _ in r.log]
    # a keeps the 3,600 s of its checkpoint, so 6,400 s of work remain, plus 60 s of restore.
    assert kinds == [
        (0.0, "bind", "a"),
        (5000.0, "preempt", "a"),
        (5000.0, "bind", "b"),
        (5100.0, "finish", "b"),
        (5100.0, "bind", "a"),
        (5100.0 + 60.0 + 6400.0, "finish", "a"),
    ]
    assert r.log[1][3][0] == "b"  # preempted for b
    a = rec(r, "a")
    assert (a.preemptions, a.restarts) == (1, 1)
    # GPU-seconds received: 5,000 s then 6,460 s, on 8 GPUs, lost work and restore included.
    assert a.gpu_s == pytest.approx(8 * (5000.0 + 6460.0))
    m = compute_metrics(r)
    assert (m.preemptions, m.restarts) == (1, 1)


def test_without_checkpoints_a_preempted_job_starts_over() -> None:
    config = SimConfig(checkpoint_interval_s=math.inf, restart_cost_s=0.0, validate=True)
    r = run(
        [tj("a", 0.0, 10_000.0, priority=0), tj("b", 5000.0, 100.0, priority=10)],
        policy="priority",
        config=config,
    )
    assert rec(r, "a").finish_s == pytest.approx(5100.0 + 10_000.0)


def test_job_checkpoint_interval_overrides_config() -> None:
    a = replace(job("a").task(gpu=8).submitted(0.0).build(), checkpoint_interval_s=1000.0)
    config = SimConfig(checkpoint_interval_s=3600.0, restart_cost_s=0.0, validate=True)
    r = run(
        [TraceJob(a, 10_000.0), tj("b", 4500.0, 100.0, priority=10)],
        policy="priority",
        config=config,
    )
    # Checkpoint at 4,000 s: 6,000 s of work remain after b leaves at 4,600 s.
    assert rec(r, "a").finish_s == pytest.approx(4600.0 + 6000.0)


def test_utilisation_for_a_hand_computed_case() -> None:
    # a: 4 GPUs over [0, 100]; b: 2 GPUs over [50, 150]. Window [0, 150] on 8 GPUs:
    # (4·100 + 2·100) / (8·150) = 0.5.
    r = run([tj("a", 0.0, 100.0, gpus=4), tj("b", 50.0, 100.0, gpus=2)])
    m = compute_metrics(r)
    assert m.gpu_utilisation == pytest.approx(0.5)
    assert m.makespan_s == 150.0
    assert r.timeline == (
        (0.0, 4.0, 1, 0),
        (50.0, 6.0, 2, 0),
        (100.0, 2.0, 1, 0),
        (150.0, 0.0, 0, 0),
    )


def test_gpu_share_counts_as_a_fraction() -> None:
    share = job("s").task(gpu_milli=250).submitted(0.0).build()
    r = run([TraceJob(share, 100.0)], c=one_node(gpus=1))
    m = compute_metrics(r)
    assert m.gpu_utilisation == pytest.approx(0.25)
    assert rec(r, "s").gpu_s == pytest.approx(25.0)


def test_same_trace_twice_gives_identical_log() -> None:
    trace = synthetic_trace(120, seed=3, arrival_rate_per_h=120.0)
    c = synthetic_cluster(2)
    config = SimConfig(validate=True)
    first = simulate(trace, c, load_policy("las"), config)
    second = simulate(trace, c, load_policy("las"), config)
    assert first.log == second.log
    assert first.timeline == second.timeline
    assert first.jobs == second.jobs
    assert any(kind == "preempt" for _, kind, _, _ in first.log)  # the case exercises preemption


@pytest.mark.parametrize("policy", ["fifo", "priority", "drf", "las", "sjf", "fifo-backfill"])
def test_validate_mode_holds_for_every_preset(policy: str) -> None:
    trace = synthetic_trace(80, seed=1, arrival_rate_per_h=240.0)
    r = simulate(trace, synthetic_cluster(2), load_policy(policy), SimConfig(validate=True))
    m = compute_metrics(r)
    assert m.jobs_finished + m.jobs_rejected == 80


def test_cycle_interval_batches_events_to_period_boundaries() -> None:
    config = SimConfig(cycle_interval_s=60.0, validate=True)
    r = run([tj("a", 10.0, 100.0, gpus=1), tj("b", 20.0, 100.0, gpus=1)], config=config)
    assert [(t, k, j) for t, k, j, _ in r.log] == [
        (60.0, "bind", "a"),
        (60.0, "bind", "b"),
        (160.0, "finish", "a"),
        (160.0, "finish", "b"),
    ]
    assert r.cycles == 1


def test_job_that_can_never_fit_is_rejected() -> None:
    r = run([tj("huge", 0.0, 100.0, gpus=16), tj("ok", 0.0, 10.0)])
    huge = rec(r, "huge")
    assert huge.rejected is not None and huge.first_start_s is None
    assert rec(r, "ok").finish_s == 10.0
    assert compute_metrics(r).jobs_rejected == 1


def test_endless_job_never_finishes_and_the_run_still_ends() -> None:
    r = run([tj("forever", 0.0, math.inf, gpus=4), tj("b", 5.0, 10.0, gpus=4)])
    assert rec(r, "forever").finish_s is None
    assert rec(r, "b").finish_s == 15.0
    assert r.end_s == 15.0


def test_max_time_stops_the_run() -> None:
    r = run([tj("a", 0.0, 100.0), tj("b", 10.0, 100.0)], config=SimConfig(max_time_s=50.0))
    assert r.end_s == 50.0
    assert rec(r, "a").finish_s is None
    assert rec(r, "a").gpu_s == pytest.approx(8 * 50.0)


def test_the_cycle_sees_attained_service_and_estimates_not_true_durations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[float, tuple[tuple[str, float, float | None], ...], tuple[PendingJob, ...]]]
    seen = []

    def spy(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: bool
    ) -> CycleResult:
        seen.append(
            (
                now,
                tuple((r.id, r.attained_at(now), r.expected_end_s) for r in snapshot.running),
                tuple(pending),
            )
        )
        return run_cycle(snapshot, pending, policy, now, **kw)

    monkeypatch.setattr(engine_mod, "run_cycle", spy)
    r = run([tj("a", 0.0, 100.0, gpus=2, estimate=40.0), tj("b", 30.0, 10.0, gpus=2)])
    assert rec(r, "a").finish_s == 100.0
    now, running, pend = seen[1]
    assert now == 30.0
    assert running == (("a", 2 * 30.0, 40.0),)  # expected end from the estimate, not the truth
    assert [(p.id, p.estimate_s) for p in seen[0][2]] == [("a", 40.0)]


def test_estimator_hook_fills_pending_estimates(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[float | None] = []

    def spy(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: bool
    ) -> CycleResult:
        got.extend(p.estimate_s for p in pending)
        return run_cycle(snapshot, pending, policy, now, **kw)

    monkeypatch.setattr(engine_mod, "run_cycle", spy)
    simulate(
        Trace("t", (tj("a", 0.0, 100.0),)),
        one_node(),
        load_policy("fifo"),
        VALIDATE,
        estimator=lambda t: (t.duration_s, None),
    )
    assert got == [100.0]


def test_a_decision_that_cannot_be_applied_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def bogus(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: bool
    ) -> CycleResult:
        task = TaskBinding("g0", 0, "n1", (0,), 1000)
        return CycleResult((Bind("ghost", (task,)),), {}, CycleStats(0, 0, 0, 0, 0))

    monkeypatch.setattr(engine_mod, "run_cycle", bogus)
    with pytest.raises(SimulationError, match="ghost"):
        run([tj("a", 0.0, 10.0)], config=SimConfig())


def test_progress_reaches_its_total() -> None:
    calls: list[tuple[int, int]] = []
    simulate(
        Trace("t", (tj("a", 0.0, 10.0), tj("huge", 1.0, 10.0, gpus=16))),
        one_node(),
        load_policy("fifo"),
        VALIDATE,
        lambda done, total: calls.append((done, total)),
    )
    assert calls[-1] == (4, 4)


def test_repeated_job_id_is_an_error() -> None:
    with pytest.raises(SimulationError, match="repeats"):
        run([tj("a", 0.0, 10.0), tj("a", 1.0, 10.0)])


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        SimConfig(checkpoint_interval_s=0.0)
    with pytest.raises(ValueError):
        SimConfig(restart_cost_s=-1.0)
    with pytest.raises(ValueError):
        SimConfig(cycle_interval_s=-5.0)


def test_an_elastic_job_shrinks_for_an_equal_priority_job_and_grows_back_after_it() -> None:
    # a: elastic, 4 tasks of 2 GPUs (at least 1), 10,000 s of work, checkpoints each 3,600 s;
    # b (same priority, 4 GPUs) arrives at 5,000 s. No one may be evicted for b, but a may
    # give up two tasks: it restarts at once on the two it keeps. When b ends, nothing waits
    # and a has run short for over a minute: it is requeued and placed whole again.
    config = SimConfig(checkpoint_interval_s=3600.0, restart_cost_s=60.0, validate=True)
    a = job("a").task(4, gpu=2).min_available(1).elastic().submitted(0.0)
    b = job("b").task(gpu=4).submitted(5000.0)
    r = run([TraceJob(a.build(), 10_000.0), TraceJob(b.build(), 100.0)], "priority", config)
    assert r.log == (
        (0.0, "bind", "a", ("n1",) * 4),
        (5000.0, "shrink", "a", ("b", "shrunk for b", "n1", "n1")),
        (5000.0, "bind", "b", ("n1",)),
        (5100.0, "finish", "b", ()),
        (5100.0, "grow", "a", ("from 2 of 4 tasks",)),
        (5100.0, "bind", "a", ("n1",) * 4),
        # The work up to the checkpoint at 3,600 s is kept (the 100 s on two tasks, restoring
        # for 60 of them, reached no checkpoint): 6,400 s left, plus 60 s of restore.
        (5100.0 + 60.0 + 6400.0, "finish", "a", ()),
    )
    ra = rec(r, "a")
    assert (ra.preemptions, ra.shrinks, ra.grows, ra.restarts) == (0, 1, 1, 2)
    assert ra.gpu_s == pytest.approx(8 * 5000.0 + 4 * 100.0 + 8 * 6460.0)
    assert (r.stats["shrinks"], r.stats["grows"]) == (1.0, 1.0)
    # Never grown back, it runs on half its tasks at half speed: 6,400 s of work take 12,800 s.
    slow = run(
        [TraceJob(a.build(), 10_000.0), TraceJob(b.build(), 100.0)],
        "priority",
        replace(config, elastic_grow_after_s=1e9),
    )
    assert slow.log[-1] == (5000.0 + 60.0 + 2 * 6400.0, "finish", "a", ())
    # The same job without `elastic` holds all eight GPUs: b waits for it to finish.
    rigid = run(
        [TraceJob(replace(a.build(), elastic=False), 10_000.0), TraceJob(b.build(), 100.0)],
        "priority",
        config,
    )
    assert [(t, k, j) for t, k, j, _ in rigid.log] == [
        (0.0, "bind", "a"),
        (10_000.0, "finish", "a"),
        (10_000.0, "bind", "b"),
        (10_100.0, "finish", "b"),
    ]


def _elastic(submit: float) -> TraceJob:
    """4 tasks of 2 GPUs (at least 1), 10,000 s of work with all four."""
    b = job("a").task(4, gpu=2).min_available(1).elastic().submitted(submit)
    return TraceJob(b.build(), 10_000.0)


@pytest.mark.parametrize(
    ("jobs", "want"),
    [
        pytest.param(
            [tj("c", 0.0, 1000.0, gpus=4), _elastic(1.0)],
            [
                (0.0, "bind", "c"),
                (1.0, "bind", "a"),
                (1000.0, "finish", "c"),
                (1000.0, "grow", "a"),
                (1000.0, "bind", "a"),
                # 500 s of work on two tasks reached no checkpoint: 10,000 s, after 60 s restore
                (11_060.0, "finish", "a"),
            ],
            id="grows when capacity frees and nothing waits",
        ),
        pytest.param(
            [tj("c", 0.0, 30.0, gpus=4), _elastic(1.0)],
            [
                (0.0, "bind", "c"),
                (1.0, "bind", "a"),
                (30.0, "finish", "c"),
                (61.0, "grow", "a"),  # not before it has run short for elastic_grow_after_s
                (61.0, "bind", "a"),
                (10_121.0, "finish", "a"),
            ],
            id="waits out the grow delay",
        ),
        pytest.param(
            [tj("c", 0.0, 1000.0, gpus=4), _elastic(1.0), tj("d", 500.0, 100.0, gpus=8)],
            [
                (0.0, "bind", "c"),
                (1.0, "bind", "a"),
                (1000.0, "finish", "c"),
                # d waits for the whole node: a is not grown over it, and runs at half speed.
                (20_001.0, "finish", "a"),
                (20_001.0, "bind", "d"),
                (20_101.0, "finish", "d"),
            ],
            id="not while a job waits",
        ),
    ],
)
def test_an_elastic_job_running_short_grows_into_idle_capacity(
    jobs: list[TraceJob], want: list[tuple[float, str, str]]
) -> None:
    r = run(jobs)
    assert [(t, kind, j) for t, kind, j, _ in r.log] == want


def test_a_run_stuck_at_one_instant_stops_with_an_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A preemption takes two cycles at one instant (evict, then look at the requeued victim);
    # with the guard lowered to one, that reads as decisions undoing each other for ever.
    monkeypatch.setattr(engine_mod, "_MAX_CYCLES_AT_ONE_INSTANT", 1)
    jobs = [tj("a", 0.0, 10_000.0, priority=0), tj("b", 5000.0, 100.0, priority=10)]
    with pytest.raises(SimulationError, match=r"t=5000.0: 2 cycles at this instant"):
        run(jobs, policy="priority")
    monkeypatch.setattr(engine_mod, "_MAX_CYCLES_AT_ONE_INSTANT", 2)
    assert rec(run(jobs, policy="priority"), "a").preemptions == 1


@pytest.mark.parametrize("policy", ["fifo", "las"])
def test_jobs_of_one_shape_are_bound_to_their_own_task_groups(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second job arrives once the first has ended, to the free state the first was
    placed on, where the core reads the first one's placement back: the bind still names the
    second job's task groups (validate mode checks every bind's tasks against its job)."""
    binds: dict[str, tuple[TaskBinding, ...]] = {}
    real = engine_mod.run_cycle

    def cycle(*args: object, **kw: object) -> CycleResult:
        result = real(*args, **kw)  # type: ignore[arg-type]
        binds.update((d.job_id, d.tasks) for d in result.decisions if isinstance(d, Bind))
        return result

    monkeypatch.setattr(engine_mod, "run_cycle", cycle)
    jobs = [
        TraceJob(job(j).task(2, gpu=2, name=g).submitted(t).build(), 50.0)
        for j, g, t in (("a", "trainer", 0.0), ("b", "worker", 100.0))
    ]
    r = run(jobs, policy)
    assert [(e[1], e[2]) for e in r.log] == [
        ("bind", "a"),
        ("finish", "a"),
        ("bind", "b"),
        ("finish", "b"),
    ]
    assert sorted((t.group, t.index) for t in binds["b"]) == [("worker", 0), ("worker", 1)]
    assert [t.gpus for t in binds["b"]] == [t.gpus for t in binds["a"]]


def test_an_elastic_job_starts_at_what_its_queue_has_room_for_and_grows_as_it_frees() -> None:
    # Queue capped may hold 4 GPUs. c (2 GPUs of it) runs until 1,000 s; a (elastic, 4 tasks of
    # one GPU, at least 1) arrives at 1 s: it starts with the 2 tasks its queue has room for,
    # not waiting for c. d (another queue) ends at 500 s with nothing waiting: the node has
    # idle GPUs, but a's queue would take it back no larger, so it is not grown until c ends.
    queues = QueueTree((Queue("default"), Queue("capped", limit=Resources(gpu=4))))
    c = job("c").task(gpu=2).queue("capped").submitted(0.0)
    d = job("d").task(gpu=2).submitted(0.0)
    a = job("a").task(4, gpu=1).min_available(1).elastic().queue("capped").submitted(1.0)
    trace = Trace(
        "t",
        (
            TraceJob(c.build(), 1000.0),
            TraceJob(d.build(), 500.0),
            TraceJob(a.build(), 10_000.0),
        ),
    )
    r = simulate(trace, one_node(), load_policy("fifo"), VALIDATE, queues=queues)
    assert r.log[:7] == (
        (0.0, "bind", "c", ("n1",)),
        (0.0, "bind", "d", ("n1",)),
        (1.0, "bind", "a", ("n1", "n1")),
        (500.0, "finish", "d", ()),
        (1000.0, "finish", "c", ()),
        (1000.0, "grow", "a", ("from 2 of 4 tasks",)),
        (1000.0, "bind", "a", ("n1",) * 4),
    )
    assert (rec(r, "a").grows, r.stats["grows"]) == (1, 1.0)


def test_a_user_at_a_queues_per_user_limit_waits_while_others_run_and_grows_within_it() -> None:
    # Queue team lets each user hold 4 GPUs. Alice's elastic job starts with the 2 tasks her
    # 2-GPU job leaves her, her third job waits while bob's starts on idle GPUs; when c ends,
    # w starts and a grows to the 3 tasks her limit leaves, then to 4 when w ends: never to
    # the node's 8.
    queues = QueueTree((Queue("default"), Queue("team", user_limit=Resources(gpu=4))))
    c = job("c").task(gpu=2).queue("team").user("alice").submitted(0.0)
    a = job("a").task(6, gpu=1).min_available(1).elastic().queue("team").user("alice")
    w = job("w").task(gpu=1).queue("team").user("alice").submitted(2.0)
    b = job("b").task(gpu=1).queue("team").user("bob").submitted(3.0)
    trace = Trace(
        "t",
        (
            TraceJob(c.build(), 1000.0),
            TraceJob(a.submitted(1.0).build(), 10_000.0),
            TraceJob(w.build(), 10.0),
            TraceJob(b.build(), 10.0),
        ),
    )
    r = simulate(trace, one_node(), load_policy("fifo"), VALIDATE, queues=queues)
    assert r.log == (
        (0.0, "bind", "c", ("n1",)),
        (1.0, "bind", "a", ("n1", "n1")),
        (3.0, "bind", "b", ("n1",)),
        (13.0, "finish", "b", ()),
        (1000.0, "finish", "c", ()),
        (1000.0, "bind", "w", ("n1",)),
        (1000.0, "grow", "a", ("from 2 of 6 tasks",)),
        (1000.0, "bind", "a", ("n1", "n1", "n1")),
        (1010.0, "finish", "w", ()),
        (1060.0, "grow", "a", ("from 3 of 6 tasks",)),
        (1060.0, "bind", "a", ("n1", "n1", "n1", "n1")),
        (16_120.0, "finish", "a", ()),
    )

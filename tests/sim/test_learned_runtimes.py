"""The simulator with learned and oracle runtimes: no leakage from the future, reservations that
backfill never delays, ETAs and accuracy figures, and the estimator hook's contract."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

import aisched.sim.engine as engine_mod
from aisched.core.cycle import CycleResult, run_cycle
from aisched.core.policy import PRESETS, Policy, build_policy, preset, with_eta
from aisched.core.snapshot import PendingJob, Snapshot
from aisched.predict import (
    JobFeatures,
    LeakageError,
    Prediction,
    PredictorConfig,
    RuntimePredictor,
)
from aisched.predict.calibration import ConformalUpper, Group
from aisched.predict.runtime import _calibration_groups
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import Oracle, OwnEstimate, PredictedRuntime, estimator_for
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import Trace, TraceJob, load_philly, one_queue, synthetic_trace
from aisched.testing import cluster, job, node

GOLDEN = Path(__file__).parent / "golden"


class SpyPredictor(RuntimePredictor):
    """Records, for every prediction, the latest finish observed before it, and what the
    calibration would answer then; for every finish, the residual it adds."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        super().__init__(config)
        self.finished: dict[str, float] = {}
        self.asked: list[tuple[float, float]] = []  # (prediction time, latest finish seen)
        # (prediction time, residuals the calibration holds then)
        self.calibrated_from: list[tuple[float, int]] = []
        # (prediction time, the job's groups, the calibration's margin for them then)
        self.margins: list[tuple[float, tuple[Group, ...], tuple[float, str] | None]] = []
        # (finish time, groups, residual, covered) of every job scored at its finish
        self.residuals: list[tuple[float, tuple[Group, ...], float, bool]] = []
        # (refresh time, the job's groups, the margin it was given then), as `margins`
        self.refreshes: list[tuple[float, tuple[Group, ...], tuple[float, str] | None]] = []

    def observe(self, features: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.finished[features.job_id] = finished_s
        given = self._given.get(features.job_id)
        if given is not None:
            y = math.log(max(runtime_s, 1.0))
            covered = y <= given[1]
            self.residuals.append(
                (finished_s, _calibration_groups(features), y - given[0], covered)
            )
        super().observe(features, runtime_s, finished_s)

    def predict(self, features: JobFeatures) -> Prediction:
        self.asked.append((features.now_s, max(self.finished.values(), default=-1.0)))
        self.calibrated_from.append((features.now_s, len(self.calibration)))
        groups = _calibration_groups(features)
        self.margins.append((features.now_s, groups, self.calibration.margin(groups)))
        return super().predict(features)

    def refresh(self, job_id: str, now_s: float) -> float | None:
        self.asked.append((now_s, max(self.finished.values(), default=-1.0)))
        got = super().refresh(job_id, now_s)
        given = self._given.get(job_id)
        if got is not None and given is not None:
            # The margin it refreshed with, as the median and the bound now given say.
            self.refreshes.append((now_s, given[2], (given[1] - given[0], "")))
        return got


def test_the_predictor_never_sees_a_job_that_has_not_finished() -> None:
    trace = load_philly(GOLDEN / "tiny-philly.csv")
    est = PredictedRuntime()
    spy = SpyPredictor()
    est.predictor = spy
    c = cluster(node("n1").gpus(8), node("n2").gpus(8))
    result = simulate(trace, c, preset("qssf"), SimConfig(validate=True), estimator=est)
    assert spy.asked and all(latest <= now for now, latest in spy.asked)
    # Every observation is a real finish, at its real time, and only finished jobs are seen.
    finishes = {r.job_id: r.finish_s for r in result.jobs if r.finish_s is not None}
    assert spy.finished == finishes
    # The calibration's residuals at each prediction are exactly those of the jobs finished by
    # then (every job here was predicted before it ran, so each finish adds one).
    done = sorted(finishes.values())
    want = [(now, sum(1 for f in done if f <= now)) for now, _ in spy.calibrated_from]
    assert spy.calibrated_from == want


@pytest.mark.parametrize("half_life", [0, 3])
@pytest.mark.parametrize("backlog_bound", ["started", "waited"])
def test_each_calibrated_bound_comes_from_residuals_of_jobs_finished_before_it(
    backlog_bound: str, half_life: int
) -> None:
    """Every margin the calibration gives, per group and in all, at a prediction or at a
    refresh when a job starts, equals the one rebuilt from only the residuals of jobs that had
    finished by then, and with the level moved only by their misses (windows and group sizes
    small enough here that the groups, the fallback to all jobs and the windows' ends all come
    into play; the level adapts fast, so a miss it learnt too early would change a margin;
    with a half-life, a residual learnt too early would also move the others' weights).
    Whichever bound of a running job the backlog reads (the one it started with or the one it
    waited with), both come from such margins."""
    trace = load_philly(GOLDEN / "tiny-philly.csv")
    cfg = PredictorConfig(
        calib_window=8,
        calib_group_window=4,
        calib_min_group=3,
        calib_adapt=0.05,
        calib_refresh=True,
        calib_half_life=half_life,
    )
    est = PredictedRuntime(cfg)
    spy = SpyPredictor(cfg)
    est.predictor = spy
    c = cluster(node("n1").gpus(8), node("n2").gpus(8))
    cfg_qssf = copy.deepcopy(PRESETS["qssf"])
    cfg_qssf["actions"][0] = {**cfg_qssf["actions"][0], "backlog_bound": backlog_bound}
    policy = build_policy(cfg_qssf, name="qssf")
    simulate(trace, c, policy, SimConfig(validate=True), estimator=est)
    assert any(m is not None for _, _, m in spy.margins)
    assert spy.calibration.level_now != cfg.upper_quantile  # the level did move
    assert spy.refreshes and spy.stats.refreshed == len(spy.refreshes)
    assert all(latest <= now for now, latest in spy.asked)
    for now, groups, margin in spy.margins + spy.refreshes:
        rebuilt = ConformalUpper(
            cfg.upper_quantile,
            cfg.calib_window,
            cfg.calib_group_window,
            cfg.calib_min_group,
            cfg.calib_adapt,
            cfg.calib_half_life,
        )
        for finished, gs, residual, covered in spy.residuals:
            if finished <= now:
                rebuilt.add(gs, residual, covered)
        want = rebuilt.margin(groups)
        if margin is not None and margin[1] == "":  # a refresh: its margin, from the bound
            assert want is not None and math.isclose(want[0], margin[0], abs_tol=1e-9), now
        else:
            assert want == margin, now


def test_a_predictor_asked_about_the_past_refuses() -> None:
    est = PredictedRuntime()
    tj = TraceJob(job("a").task(gpu=1).build(), 100.0)
    est.observe(tj, 100.0, 100.0)
    with pytest.raises(LeakageError):
        est.estimate(TraceJob(job("b").task(gpu=1).build(), 5.0), 50.0)


def test_the_engine_feeds_estimators_in_time_order() -> None:
    calls: list[tuple[str, str, float]] = []

    class Recorder:
        def estimate(self, tj: TraceJob, now_s: float) -> tuple[float | None, float | None]:
            calls.append(("estimate", tj.job.id, now_s))
            return None, None

        def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
            calls.append(("start", tj.job.id, now_s))
            return None

        def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
            calls.append(("observe", tj.job.id, finished_s))

    trace = Trace(
        "t",
        (
            TraceJob(job("a").task(gpu=8).build(), 100.0),
            TraceJob(job("b").task(gpu=8).submitted(10.0).build(), 50.0),
        ),
    )
    simulate(trace, cluster(node("n1").gpus(8)), preset("fifo"), estimator=Recorder())
    assert calls == [
        ("estimate", "a", 0.0),
        ("start", "a", 0.0),
        ("estimate", "b", 10.0),
        ("observe", "a", 100.0),
        ("start", "b", 100.0),
        ("observe", "b", 150.0),
    ]


def test_a_job_runs_with_the_upper_bound_it_was_given_at_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine asks for the bound again as a job starts: the running job's expected end
    and the bound it is scored with (its record) come from that answer, not from the one it
    waited with; the running view keeps the end the one it waited with gives beside it
    (`waited_end_s`, for the backlog), where a new one replaced it."""

    class Refreshing:
        def estimate(self, tj: TraceJob, now_s: float) -> tuple[float | None, float | None]:
            return 10.0, 20.0

        def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
            return 50.0 if tj.job.id == "b" else None

        def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
            return None

    ends: dict[str, tuple[float | None, float | None]] = {}

    def spy(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: bool
    ) -> CycleResult:
        ends.update((r.id, (r.expected_end_s, r.waited_end_s)) for r in snapshot.running)
        return run_cycle(snapshot, pending, policy, now, **kw)

    monkeypatch.setattr(engine_mod, "run_cycle", spy)
    trace = Trace(
        "t",
        (
            TraceJob(job("a").task(gpu=8).build(), 100.0),
            TraceJob(job("b").task(gpu=4).submitted(10.0).build(), 100.0),
            TraceJob(job("c").task(gpu=8).submitted(120.0).build(), 10.0),
        ),
    )
    result = simulate(trace, cluster(node("n1").gpus(8)), preset("fifo"), estimator=Refreshing())
    records = {r.job_id: r for r in result.jobs}
    assert {j: (r.estimate_s, r.estimate_upper_s) for j, r in records.items()} == {
        "a": (10.0, 20.0),
        "b": (10.0, 50.0),
        "c": (10.0, 20.0),
    }
    # "a" runs 0..100 with its bound of 20 s; "b" starts at 100 with 50 s (it waited with
    # 20 s), while "c" waits.
    assert (ends["a"], ends["b"]) == ((20.0, None), (150.0, 120.0))


@pytest.mark.parametrize(
    ("policy", "choice", "kind"),
    [
        ("qssf", "auto", PredictedRuntime),
        ("fifo", "auto", OwnEstimate),
        ("las", "auto", OwnEstimate),
        ("fifo-backfill", "auto", PredictedRuntime),
        ("fifo", "predict", PredictedRuntime),
        ("srtf-oracle", "auto", Oracle),
        ("sjf-oracle", "auto", Oracle),
        ("qssf", "oracle", Oracle),
        ("qssf", "own", OwnEstimate),
    ],
)
def test_estimator_choice(policy: str, choice: str, kind: type) -> None:
    assert isinstance(estimator_for(preset(policy), choice), kind)


def test_an_unknown_estimator_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown estimator 'magic'"):
        estimator_for(preset("qssf"), "magic")


def _reservation_starts(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """First reservation start of every job that got one, recorded from the cycles."""
    first: dict[str, float] = {}

    def spy(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: bool
    ) -> CycleResult:
        result = run_cycle(snapshot, pending, policy, now, **kw)
        for r in result.reserves:
            if r.start_s is not None:
                first.setdefault(r.job_id, r.start_s)
        return result

    monkeypatch.setattr(engine_mod, "run_cycle", spy)
    return first


def test_backfill_never_delays_the_reserved_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact runtimes, one queue, FIFO order: each reserved job starts no later than the first
    reservation it was given, however much was backfilled meanwhile."""
    starts = _reservation_starts(monkeypatch)
    trace = one_queue(synthetic_trace(300, seed=4, arrival_rate_per_h=120.0))
    c = cluster(*(node(f"n{i}").gpus(8).rack(f"r{i // 2}") for i in range(4)))
    result = simulate(
        trace, c, preset("fifo-backfill"), SimConfig(validate=True), estimator=Oracle()
    )
    backfilled = sum(1 for e in result.log if e[1] == "bind")
    assert len(starts) >= 10 and backfilled == 300
    first_start = {r.job_id: r.first_start_s for r in result.jobs}
    late = {j: (s, first_start[j]) for j, s in starts.items() if first_start[j] > s}  # type: ignore[operator]
    assert late == {}


STREAM_END_S = 60_000.0


def stream_trace() -> Trace:
    """A 16-GPU gang of 500 s at t=50, and 1-GPU jobs of 1,000 s every 100 s: the gang never
    finds two empty nodes while the stream lasts unless someone holds them for it."""
    jobs = [TraceJob(job("gang").gang(2, gpu=8).submitted(50.0).build(), 500.0)]
    for i in range(int(STREAM_END_S // 100)):
        jobs.append(TraceJob(job(f"s{i:04d}").task(gpu=1).submitted(i * 100.0).build(), 1000.0))
    return Trace("stream", tuple(sorted(jobs, key=lambda tj: (tj.job.submit_time_s, tj.job.id))))


def gang_start(policy: str) -> float | None:
    c = cluster(node("n1").gpus(8), node("n2").gpus(8))
    result = simulate(stream_trace(), c, preset(policy), estimator=Oracle())
    return next(r.first_start_s for r in result.jobs if r.job_id == "gang")


def test_shortest_first_alone_starves_the_large_gang() -> None:
    start = gang_start("sjf-oracle")
    assert start is not None and start > STREAM_END_S


@pytest.mark.parametrize("policy", ["qssf", "qssf-backfill"])
def test_qssf_promotes_the_starving_gang_and_holds_nodes_for_it(policy: str) -> None:
    start = gang_start(policy)
    # Promoted at the first cycle after 12 h of waiting (cycles come every 100 s), then it
    # waits only for the 1,000 s jobs already running.
    assert start is not None and 43_250.0 <= start <= 43_250.0 + 100.0 + 1000.0


def test_eta_and_estimate_accuracy_are_reported() -> None:
    trace = one_queue(synthetic_trace(200, seed=5, arrival_rate_per_h=200.0))
    c = cluster(node("n1").gpus(8), node("n2").gpus(8))
    exact = simulate(trace, c, with_eta(preset("fifo")), SimConfig(), estimator=Oracle())
    m = compute_metrics(exact)
    assert m.estimate_mdae_s == 0.0 and m.estimate_under_upper == 1.0
    assert m.estimate_median_ratio == 1.0
    assert m.eta_jobs > 50 and m.eta_mdae_s is not None and m.eta_within_1h is not None
    learned = compute_metrics(simulate(trace, c, preset("fifo"), estimator=PredictedRuntime()))
    assert learned.estimated_jobs == learned.jobs_finished > 150
    assert learned.estimate_mdae_s is not None
    assert learned.eta_jobs == 0 and learned.eta_mdae_s is None  # no eta action, no ETAs


def test_decisions_do_not_depend_on_the_eta_action() -> None:
    trace = synthetic_trace(150, seed=6, arrival_rate_per_h=200.0)
    c = cluster(node("n1").gpus(8), node("n2").gpus(8))
    plain = simulate(trace, c, preset("qssf"), estimator=Oracle())
    with_etas = simulate(trace, c, with_eta(preset("qssf")), estimator=Oracle())
    assert plain.log == with_etas.log


def test_a_job_past_its_estimate_is_preempted_and_requeued_as_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`long` is estimated at 1 h but runs 20,000 s. At 9,000 s it has outlived its estimate,
    so qssf takes it to have as long again to go and evicts it for a short job; requeued with
    7,200 s of checkpointed work, it is estimated at that much again (plus the restore), not at
    the restore alone, which would put it ahead of every job."""
    seen: dict[str, list[float | None]] = {}

    def spy(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: bool
    ) -> CycleResult:
        for pj in pending:
            seen.setdefault(pj.id, []).append(pj.estimate_s)
        return run_cycle(snapshot, pending, policy, now, **kw)

    monkeypatch.setattr(engine_mod, "run_cycle", spy)
    trace = Trace(
        "overdue",
        (
            TraceJob(job("long").task(gpu=8).build(), 20_000.0),
            TraceJob(job("short").task(gpu=8).submitted(9000.0).build(), 100.0),
        ),
    )
    guesses = {"long": 3600.0, "short": 100.0}
    result = simulate(
        trace,
        cluster(node("n1").gpus(8)),
        preset("qssf"),
        SimConfig(validate=True),
        estimator=lambda tj: (guesses[tj.job.id], None),
    )
    assert [e[:3] for e in result.log if e[1] != "finish"] == [
        (0.0, "bind", "long"),
        (9000.0, "preempt", "long"),
        (9000.0, "bind", "short"),
        (9100.0, "bind", "long"),
    ]
    # Requeued, it is seen by the cycle that follows its stop at 9,000 s and by the one that
    # places it at 9,100 s.
    assert seen["long"] == [3600.0, 60.0 + 7200.0, 60.0 + 7200.0]


def test_preempting_by_order_with_learned_estimates_does_not_evict_back_and_forth() -> None:
    """srtf-oracle with the learned predictor on one GPU: a runs with 1 h to its upper bound;
    b arrives, judged by its median (less than that), and evicted a; a, requeued, was judged
    by its median too and evicted b, and so on at one instant until the run aborted. Both
    sides are judged by the upper bound now: b waits for a, and both finish."""
    trace = Trace(
        "t5",
        (
            TraceJob(job("a").task(gpu=1).build(), 1000.0),
            TraceJob(job("b").task(gpu=1).submitted(1.0).build(), 500.0),
        ),
    )
    result = simulate(
        trace,
        cluster(node("n1").gpus(1)),
        preset("srtf-oracle"),
        SimConfig(validate=True),
        estimator=PredictedRuntime(),
    )
    assert [e[:3] for e in result.log] == [
        (0.0, "bind", "a"),
        (1000.0, "finish", "a"),
        (1000.0, "bind", "b"),
        (1500.0, "finish", "b"),
    ]

"""Conformal calibration of the upper bound: the quantile, the groups, the coverage it restores
on a drifting workload, and the running score the service exports."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from aisched.predict import JobFeatures, LeakageError, PredictorConfig, RuntimePredictor
from aisched.predict.calibration import (
    ConformalUpper,
    Score,
    conformal_quantile,
    weighted_conformal_quantile,
)
from aisched.testing import job


def feats(job_id: str, *, user: str = "u", gpus: int = 1, now: float = 0.0) -> JobFeatures:
    j = job(job_id).task(gpu=gpus).user(user).submitted(now).build()
    return JobFeatures.from_job(j, now)


def test_the_conformal_quantile_takes_the_finite_sample_rank() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    # ceil(11 * 0.9) = 10: the 10th smallest.
    assert conformal_quantile(values, 0.9) == 10.0
    # ceil(11 * 0.5) = 6.
    assert conformal_quantile(values, 0.5) == 6.0
    # Past n: the largest.
    assert conformal_quantile([1.0, 2.0], 0.9) == 2.0


@pytest.mark.parametrize("n", [1, 2, 10, 49, 2000])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.95])
def test_with_equal_weights_the_weighted_quantile_is_the_conformal_one(
    n: int, level: float
) -> None:
    values = [float(v) for v in np.random.default_rng(n).standard_normal(n)]
    got = weighted_conformal_quantile(values, np.ones(n), level)
    assert got == conformal_quantile(values, level)


def test_with_a_half_life_the_bound_follows_a_drift_within_the_window() -> None:
    """200 jobs that ran as predicted, then 15 that ran e^3 times longer: all 215 weighing
    alike, the 0.9 quantile is still 0 (rank 195 of 215); with weights halving every 10
    residuals, the last 15 weigh most (about 9.6 of 15.9 with the new job's 1)."""
    alike = ConformalUpper(level=0.9, window=500, group_window=500, min_group=1)
    recent = ConformalUpper(level=0.9, window=500, group_window=500, min_group=1, half_life=10)
    for r in [0.0] * 200 + [3.0] * 15:
        alike.add((("user", "a"),), r)
        recent.add((("user", "a"),), r)
    assert alike.margin((("user", "a"),)) == (0.0, "user")
    assert recent.margin((("user", "a"),)) == (3.0, "user")
    # Only the window counts: 15 of the last 20 are 3.0 either way, and with too little weight
    # under the level, the largest is the answer.
    short = ConformalUpper(level=0.9, window=20, group_window=20, min_group=1, half_life=10**9)
    for r in [0.0] * 200 + [3.0] * 15:
        short.add((), r)
    assert short.margin(()) == (3.0, "all")


def test_a_negative_half_life_is_refused() -> None:
    with pytest.raises(ValueError, match="calib_half_life"):
        PredictorConfig(calib_half_life=-1)


def test_a_group_with_enough_residuals_comes_before_all() -> None:
    c = ConformalUpper(level=0.5, window=100, group_window=100, min_group=3)
    assert c.margin((("user", "a"),)) is None
    for r in (1.0, 2.0, 3.0):
        c.add((("user", "a"),), r)
    for r in (10.0, 20.0, 30.0):
        c.add((("user", "b"),), r)
    assert c.margin((("user", "a"),)) == (2.0, "user")
    assert c.margin((("user", "b"),)) == (20.0, "user")
    # A user with too few residuals of her own: all six (ceil(7 * 0.5) = 4th smallest).
    assert c.margin((("user", "c"),)) == (10.0, "all")
    assert len(c) == 6


def test_the_margin_never_goes_below_the_median() -> None:
    c = ConformalUpper(level=0.9, window=10, group_window=10, min_group=2)
    for _ in range(3):
        c.add((("user", "a"),), -2.0)  # every job ran shorter than predicted
    assert c.margin((("user", "a"),)) == (0.0, "user")


def test_the_score_counts_coverage_and_the_median_error_ratio() -> None:
    s = Score(window=10)
    assert (s.coverage, s.median_error_ratio) == (None, None)
    s.add(runtime_s=100.0, median_s=50.0, upper_s=200.0)  # ratio 2, covered
    s.add(runtime_s=100.0, median_s=100.0, upper_s=90.0)  # ratio 1, not covered
    s.add(runtime_s=400.0, median_s=100.0, upper_s=300.0)  # ratio 4, not covered
    assert (s.scored, s.coverage, s.median_error_ratio) == (3, 1 / 3, 2.0)


def _drifting_coverage(calibrate: bool) -> tuple[float, float]:
    """A workload whose runtimes spread more and more (log sd from 0.2 to 1.5): the learned
    0.9-quantile lags behind. Returns (coverage of the last 1,000 jobs, the score's coverage).
    Windows of 400 residuals, 300 per group: short beside the drift, so the bound follows it."""
    cfg = PredictorConfig(min_fit=300, refit_every=500, window=1000, max_iter=20,
                          calibrate=calibrate, calib_window=400, calib_group_window=300,
                          calib_min_group=50)  # fmt: skip
    p = RuntimePredictor(cfg)
    rng = np.random.default_rng(7)
    n = 3000
    hits: list[bool] = []
    for i in range(n):
        t = 10.0 * i
        f = feats(f"j{i}", user="alice" if i % 2 else "bob", now=t)
        got = p.predict(f)
        sd = 0.2 + 1.3 * i / n
        runtime = float(np.exp(math.log(600.0) + sd * rng.standard_normal()))
        if i >= n - 1000:
            hits.append(runtime <= got.upper_s)
        p.observe(f, runtime, finished_s=t)
    assert p.score.coverage is not None
    return sum(hits) / len(hits), p.score.coverage


def test_calibration_restores_the_nominal_coverage_on_later_jobs() -> None:
    raw, _ = _drifting_coverage(calibrate=False)
    calibrated, score = _drifting_coverage(calibrate=True)
    assert raw < 0.85  # the uncalibrated bound lags the drift
    assert calibrated >= 0.87
    assert 0.85 <= score <= 0.95


def test_an_answer_from_the_users_own_estimate_is_not_calibrated() -> None:
    p = RuntimePredictor(PredictorConfig(calib_min_group=2))
    for i in range(3):
        f = feats(f"a{i}", now=float(i))
        p.predict(f)
        p.observe(f, 1000.0, finished_s=float(i))
    got = p.predict(replace(feats("told", user="new", now=5.0), estimate_s=30.0))
    assert (round(got.median_s, 6), round(got.upper_s, 6), got.source) == (30.0, 30.0, "own")


def test_the_adaptive_level_moves_with_each_scored_finish() -> None:
    c = ConformalUpper(level=0.9, window=10, group_window=10, min_group=1, adapt=0.1)
    c.add((), 1.0, covered=False)  # a miss: up by 0.1 * 0.9
    assert math.isclose(c.level_now, 0.9 + 0.1 * 0.9)
    c.add((), 1.0, covered=True)  # a hit: down by 0.1 * 0.1
    assert math.isclose(c.level_now, 0.9 + 0.1 * 0.9 - 0.1 * 0.1)
    c.add((), 1.0)  # not scored: the level stays
    assert math.isclose(c.level_now, 0.98)
    fixed = ConformalUpper(level=0.9, window=10, group_window=10, min_group=1)
    fixed.add((), 1.0, covered=False)
    assert fixed.level_now == 0.9


def _burst_coverage(adapt: float, seed: int) -> float:
    """Bursts of 100 alike jobs, each burst bounded before any of its jobs finishes: the
    burst's log residuals share a shift (sd 1) and spread little among themselves (sd 0.3).
    Returns the share of jobs under the bound they were given."""
    rng = np.random.default_rng(seed)
    c = ConformalUpper(level=0.9, window=500, group_window=500, min_group=50, adapt=adapt)
    hits: list[bool] = []
    for _ in range(60):
        got = c.margin(())
        residuals = rng.standard_normal() + 0.3 * rng.standard_normal(100)
        for r in residuals:
            covered = None if got is None else bool(r <= got[0])
            if covered is not None:
                hits.append(covered)
            c.add((), float(r), covered)
    return sum(hits) / len(hits)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_adaptive_level_restores_the_coverage_that_bursts_take(seed: int) -> None:
    """A window of recent residuals cannot foresee a burst's shared shift, so a fixed level
    covers short of nominal; a level that follows the misses comes back to about nominal."""
    assert _burst_coverage(0.0, seed) < 0.86
    assert _burst_coverage(0.002, seed) >= 0.88


def _burst_after(cfg: PredictorConfig) -> tuple[RuntimePredictor, float, float]:
    """Warm jobs that run as predicted, then job "x" predicted with a burst of its user's
    alike jobs, which all run ten times their median and finish before "x" starts. Returns
    the predictor, x's log median and the log upper bound it was predicted with."""
    p = RuntimePredictor(cfg)
    for i in range(6):
        f = feats(f"w{i}", now=float(i))
        p.predict(f)
        p.observe(f, 100.0, finished_s=float(i))
    x = p.predict(feats("x", now=10.0))
    burst = [feats(f"b{i}", now=10.0) for i in range(6)]
    medians = [p.predict(f).median_s for f in burst]
    for i, (f, m) in enumerate(zip(burst, medians, strict=True)):
        p.observe(f, 10.0 * m, finished_s=20.0 + i)
    return p, math.log(x.median_s), math.log(x.upper_s)


def test_a_refreshed_bound_takes_the_margin_the_finishes_since_taught() -> None:
    cfg = PredictorConfig(calib_min_group=3, calib_window=4, calib_group_window=4)
    p, mid, up = _burst_after(replace(cfg, calib_refresh=True))
    margin = p.calibration.margin((("user-gpus", "u", 1.0), ("user", "u")))
    assert margin is not None and mid + margin[0] > up + 1.0  # the burst taught a wider one
    got = p.refresh("x", 30.0)
    assert got is not None and math.isclose(math.log(got), mid + margin[0])
    assert p.stats.refreshed == 1
    # "x" runs five times its median: over the bound it was predicted with, under the
    # refreshed one, which is the one scored (the last four scored: three of the burst,
    # all misses, and "x").
    p.observe(feats("x", now=10.0), 5.0 * math.exp(mid), finished_s=40.0)
    assert p.score.coverage == 0.25


def test_without_refresh_a_job_keeps_the_bound_it_was_predicted_with() -> None:
    cfg = PredictorConfig(calib_min_group=3, calib_window=4, calib_group_window=4)
    p, mid, _ = _burst_after(replace(cfg, calib_refresh=False))
    assert p.refresh("x", 30.0) is None and p.stats.refreshed == 0
    p.observe(feats("x", now=10.0), 5.0 * math.exp(mid), finished_s=40.0)
    assert p.score.coverage == 0.0  # "x" missed, as the burst did


def test_a_refresh_before_a_seen_finish_is_refused() -> None:
    p, _, _ = _burst_after(PredictorConfig(calib_min_group=3, calib_refresh=True))
    with pytest.raises(LeakageError):
        p.refresh("x", 24.0)  # the burst's last job finished at 25


def test_only_a_calibrated_prediction_is_refreshed() -> None:
    p = RuntimePredictor(PredictorConfig(calib_min_group=2, calib_refresh=True))
    assert p.refresh("never-predicted", 0.0) is None
    p.predict(feats("early", now=0.0))
    assert p.refresh("early", 0.0) is None  # no residuals yet
    for i in range(3):
        f = feats(f"a{i}", now=float(i))
        p.predict(f)
        p.observe(f, 1000.0, finished_s=float(i))
    p.predict(replace(feats("told", user="new", now=5.0), estimate_s=30.0))
    assert p.refresh("told", 5.0) is None  # its own estimate
    assert p.refresh("early", 5.0) is not None

"""`RuntimePredictor`: a job's runtime (median and upper bound) learned online from the jobs
that have finished.

How it is fed: call `observe(features, runtime_s, finished_s)` when a job finishes (its run
time, not its wait), and `predict(features)` when a job becomes pending. Both the simulator and
the service do exactly that.

How it answers:
1. Each job is turned into a numeric row once, when it is first predicted: its GPU count,
   tasks, kind, hour of submission, how many jobs its user submitted in the hour before and how
   long since the previous one, and the median and last runtimes of recently finished jobs of
   the same name, user, user and GPU count, queue, and queue and GPU count. That row is kept,
   and becomes a training example when the job finishes.
2. Until `min_fit` jobs have finished, the answer is a history median: of the same job name,
   else the same user and GPU count, else the user, the queue and GPU count, the queue, all
   jobs, and finally `prior_s`. The upper bound is the same group's `upper_quantile`, or the
   median times `upper_factor` when the group is small. A job that gives its own estimate gets
   that instead (both median and upper, source `own`) while fewer than `min_similar` jobs
   similar to it have finished: jobs of its name, or, for a job without one, of its user and
   GPU count. The coarser groups (user, queue, all) never outweigh it: a user's five 1-second
   `true` runs say nothing about her `sleep 30` of another name, which she said takes 30 s.
3. From then on two gradient-boosted models on log runtime, one for the median and one for the
   `upper_quantile`, are refitted every `refit_every` finished jobs on the last `window` of them,
   and every prediction uses the latest fit. With `background=True` (the live service) a fit
   runs on a thread of its own, on a copy of the examples, and its models replace the old ones
   when it ends: a refit that takes seconds never holds up the caller (the scheduling loop),
   which predicts with the previous fit meanwhile. The simulator fits in line, so a run is
   repeatable.
4. The upper bound of every answer but `own` is then calibrated (`predict.calibration`): the
   median plus the conformal quantile of the recent residuals log(true / predicted median) of
   finished jobs of the same user and GPU count, else the same user, else all, once there are
   enough of them. `score` keeps the running coverage and median error ratio of what was given.
5. With `calib_refresh`, `refresh(job_id, now_s)` calibrates a predicted job's upper bound
   again when it is about to start: its median stays, its margin is the one the residuals of
   the jobs finished by `now_s` give. A burst's later jobs then start with the margin its first
   finishes taught (see `predict.calibration`). The bound last given is the one scored. The
   simulator (`sim.estimators.PredictedRuntime`) and the live service ask it as a job starts.

No leakage: a prediction asked at `features.now_s` must never use a job that finished after it.
Jobs are observed as they finish, so `predict` refuses (`LeakageError`) a question about a time
before the latest finish it has seen; a training row is the one built when its job was
predicted, or, if it never was, rebuilt from the history cut at its `now_s`.

Deterministic: the same sequence of calls gives the same answers (fits are seeded).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from aisched.predict.calibration import ConformalUpper, Group, Score
from aisched.predict.features import JobFeatures
from aisched.predict.history import RuntimeHistory, Submissions, median, quantile
from aisched.predict.model import FloatArray, QuantileModel

_KINDS = {"train": 0.0, "infer": 1.0, "batch": 2.0}
_NAN = math.nan
# Runtimes are learned as log seconds; one second is the floor.
_MIN_S = 1.0


class LeakageError(ValueError):
    """A prediction was asked for a time before a finish the predictor has already seen."""


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """`refit_every`: finished jobs between fits; `window`: finished jobs a fit learns from;
    `min_fit`: finished jobs before the first fit; `per_key`: recent runtimes kept per group;
    `max_names`: job names with a group of their own;
    `min_similar`: finished jobs of a job's name (of its user and GPU count, for a job without
    a name) before their history is preferred to the job's own estimate;
    `burst_window_s`: how far back submissions count as one burst; `max_iter`, `max_depth`:
    trees per model and their depth."""

    upper_quantile: float = 0.9
    refit_every: int = 2000
    window: int = 20_000
    min_fit: int = 1000
    per_key: int = 32
    # Job names whose recent runtimes are kept (`RuntimeHistory`), the least recently finished
    # dropped first: at about 1.1 KB a name (4.3 KB with `per_key` runtimes), 22 to 87 MB. A
    # name dropped has not finished in the last 20,000 finished jobs (each adds one name at
    # most), as many as a fit learns from (`window`): its runs are out of the model's examples
    # too. The traces of docs/benchmarks.md have far fewer names (numbers dropped, one each).
    max_names: int = 20_000
    prior_s: float = 3600.0
    upper_factor: float = 4.0
    min_similar: int = 5
    burst_window_s: float = 3600.0
    max_iter: int = 60
    max_depth: int = 6
    seed: int = 0
    # Conformal calibration of the upper bound (`predict.calibration`): on by default; the
    # residuals of the last `calib_window` finished jobs, or of the last `calib_group_window` of
    # the job's user and GPU count (else its user) when there are `calib_min_group` of them.
    # Chosen on the tuning week of bench_holdout.py only: its VC submits bursts of about a
    # thousand alike jobs, so a group's window must span several bursts (300 held less than
    # one, and the bound followed the last burst: 79 % coverage; 2,000: 89 %).
    calibrate: bool = True
    calib_window: int = 2000
    calib_group_window: int = 2000
    calib_min_group: int = 50
    # How fast the calibration's level follows its misses (`ConformalUpper.adapt`); 0 keeps it
    # at `upper_quantile`.
    calib_adapt: float = 0.0
    # How many residuals a residual's weight halves over, newest first, so that the bound
    # follows a workload that drifts within a window (`calibration.weighted_conformal_quantile`);
    # 0: every residual of a window weighs alike. Chosen on the tuning week only (500 over 300
    # and none): docs/policies.md, "Runtime estimates".
    calib_half_life: int = 500
    # Whether `refresh` calibrates a predicted job's upper bound again when it starts (else a
    # job keeps the bound it was given when predicted). On: on the tuning week, with qssf's
    # backlog reading the bound a job waited with, coverage went from 87.5 / 88.2 % to
    # 91.0 / 92.3 % and qssf kept its goals there (docs/policies.md, "Runtime estimates").
    calib_refresh: bool = True

    def __post_init__(self) -> None:
        if not 0.5 < self.upper_quantile < 1.0:
            raise ValueError(f"upper_quantile must be in (0.5, 1), got {self.upper_quantile}")
        for name in (
            "refit_every",
            "window",
            "min_fit",
            "per_key",
            "max_names",
            "max_iter",
            "max_depth",
            "calib_window",
            "calib_group_window",
            "calib_min_group",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.calib_half_life < 0:
            raise ValueError(f"calib_half_life must be 0 or more, got {self.calib_half_life}")
        if not 0.0 <= self.calib_adapt < 1.0:
            raise ValueError(f"calib_adapt must be in [0, 1), got {self.calib_adapt}")
        if not self.prior_s > 0 or not self.upper_factor >= 1:
            raise ValueError("prior_s must be positive and upper_factor at least 1")


@dataclass(frozen=True, slots=True)
class Prediction:
    """Median and upper-bound runtime in seconds (upper >= median), and what gave them:
    `model`, `history:<group>`, `prior`, or `own` (the job's own estimate, preferred to a
    history of too few jobs of its name)."""

    median_s: float
    upper_s: float
    source: str


@dataclass(slots=True)
class PredictorStats:
    observed: int = 0
    predicted: int = 0
    fits: int = 0
    fit_wall_s: float = 0.0
    by_source: dict[str, int] = field(default_factory=dict)
    # Upper bounds set by the conformal calibration, by the residuals that gave them.
    calibrated: dict[str, int] = field(default_factory=dict)
    # Upper bounds calibrated again by `refresh`.
    refreshed: int = 0


class RuntimePredictor:
    def __init__(self, config: PredictorConfig | None = None, *, background: bool = False) -> None:
        self.config = config if config is not None else PredictorConfig()
        self.background = background
        self._fitting: threading.Thread | None = None
        c = self.config
        self._history = RuntimeHistory(c.per_key, c.max_names)
        self._submissions = Submissions()
        self._rows: dict[str, FloatArray] = {}  # job id -> its row, from its first prediction
        self._train_x: deque[FloatArray] = deque(maxlen=c.window)
        self._train_y: deque[float] = deque(maxlen=c.window)
        self._since_fit = 0
        # (median, upper), replaced as one: a background fit swaps both in a single assignment.
        self._models: tuple[QuantileModel, QuantileModel] | None = None
        self._latest_finish_s = -math.inf
        # job id -> (log median, log upper) it was last given, to score and calibrate with
        # when it finishes, and its residual groups; None for an answer that was the job's
        # own estimate.
        self._given: dict[str, tuple[float, float, tuple[Group, ...]] | None] = {}
        self.calibration = ConformalUpper(
            c.upper_quantile,
            c.calib_window,
            c.calib_group_window,
            c.calib_min_group,
            c.calib_adapt,
            c.calib_half_life,
        )
        self.score = Score(c.calib_window)
        self.stats = PredictorStats()

    # --- feeding ----------------------------------------------------------------------------

    def observe(
        self, features: JobFeatures, runtime_s: float, finished_s: float, *, fit: bool = True
    ) -> None:
        """A job finished at `finished_s` after running `runtime_s` seconds in all. With
        `fit=False` the example is only learned: a fit that falls due waits for `fit_if_due`
        (a caller feeding a backlog, as the service's warm-up, fits once, on all of it)."""
        if not (runtime_s > 0 and math.isfinite(runtime_s)):
            raise ValueError(f"job {features.job_id}: runtime_s must be positive, got {runtime_s}")
        row = self._rows.pop(features.job_id, None)
        if row is None:
            row = self._row(features, cut_s=features.now_s)
        y = math.log(max(runtime_s, _MIN_S))
        given = self._given.pop(features.job_id, None)
        if given is not None:
            mid, up, _ = given
            self.calibration.add(_calibration_groups(features), y - mid, y <= up)
            self.score.add(max(runtime_s, _MIN_S), math.exp(mid), math.exp(up))
        self._train_x.append(row)
        self._train_y.append(y)
        self._history.add(_keys(features), finished_s, y)
        self._latest_finish_s = max(self._latest_finish_s, finished_s)
        self.stats.observed += 1
        self._since_fit += 1
        if fit:
            self.fit_if_due()

    def fit_if_due(self) -> bool:
        """Fit (see the module) if one is due: `min_fit` jobs observed, and no fit yet or
        `refit_every` observed since the last; never while a background fit runs. True when
        one was started (or, in line, done)."""
        c = self.config
        due = self._models is None or self._since_fit >= c.refit_every
        if self.stats.observed >= c.min_fit and due and not self.fitting:
            self._fit()
            return True
        return False

    def forget(self, job_id: str) -> None:
        """The job will never finish (cancelled, rejected): drop its kept row."""
        self._rows.pop(job_id, None)
        self._given.pop(job_id, None)

    # --- asking -----------------------------------------------------------------------------

    def predict(self, features: JobFeatures) -> Prediction:
        self._check_time(features.job_id, features.now_s)
        row = self._rows.get(features.job_id)
        if row is None:
            row = self._row(features, cut_s=math.inf)
            self._rows[features.job_id] = row
            self._submissions.add(features.user, features.submit_s)
        models = self._models
        if models is not None:
            mid = models[0].predict_one(row)
            up = max(models[1].predict_one(row), mid)
            source = "model"
        else:
            own = self._own_estimate(features)
            if own is not None:
                mid = up = math.log(max(own, _MIN_S))
                source = "own"
            else:
                mid, up, source = self._fallback(features)
        if source == "own":
            self._given[features.job_id] = None
        else:
            up = self._calibrated(features, mid, up)
            self._given[features.job_id] = (mid, up, _calibration_groups(features))
        self.stats.predicted += 1
        self.stats.by_source[source] = self.stats.by_source.get(source, 0) + 1
        return Prediction(math.exp(mid), math.exp(up), source)

    def refresh(self, job_id: str, now_s: float) -> float | None:
        """Called when a predicted job is about to start (an attempt) at `now_s`: its upper
        bound in seconds, calibrated again from the residuals of the jobs finished by then
        (its median stays); it becomes the bound the job is scored and calibrated with when
        it finishes. None, and nothing changes, when `calib_refresh` is off, when the job
        has no predicted answer (never predicted, observed or forgotten since, or its answer
        was its own estimate), or when the calibration has too few residuals yet. Raises
        `LeakageError` for a time before a finish already observed, as `predict` does."""
        if not (self.config.calib_refresh and self.config.calibrate):
            return None
        self._check_time(job_id, now_s)
        given = self._given.get(job_id)
        if given is None:
            return None
        mid, _, groups = given
        got = self.calibration.margin(groups)
        if got is None:
            return None
        up = mid + got[0]
        self._given[job_id] = (mid, up, groups)
        self.stats.refreshed += 1
        return math.exp(up)

    @property
    def fitted(self) -> bool:
        return self._models is not None

    @property
    def fitting(self) -> bool:
        """A background fit is running."""
        return self._fitting is not None and self._fitting.is_alive()

    def wait_for_fit(self, timeout_s: float | None = None) -> bool:
        """Wait for a background fit to end; True when none is running any more."""
        t = self._fitting
        if t is not None:
            t.join(timeout_s)
        return not self.fitting

    # --- internals --------------------------------------------------------------------------

    def _check_time(self, job_id: str, now_s: float) -> None:
        if now_s < self._latest_finish_s:
            raise LeakageError(
                f"job {job_id}: prediction asked at t={now_s:g}s, but a job that finished at "
                f"t={self._latest_finish_s:g}s has been observed"
            )

    def _calibrated(self, f: JobFeatures, mid: float, up: float) -> float:
        """The log upper bound: the median plus the conformal margin of recent residuals once
        there are enough of them (only of jobs finished before now: see the module
        docstring), else the model's or history's own."""
        if not self.config.calibrate:
            return up
        got = self.calibration.margin(_calibration_groups(f))
        if got is None:
            return up
        margin, by = got
        self.stats.calibrated[by] = self.stats.calibrated.get(by, 0) + 1
        return mid + margin

    def _own_estimate(self, f: JobFeatures) -> float | None:
        """The job's own estimate, while fewer than `min_similar` jobs like it have finished:
        jobs of its name, or, for a job without one, of its user and GPU count. The coarser
        groups never count: five 0.1-second `true` runs of a user say nothing about her
        30-second job of another name. None when it gave none, or once they have."""
        own = f.estimate_s
        if own is None or not own > 0:
            return None
        similar = ("name", f.name) if f.name else ("user-gpus", f.user, f.gpus)
        return own if self._history.count(similar) < self.config.min_similar else None

    def _fallback(self, f: JobFeatures) -> tuple[float, float, str]:
        """(log median, log upper, source) from the history of the most specific group with
        enough jobs, else the prior."""
        c = self.config
        for key, label in _fallback_keys(f):
            vals = self._history.values(key)
            if len(vals) >= 3 or (label == "all" and vals):
                mid = median(vals)
                if len(vals) >= 5:
                    up = max(quantile(vals, c.upper_quantile), mid)
                else:
                    up = mid + math.log(c.upper_factor)
                return mid, up, f"history:{label}"
        mid = math.log(c.prior_s)
        return mid, mid + math.log(c.upper_factor), "prior"

    def _row(self, f: JobFeatures, cut_s: float) -> FloatArray:
        h = self._history
        burst, gap = self._submissions.recent(f.user, f.submit_s, self.config.burst_window_s)

        def med(key: Hashable) -> float:
            vals = h.values(key, cut_s)
            return median(vals) if vals else _NAN

        def last(key: Hashable) -> float:
            vals = h.values(key, cut_s)
            return vals[-1] if vals else _NAN

        return np.array(
            [
                f.gpus,
                float(f.tasks),
                _KINDS.get(f.kind, 3.0),
                (f.submit_s / 3600.0) % 24.0,
                med(("name", f.name)) if f.name else _NAN,
                med(("user-gpus", f.user, f.gpus)),
                med(("user", f.user)),
                last(("user", f.user)),
                last(("user-gpus", f.user, f.gpus)),
                med(("queue-gpus", f.queue, f.gpus)),
                med(("queue", f.queue)),
                math.log1p(h.count(("user", f.user))),
                float(burst),
                math.log1p(gap) if not math.isnan(gap) else _NAN,
            ],
            dtype=np.float64,
        )

    def _fit(self) -> None:
        # The examples are copied here, on the caller's thread: later observations go on
        # filling the deques while a background fit learns from this copy.
        x = np.vstack(list(self._train_x))
        y = np.fromiter(self._train_y, dtype=np.float64, count=len(self._train_y))
        self._since_fit = 0
        if not self.background:
            self._fit_on(x, y)
            return
        self._fitting = threading.Thread(
            target=self._fit_on, args=(x, y), name="aisched-predictor-fit", daemon=True
        )
        self._fitting.start()

    def _fit_on(self, x: FloatArray, y: FloatArray) -> None:
        c = self.config
        t0 = time.perf_counter()
        kw = {"max_iter": c.max_iter, "max_depth": c.max_depth, "seed": c.seed}
        self._models = (
            QuantileModel.fit(x, y, 0.5, **kw),
            QuantileModel.fit(x, y, c.upper_quantile, **kw),
        )
        self.stats.fits += 1
        self.stats.fit_wall_s += time.perf_counter() - t0


def _keys(f: JobFeatures) -> tuple[Hashable, ...]:
    keys: list[Hashable] = [
        ("user", f.user),
        ("user-gpus", f.user, f.gpus),
        ("queue", f.queue),
        ("queue-gpus", f.queue, f.gpus),
        ("all",),
    ]
    if f.name:
        keys.append(("name", f.name))
    return tuple(keys)


def _calibration_groups(f: JobFeatures) -> tuple[Group, ...]:
    """Residual groups of a job, most specific first."""
    return (("user-gpus", f.user, f.gpus), ("user", f.user))


def _fallback_keys(f: JobFeatures) -> list[tuple[Hashable, str]]:
    out: list[tuple[Hashable, str]] = []
    if f.name:
        out.append((("name", f.name), "name"))
    out += [
        (("user-gpus", f.user, f.gpus), "user-gpus"),
        (("user", f.user), "user"),
        (("queue-gpus", f.queue, f.gpus), "queue-gpus"),
        (("queue", f.queue), "queue"),
        (("all",), "all"),
    ]
    return out

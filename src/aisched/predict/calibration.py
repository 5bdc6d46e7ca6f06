"""Conformal calibration of the predictor's upper bound, and the predictor's own score.

The boosted 0.9-quantile model is not calibrated: on Philly weeks other than the one it was
first measured on, its bound covered 54-73 % of true runtimes. Split-conformal calibration
fixes the coverage without trusting the model: for every job that finished after being
predicted, the residual `log(true runtime) - log(predicted median)` is kept, and a new job's
upper bound is its median times `exp(q)`, where `q` is the finite-sample conformal quantile
(rank `ceil((n + 1) * level)` of `n`) of the most recent residuals of its own group (its user
and GPU count, else its user) when that group has `min_group` of them, else of all jobs. The
bound then covers about `level` of the runtimes of jobs like the recent ones, whatever the
model; when the workload drifts, the window follows it. The window must be long enough to hold
several of the bursts a user submits (hundreds of alike jobs, all predicted before any of them
has finished, so their residuals move together): a window shorter than a burst holds only the
last burst's residuals, and the bound fits it rather than the next one. Within that long window
recent residuals can weigh more (`half_life`: a residual weighs half as much for every that many
newer ones, `weighted_conformal_quantile`), so the bound follows a workload that drifts in it.

Bursts defeat a fixed level: a burst's jobs are all bounded before any of them finishes, so
their misses come together and the window cannot have seen them coming. With `adapt` (gamma)
above 0 the level itself follows the misses, as adaptive conformal inference does (Gibbs and
Candes, NeurIPS 2021): at each scored finish the level in use moves up by `gamma * (1 - target)`
after a miss and down by `gamma * target` after a hit, where `target` is the nominal level. It
stays still exactly when the misses run at `1 - target`, and over any run the share of misses
differs from `1 - target` by at most about `1 / (gamma * finishes)`, whatever the workload
does: a stretch of misses raises the level until they stop. That bound needs the level left
free: past 1 it gives the largest residual, past 0 the smallest, and what it ran up beyond is a
debt the next finishes pay back (held at 1, a burst's misses would be forgotten, and coverage
measured on bursty Philly-like residuals fell below the fixed level's). It strays past [0, 1]
by at most `gamma` times the predictions outstanding at once.

Invariants:
- Only residuals of jobs that have finished are kept, and they are added when the job is
  observed. The predictor refuses a question about a time before a finish it has seen, so a
  prediction at `now` never uses a residual of a job that finished after `now`.
- The calibration never lowers the bound below the median.
- The level in use moves only on finishes, so it too holds only what was known by `now`.

`Score` keeps the predictor's own running figures, the ones the live service exports: the share
of finished jobs whose runtime was at or under the upper bound they were given, and the median
error ratio `max(pred/true, true/pred)` of the point estimate, over the last `window` finishes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

import numpy as np

from aisched.predict.history import median
from aisched.predict.model import FloatArray

# A residual group: its kind first ("user", "user-gpus"), then the values that name it.
Group = tuple[Hashable, ...]


class ConformalUpper:
    def __init__(
        self,
        level: float,
        window: int,
        group_window: int,
        min_group: int,
        adapt: float = 0.0,
        half_life: int = 0,
    ) -> None:
        self.level = level
        self.min_group = min_group
        self.adapt = adapt
        # Each place's weight, the newest last, for the longest window (a shorter one takes the
        # end of it): halving over every `half_life` newer residuals; None: all weigh alike.
        longest = max(window, group_window)
        self._weights = (
            np.power(0.5, np.arange(longest - 1, -1, -1) / half_life) if half_life > 0 else None
        )
        self.level_now = level
        """The level in use: `level` unless `adapt` moved it (see the module's description)."""
        self._group_window = group_window
        self._all: deque[float] = deque(maxlen=window)
        self._groups: dict[Group, deque[float]] = {}

    def __len__(self) -> int:
        """How many residuals are kept in all."""
        return len(self._all)

    def add(self, groups: tuple[Group, ...], residual: float, covered: bool | None = None) -> None:
        """A finished job's log residual (true over predicted median), in its groups, and
        whether its runtime was at or under the bound it was given (None: not scored, the
        level stays)."""
        if covered is not None and self.adapt > 0:
            self.level_now += self.adapt * ((0.0 if covered else 1.0) - (1.0 - self.level))
        self._all.append(residual)
        for g in groups:
            d = self._groups.get(g)
            if d is None:
                d = self._groups[g] = deque(maxlen=self._group_window)
            d.append(residual)

    def margin(self, groups: tuple[Group, ...]) -> tuple[float, str] | None:
        """(log margin above the median, which residuals gave it), from the first of `groups`
        (most specific first) with enough residuals, else from all; None before there are
        `min_group` residuals in all."""
        for g in groups:
            d = self._groups.get(g)
            if d is not None and len(d) >= self.min_group:
                return max(self._quantile(d), 0.0), str(g[0])
        if len(self._all) >= self.min_group:
            return max(self._quantile(self._all), 0.0), "all"
        return None

    def _quantile(self, residuals: deque[float]) -> float:
        if self._weights is None:
            return conformal_quantile(list(residuals), self.level_now)
        weights = self._weights[len(self._weights) - len(residuals) :]
        return weighted_conformal_quantile(list(residuals), weights, self.level_now)


def conformal_quantile(values: list[float], level: float) -> float:
    """The split-conformal quantile: the ceil((n + 1) * level)-th smallest of n values (the
    largest when that rank is past n), so that a new exchangeable value falls at or under it
    with probability at least `level`; the smallest when the rank is 0 or less."""
    s = sorted(values)
    rank = math.ceil((len(s) + 1) * level)
    return s[min(max(rank, 1), len(s)) - 1]


def weighted_conformal_quantile(values: list[float], weights: FloatArray, level: float) -> float:
    """`conformal_quantile` with each value weighing its own (non-exchangeable conformal
    prediction, Barber et al., Annals of Statistics 2023), the new value weighing 1: the
    smallest value whose weight and that of those under it reach `level` of the whole (the new
    value's included), else the largest. With every weight 1 it is `conformal_quantile`."""
    order = np.argsort(values, kind="stable")
    reached = np.cumsum(weights[order]) >= level * (float(weights.sum()) + 1.0)
    at = int(np.argmax(reached)) if reached.any() else len(values) - 1
    return float(values[order[at]])


class Score:
    """Running coverage and median error ratio of the predictions given to finished jobs."""

    def __init__(self, window: int) -> None:
        self.scored = 0
        self._covered: deque[bool] = deque(maxlen=window)
        self._ratios: deque[float] = deque(maxlen=window)

    def add(self, runtime_s: float, median_s: float, upper_s: float) -> None:
        self.scored += 1
        self._covered.append(runtime_s <= upper_s)
        self._ratios.append(max(median_s / runtime_s, runtime_s / median_s))

    @property
    def coverage(self) -> float | None:
        """Share of the recent finished jobs whose runtime was at or under their upper bound."""
        return sum(self._covered) / len(self._covered) if self._covered else None

    @property
    def median_error_ratio(self) -> float | None:
        return median(list(self._ratios)) if self._ratios else None

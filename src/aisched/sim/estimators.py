"""Estimators the simulator can plug in: the job's own estimate, a learned predictor, the oracle.

- `OwnEstimate`: what the job declares (`Job.estimate_s`), nothing learned.
- `PredictedRuntime`: `aisched.predict.RuntimePredictor`, fed online: each job is predicted
  when it arrives (at that time) and observed when it finishes, so it only ever learns from
  jobs that have finished (the predictor refuses anything else). With
  `PredictorConfig.calib_refresh` its upper bound is calibrated again each time it starts.
- `Oracle`: the trace's true duration, for the `*-oracle` policies only, which are bounds to
  compare against, not schedulers one could run.

`estimator_for` picks one per policy: `auto` gives the oracle to a policy whose name ends in
`-oracle`, the job's own estimate to a policy whose decisions read no estimate (fifo, las,
priority, drf...: `core.estimate_use.reads_estimates`), so that nothing is trained for it, and
the predictor to every other one.

What a refit costs where the predictor is used: it is amortised. Each fit learns from the last
`PredictorConfig.window` finishes and runs once per `refit_every` finishes, so the work per
finished job is bounded (window / refit_every rows of training, ten by default) however long
the trace; the fit runs in line at that finish, so a replay stays repeatable.
"""

from __future__ import annotations

from aisched.core.estimate_use import reads_estimates
from aisched.core.policy import Policy
from aisched.predict import JobFeatures, PredictorConfig, RuntimePredictor
from aisched.sim.engine import Estimate, Estimator
from aisched.sim.traces import TraceJob

ESTIMATORS = ("auto", "own", "predict", "oracle")
ORACLE_SUFFIX = "-oracle"


class OwnEstimate:
    def estimate(self, tj: TraceJob, now_s: float) -> Estimate:
        return tj.job.estimate_s, None

    def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
        return None

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
        return None


class Oracle:
    def estimate(self, tj: TraceJob, now_s: float) -> Estimate:
        return tj.duration_s, tj.duration_s

    def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
        return None

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
        return None


class PredictedRuntime:
    """A job keeps the prediction made when it arrived: requeues reuse it (Helios' QSSF
    predicts once per job), and its features say when it was asked. Only its upper bound may
    move, when it starts (`RuntimePredictor.refresh`); requeues reuse the latest."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.predictor = RuntimePredictor(config)
        self._asked: dict[str, JobFeatures] = {}
        self._answer: dict[str, Estimate] = {}

    def estimate(self, tj: TraceJob, now_s: float) -> Estimate:
        known = self._answer.get(tj.job.id)
        if known is not None:
            return known
        features = JobFeatures.from_job(tj.job, now_s)
        p = self.predictor.predict(features)
        self._asked[tj.job.id] = features
        answer = self._answer[tj.job.id] = (p.median_s, p.upper_s)
        return answer

    def upper_at_start(self, tj: TraceJob, now_s: float) -> float | None:
        known = self._answer.get(tj.job.id)
        if known is None:
            return None
        upper = self.predictor.refresh(tj.job.id, now_s)
        if upper is not None:
            self._answer[tj.job.id] = (known[0], upper)
        return upper

    def observe(self, tj: TraceJob, runtime_s: float, finished_s: float) -> None:
        features = self._asked.pop(tj.job.id, None) or JobFeatures.from_job(tj.job, finished_s)
        self._answer.pop(tj.job.id, None)
        self.predictor.observe(features, runtime_s, finished_s)


def estimator_for(policy: Policy, choice: str = "auto") -> Estimator:
    """A fresh estimator for one run of `policy` (`choice`: one of ESTIMATORS)."""
    if choice not in ESTIMATORS:
        raise ValueError(f"unknown estimator {choice!r}; expected one of {', '.join(ESTIMATORS)}")
    if choice == "auto":
        if policy.name.endswith(ORACLE_SUFFIX):
            choice = "oracle"
        else:
            choice = "predict" if reads_estimates(policy) else "own"
    if choice == "oracle":
        return Oracle()
    if choice == "predict":
        return PredictedRuntime()
    return OwnEstimate()

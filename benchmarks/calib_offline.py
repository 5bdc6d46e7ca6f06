"""The calibration's coverage under other residual windows, worked out offline on the tuning
split of bench_holdout.py only (VC 6214e9's week of 2017-10-01..07), never on the held-out weeks.

Each size's qssf replay (the preset as it was before `calib_half_life`) is run once, recording for every predicted job the log
median it was given, its residual groups, when its bound was last set (its first start, else its
arrival) and, once it finished, its true log runtime and finish time. Each variant's
`ConformalUpper` is then fed the same finishes in time order and asked for each job's margin
when the replay set its bound, so only residuals of jobs finished by then count. Where jobs
start as they arrive (a roomy cluster) the schedule does not depend on the bounds and the
figure is what a replay would give; on a loaded one other bounds would move the schedule, so it
is a first look, not a result. Prints, per size and variant, the share of finished jobs under
their bound and the median bound as a multiple of the median estimate; writes nothing.

    python benchmarks/calib_offline.py [--gpus 128,96,64,32]
        [--variants 'window=2000;window=300;half_life=300;half_life=500']
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from aisched.core.policy import PRESETS, build_policy
from aisched.predict import JobFeatures, PredictorConfig, RuntimePredictor
from aisched.predict.calibration import ConformalUpper, Group
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import PredictedRuntime

sys.path.insert(0, str(Path(__file__).parent))
from bench_holdout import SPLITS, cluster_of, load_week  # noqa: E402


@dataclass
class Asked:
    """One predicted job, as the replay saw it."""

    median: float  # log seconds
    upper: float  # the bound the replay gave it, for when the calibration had too few residuals
    groups: tuple[Group, ...]
    bound_at: float  # when its bound was last set: its first start, else its arrival
    started: bool = False
    runtime: float | None = None  # log seconds, once finished
    finished_at: float = math.inf


class Recorder(RuntimePredictor):
    def __init__(self, config: PredictorConfig) -> None:
        super().__init__(config)
        self.asked: dict[str, Asked] = {}

    def predict(self, features: JobFeatures):  # type: ignore[no-untyped-def]
        got = super().predict(features)
        given = self._given.get(features.job_id)
        if features.job_id not in self.asked and given is not None:
            self.asked[features.job_id] = Asked(given[0], given[1], given[2], features.now_s)
        return got

    def refresh(self, job_id: str, now_s: float) -> float | None:
        asked = self.asked.get(job_id)
        if asked is not None and not asked.started and self.config.calib_refresh:
            asked.started, asked.bound_at = True, now_s
        return super().refresh(job_id, now_s)

    def observe(self, features: JobFeatures, runtime_s: float, finished_s: float) -> None:
        asked = self.asked.get(features.job_id)
        if asked is not None and asked.runtime is None:
            asked.runtime, asked.finished_at = math.log(max(runtime_s, 1.0)), finished_s
        super().observe(features, runtime_s, finished_s)


def record(gpus: int) -> dict[str, Asked]:
    """The preset's replay as it was before recent residuals weighed more (`calib_half_life`
    0), the one the variants were looked at against."""
    config = PredictorConfig(calib_half_life=0)
    estimator = PredictedRuntime(config)
    recorder = estimator.predictor = Recorder(config)
    policy = build_policy(PRESETS["qssf"], name="qssf")
    simulate(
        load_week(SPLITS["tuning"][0]), cluster_of(gpus), policy, SimConfig(), estimator=estimator
    )
    return recorder.asked


def evaluate(asked: dict[str, Asked], spec: str) -> tuple[float, float]:
    """(coverage, median bound over median estimate) of `spec` (`window=N` or `half_life=N`)."""
    key, value = spec.split("=")
    c = PredictorConfig()
    window = int(value) if key == "window" else c.calib_group_window
    half_life = int(value) if key == "half_life" else 0
    calibration = ConformalUpper(
        c.upper_quantile, window, window, c.calib_min_group, half_life=half_life
    )
    # At one instant, finishes come first: the predictor has seen them when it is asked.
    events = [(a.bound_at, 1, job_id) for job_id, a in asked.items()]
    events += [(a.finished_at, 0, job_id) for job_id, a in asked.items() if a.runtime is not None]
    margins: dict[str, float] = {}
    for _, kind, job_id in sorted(events):
        a = asked[job_id]
        if kind == 0:
            assert a.runtime is not None
            calibration.add(a.groups, a.runtime - a.median)
        else:
            got = calibration.margin(a.groups)
            margins[job_id] = a.upper - a.median if got is None else got[0]
    done = [j for j, a in asked.items() if a.runtime is not None]
    covered = sum(asked[j].runtime <= asked[j].median + margins[j] + 1e-9 for j in done)  # type: ignore[operator]
    widths = sorted(margins[j] for j in done)
    return covered / len(done), math.exp(widths[len(widths) // 2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="128,96,64,32")
    ap.add_argument("--variants", default="window=2000;window=300;half_life=300;half_life=500")
    args = ap.parse_args()
    for gpus in (int(g) for g in args.gpus.split(",")):
        asked = record(gpus)
        for spec in args.variants.split(";"):
            coverage, width = evaluate(asked, spec)
            print(f"{gpus:>3} GPUs  {spec:<16} coverage {coverage:.1%}  median bound {width:.1f}x")


if __name__ == "__main__":
    main()

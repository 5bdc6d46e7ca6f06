"""How qssf's parameters were chosen: variants of the preset replayed on the tuning split of
bench_holdout.py only (VC 6214e9's week of 2017-10-01..07 at 64 and 32 GPUs), never on the
held-out weeks. Prints one line per variant and cluster; writes nothing.

A variant sets the order's aging, linear (`aging`, GPU-seconds per second waited) or relative
(`halve`, hours to halve a job's predicted GPU-time), or its bands (`bucket`, a factor: alike
predicted GPU-times in submission order), the overdue guard (`due`: jobs that have
waited this many median waits go first; 0 off; `backlog`: jobs that have waited this many
times the backlog's drain time go first; 0 off; `backlog_bound`: `started` or `waited`, the
bound of a running job that drain time reads), the starvation guard (`starve` hours after
submission, or `starve_backlog` times the backlog's drain time, for jobs of `min_gpus` GPUs
or more) and the preemption guards (`factor`, `min_run` seconds, `bound`: `upper` or
`estimate`); `adapt` sets how fast the predictor's calibration level follows its misses
(`PredictorConfig.calib_adapt`), `refresh` (0 or 1, on by default) whether a job's upper bound
is calibrated again when it starts (`PredictorConfig.calib_refresh`), `group_window` the
residuals kept per group (`PredictorConfig.calib_group_window`) and `half_life` how many
residuals a residual's weight halves over (`PredictorConfig.calib_half_life`; 0: alike). Each line gives the predictor's coverage (of
the bound a job's first attempt started with).

    python benchmarks/tune_qssf.py [--variants 'starve=12,min_gpus=1;starve=24,min_gpus=1'] [--jobs N]
        [--size both|roomy|tight] [--gpus 64,32,96,128]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from aisched.core.policy import PRESETS, build_policy
from aisched.predict import PredictorConfig
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import PredictedRuntime
from aisched.sim.metrics import compute_metrics

sys.path.insert(0, str(Path(__file__).parent))
from bench_holdout import SPLITS, cluster_of, load_week, offered_gpus, sizes  # noqa: E402


def variant(spec: str) -> tuple[dict[str, Any], PredictorConfig]:
    """The qssf preset and the predictor's settings with `spec`'s (`key=value,...`)."""
    cfg = copy.deepcopy(PRESETS["qssf"])
    predictor = PredictorConfig()
    enqueue, _, preempt = cfg["actions"]
    for item in filter(None, spec.split(",")):
        key, value = item.split("=")
        if key == "adapt":
            predictor = replace(predictor, calib_adapt=float(value))
        elif key == "refresh":
            predictor = replace(predictor, calib_refresh=bool(int(value)))
        elif key == "half_life":
            predictor = replace(predictor, calib_half_life=int(value))
        elif key == "group_window":
            predictor = replace(predictor, calib_group_window=int(value))
        elif key == "starve":
            enqueue["starving_after_s"] = float(value) * 3600
        elif key == "min_gpus":
            enqueue["starving_min_gpus"] = float(value)
        elif key == "starve_backlog":
            enqueue["starving_after_backlog"] = float(value)
        elif key == "aging":
            cfg["order"] = [{"name": "qssf", "aging": float(value)}, "fifo"]
        elif key == "halve":
            cfg["order"] = [{"name": "qssf", "halve_after_s": float(value) * 3600}, "fifo"]
        elif key == "bucket":
            cfg["order"] = [{"name": "qssf", "bucket": float(value)}, "fifo"]
        elif key == "due":
            enqueue["due_after_median_waits"] = float(value)
        elif key == "backlog":
            enqueue["due_after_backlog"] = float(value)
        elif key == "backlog_bound":
            enqueue["backlog_bound"] = value
        elif key == "bound":
            preempt["bound"] = value
        elif key == "factor":
            preempt["factor"] = float(value)
        elif key == "min_run":
            preempt["min_run_s"] = float(value)
        else:
            raise SystemExit(f"unknown setting {key!r}")
    return cfg, predictor


def run(spec: str, gpus: int) -> str:
    week = SPLITS["tuning"][0]
    trace = load_week(week)
    cfg, predictor = variant(spec)
    policy = build_policy(cfg, name="qssf")
    t0 = time.process_time()
    estimator = PredictedRuntime(predictor)
    result = simulate(trace, cluster_of(gpus), policy, SimConfig(), estimator=estimator)
    m = compute_metrics(result)
    return (
        f"{gpus:>3} GPUs  {spec or 'preset':<40} avg {(m.avg_jct_s or 0) / 3600:6.2f} h  "
        f"median {(m.median_jct_s or 0) / 3600:6.2f} h  p99 {(m.p99_jct_s or 0) / 3600:6.2f} h  "
        f"preemptions {m.preemptions:5}  coverage {m.estimate_under_upper or 0:.1%}  "
        f"{time.process_time() - t0:4.0f} CPU-s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--size", choices=("both", "roomy", "tight"), default="both")
    ap.add_argument(
        "--gpus", default="", help="cluster sizes instead of --size's, e.g. 64,32,96,128"
    )
    args = ap.parse_args()
    week = SPLITS["tuning"][0]
    roomy, tight = sizes(offered_gpus(load_week(week), week))
    gpus = {"both": (roomy, tight), "roomy": (roomy,), "tight": (tight,)}[args.size]
    if args.gpus:
        gpus = tuple(int(g) for g in args.gpus.split(","))
    specs = args.variants.split(";")
    tasks = [(s, g) for g in gpus for s in specs]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for line in pool.map(run, *zip(*tasks, strict=True)):
            print(line, flush=True)


if __name__ == "__main__":
    main()

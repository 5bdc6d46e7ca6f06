"""Dump the simulator's decision log of the preemption policies, to diff byte for byte before
and after a change that must decide nothing differently (issue 16's speed work).

Two runs per policy: VC 6214e9's Philly week on 16 x 4 GPUs (as `bench_philly_week.py` runs it)
and the first N jobs of the whole Philly trace on `benchmarks/philly-512.yaml` (as
`bench_replay.py --limit N` runs it). Each log is written to OUTDIR as `<run>-<policy>.log`, one
entry per line (its `repr`, so floats are exact), followed by the run's headline figures. Prints
each file's SHA-256 and the CPU-seconds of each replay.

    python benchmarks/dump_decisions.py OUTDIR [--policy las,srtf-oracle] [--limit 20000]
    diff -r OUTDIR_BEFORE OUTDIR_AFTER
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from aisched.core.policy import preset
from aisched.model.cluster import Cluster
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import estimator_for
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import Trace, fit_gangs_to, load_philly
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from bench_philly_week import CLUSTER as WEEK_CLUSTER  # noqa: E402
from bench_philly_week import write_week  # noqa: E402

CLUSTER_512 = Path(__file__).parent / "philly-512.yaml"


def _dump(out: Path, run: str, name: str, trace: Trace, cluster: Cluster) -> None:
    policy = preset(name)
    c0 = time.process_time()
    result = simulate(trace, cluster, policy, SimConfig(), estimator=estimator_for(policy))
    cpu_s = time.process_time() - c0
    m = compute_metrics(result)
    path = out / f"{run}-{name}.log"
    with path.open("w") as fh:
        for entry in result.log:
            fh.write(f"{entry!r}\n")
        fh.write(
            f"# jobs {m.jobs_submitted} finished {m.jobs_finished} avg_jct_s {m.avg_jct_s!r} "
            f"avg_queueing_s {m.avg_queueing_s!r} preemptions {m.preemptions} "
            f"cycles {result.cycles}\n"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    print(
        f"{run} {name}: {len(result.log):,} entries, sha256 {digest}, "
        f"avg JCT {(m.avg_jct_s or 0) / 3600:.2f} h, {cpu_s:.1f} CPU-s",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--policy", default="las,srtf-oracle")
    ap.add_argument("--limit", type=int, default=20_000, help="jobs of the 512-GPU replay")
    ap.add_argument("--runs", default="week,replay512", help="which runs: week, replay512")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    runs = args.runs.split(",")
    names = args.policy.split(",")
    if "week" in runs:
        cluster = resolve_cluster(str(WEEK_CLUSTER))
        with tempfile.TemporaryDirectory() as tmp:
            week = Path(tmp) / "philly.csv"
            write_week(week)
            trace, _ = fit_gangs_to(load_philly(week), cluster)
        for name in names:
            _dump(args.outdir, "week", name, trace, cluster)
    if "replay512" in runs:
        trace = load_philly(limit=args.limit)
        cluster = resolve_cluster(str(CLUSTER_512))
        for name in names:
            _dump(args.outdir, f"replay512-{args.limit}", name, trace, cluster)


if __name__ == "__main__":
    main()

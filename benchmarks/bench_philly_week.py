"""One Philly virtual cluster's week on nodes smaller than its servers: the 8,562 jobs that VC
6214e9 submitted from 2017-10-01 to 2017-10-07 (the trace's own timestamps), replayed on 16
nodes x 4 GPUs (64 GPUs, benchmarks/philly-16x4.yaml) under fit-first `fifo`, `fifo-strict`,
`las` (Tiresias' 2D-LAS) and `srtf-oracle`, each with the estimator `--estimator auto` gives it
(the true durations for the oracle, the jobs' own otherwise), as `aisched simulate` does.

The trace records GPU counts for 8-GPU servers; its 58 jobs of 8 GPUs run here as gangs of 2 x 4
over two nodes (`fit_gangs_to`), so every job finishes and none is refused as never fitting.
Prints per policy the jobs submitted, finished and rejected, JCT, queueing and CPU-seconds, and
writes the table into docs/benchmarks.md. Issue 16's goal: each policy at most 4 CPU-s, with
the decisions (and so the JCT figures) of before the cycle was made incremental.

    python benchmarks/bench_philly_week.py [--policy fifo-strict,fifo,las,srtf-oracle] [--no-write]
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

from aisched.core.policy import preset
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import estimator_for
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import fit_gangs_to, load_philly, resolve_trace_file
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

VC = "6214e9"
DAYS = ("2017-10-01", "2017-10-07")  # inclusive
CLUSTER = Path(__file__).parent / "philly-16x4.yaml"


def write_week(out: Path, vc: str = VC, days: tuple[str, str] = DAYS) -> int:
    """Copy the rows of one VC's days from the shared Philly CSV to `out`; returns the count."""
    source = resolve_trace_file(None, "philly-pollux", "philly.csv")
    n = 0
    with source.open(newline="") as fh, out.open("w", newline="") as dst:
        reader, writer = csv.reader(fh), csv.writer(dst)
        header = next(reader)
        writer.writerow(header)
        i_ts, i_vc = header.index("timestamp"), header.index("cluster")
        for row in reader:
            if row and row[i_vc] == vc and days[0] <= row[i_ts][:10] <= days[1]:
                writer.writerow(row)
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="fifo-strict,fifo,las,srtf-oracle")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    cluster = resolve_cluster(str(CLUSTER))
    with tempfile.TemporaryDirectory() as tmp:
        week = Path(tmp) / "philly.csv"
        rows = write_week(week)
        trace, split = fit_gangs_to(load_philly(week), cluster)
    print(f"VC {VC}, {DAYS[0]}..{DAYS[1]}: {rows:,} rows, {split} jobs split into gangs")
    lines = [
        "| policy | jobs | finished | rejected (never fit) | unfinished | avg JCT (h) | avg queueing (h) | GPU util. | CPU-s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in args.policy.split(","):
        policy = preset(name)
        t0 = time.process_time()
        result = simulate(trace, cluster, policy, SimConfig(), estimator=estimator_for(policy))
        cpu_s = time.process_time() - t0
        m = compute_metrics(result)
        line = (
            f"| {name} | {m.jobs_submitted:,} | {m.jobs_finished:,} | {m.jobs_rejected:,} "
            f"| {m.jobs_unfinished:,} | {(m.avg_jct_s or 0) / 3600:.2f} "
            f"| {(m.avg_queueing_s or 0) / 3600:.2f} | {(m.gpu_utilisation or 0):.1%} | {cpu_s:.1f} |"
        )
        print(line, flush=True)
        lines.append(line)
    body = (
        f"VC {VC}'s week ({DAYS[0]} to {DAYS[1]}, {rows:,} jobs) on 16 nodes x 4 GPUs "
        f"(`benchmarks/philly-16x4.yaml`): the {split} jobs of 8 GPUs run as gangs of 2 x 4 over "
        "two nodes. `fifo-strict` stops at the first job that does not fit; `fifo` starts later "
        "jobs that fit past it; `las` preempts by attained service; `srtf-oracle` is given the true "
        "durations. CPU-s: process time of the replay, trace loading excluded (issue 16's goal: "
        "at most 4 each).\n\n" + "\n".join(lines)
    )
    if not args.no_write:
        write_section("philly-week-gangs", body)


if __name__ == "__main__":
    main()

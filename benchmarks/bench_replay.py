"""How long a whole-trace replay takes: the full Microsoft Philly trace (82,247 jobs) on the
built-in `philly` cluster (96 nodes, 768 GPUs), or with `--cluster benchmarks/philly-512.yaml`
on 512 GPUs, where the queue grows long (the loaded regime; issue 16's goal there: fifo under
40 CPU-s, las under 60), once per policy.

Prints, per policy, the wall time of the run (trace loading excluded), the share spent inside
`run_cycle`, the number of cycles and the headline figures, and writes the table into
docs/benchmarks.md (section `replay`, or `replay-512` for the 512-GPU cluster). Repeats take
the median wall time; CPU-s is the process time of the last repeat.

    python benchmarks/bench_replay.py [--policy fifo,las] [--repeat 1] [--limit N] [--cluster C]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from aisched.core.policy import preset
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.metrics import compute_metrics
from aisched.sim.traces import load_philly
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="fifo,las")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--cluster", default="philly", help="a built-in name or a cluster file")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    t0 = time.perf_counter()
    trace = load_philly(limit=args.limit)
    load_s = time.perf_counter() - t0
    cluster = resolve_cluster(args.cluster)
    print(f"loaded {len(trace.jobs):,} jobs in {load_s:.1f} s", flush=True)
    rows = [
        "| policy | jobs | wall time (median) | CPU-s | in run_cycle | cycles | avg JCT (h) | avg queueing (h) | GPU util. | preemptions |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in args.policy.split(","):
        walls, result = [], None
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            result = simulate(trace, cluster, preset(name), SimConfig())
            walls.append(time.perf_counter() - t0)
            cpu_s = time.process_time() - c0
        assert result is not None
        m = compute_metrics(result)
        wall = statistics.median(walls)
        line = (
            f"| {name} | {len(trace.jobs):,} | {wall:.1f} s | {cpu_s:.1f} | {result.cycle_wall_s / walls[-1]:.0%} "
            f"| {result.cycles:,} | {(m.avg_jct_s or 0) / 3600:.2f} | {(m.avg_queueing_s or 0) / 3600:.2f} "
            f"| {(m.gpu_utilisation or 0):.1%} | {m.preemptions:,} |"
        )
        print(line, flush=True)
        rows.append(line)
    text = "\n".join(rows)
    text += f"\n\nCluster `{args.cluster}`. Trace loading (CSV parse and sort) took {load_s:.1f} s and is not included."
    if not args.no_write:
        write_section("replay" if args.cluster == "philly" else "replay-512", text)


if __name__ == "__main__":
    main()

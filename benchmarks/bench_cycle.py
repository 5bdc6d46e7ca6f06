"""Placement throughput of one scheduling cycle on large synthetic clusters.

For each cluster size (8 GPUs a node), one cycle on an empty cluster places as many of 10,000
pending jobs as fit: 80 % single-task jobs (1, 1, 1, 2, 4 or 8 GPUs) and 20 % gangs of 2, 4 or
8 tasks of 8 GPUs. The cycle also has to answer for every job it could not place. Prints the
median over repeats of the cycle time, jobs and tasks placed per second, and writes the table
into docs/benchmarks.md.

    python benchmarks/bench_cycle.py [--nodes 1000,5000,10000] [--jobs 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from aisched.core.cycle import run_cycle
from aisched.core.policy import preset
from aisched.core.snapshot import PendingJob, snapshot_of
from aisched.model.job import Job, TaskGroup
from aisched.model.resources import Resources
from aisched.sim.traces.synthetic import synthetic_cluster

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402


def pending_jobs(n: int, seed: int) -> list[PendingJob]:
    rng = random.Random(seed)
    jobs: list[PendingJob] = []
    for i in range(n):
        if rng.random() < 0.8:
            gpus = rng.choice((1, 1, 1, 2, 4, 8))
            group = TaskGroup(
                "main", 1, Resources(milli_cpu=4000 * gpus, mem_mib=16384 * gpus, gpu=gpus)
            )
        else:
            group = TaskGroup(
                "worker", rng.choice((2, 4, 8)), Resources(milli_cpu=32000, mem_mib=131072, gpu=8)
            )
        jobs.append(PendingJob(Job(id=f"j{i:05d}", groups=(group,), submit_time_s=float(i))))
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,5000,10000")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    policy = preset(args.policy)
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        cluster = synthetic_cluster(n)
        snap = snapshot_of(cluster)
        pending = pending_jobs(args.jobs, seed=n)
        times, placed_counts, tasks = [], [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = run_cycle(snap, pending, policy, now=0.0)
            times.append(time.perf_counter() - t0)
            placed_counts.append(res.stats.placed)
            tasks = sum(len(b.tasks) for b in res.binds)
        med = statistics.median(times)
        placed = placed_counts[0]
        rows.append((n, args.jobs, placed, tasks, med, placed / med, tasks / med))
        print(
            f"nodes={n:>6} pending={args.jobs} jobs_placed={placed} tasks_placed={tasks} "
            f"cycle_median={med * 1000:.0f} ms jobs/s={placed / med:,.0f} tasks/s={tasks / med:,.0f}",
            flush=True,
        )
    table = [
        "| nodes (8 GPUs each) | pending jobs | jobs placed | tasks placed | cycle (median) | jobs placed/s | tasks placed/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, j, p, t, med, jps, tps in rows:
        table.append(f"| {n:,} | {j:,} | {p:,} | {t:,} | {med:.2f} s | {jps:,.0f} | {tps:,.0f} |")
    text = "\n".join(table)
    print(text)
    if not args.no_write:
        write_section("cycle", text)


if __name__ == "__main__":
    main()

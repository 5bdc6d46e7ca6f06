"""Placement throughput of one scheduling cycle on large synthetic clusters.

For each cluster size (8 GPUs a node), one cycle on an empty cluster places as many of 10,000
pending jobs as fit: 80 % single-task jobs (1, 1, 1, 2, 4 or 8 GPUs) and 20 % gangs of 2, 4 or
8 tasks of 8 GPUs. The cycle also has to answer for every job it could not place. Prints the
median over repeats of the cycle's CPU time (user + system of this process), jobs and tasks
placed per CPU-second, and writes the table into docs/benchmarks.md.

Each size runs twice: with the policy's automatic node sample (a bounded sample of feasible
nodes scored on large clusters, `placement.AUTO_SAMPLE_FROM_NODES`) and scoring every node
(`node_sample: 0`), and prints packing quality beside the speed: jobs placed, nodes holding
any task, and the GPUs left free on nodes that are partly used (fragments a whole-node task
cannot use).

    python benchmarks/bench_cycle.py [--nodes 5000,20000,50000] [--jobs 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from aisched.core.cycle import CycleResult, run_cycle
from aisched.core.placement import sample_size
from aisched.core.policy import preset
from aisched.core.session import Session
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


def packing(res: CycleResult, gpus_per_node: int) -> tuple[int, int]:
    """Nodes holding any task, and free GPUs on the nodes partly used."""
    used: dict[str, int] = {}
    for b in res.binds:
        for t in b.tasks:
            used[t.node] = used.get(t.node, 0) + len(t.gpus)
    return len(used), sum(gpus_per_node - g for g in used.values() if g < gpus_per_node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="5000,20000,50000")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    policy = preset(args.policy)
    modes = {"automatic": policy, "every node": replace(policy, node_sample=0)}
    table = [
        "| nodes (8 GPUs each) | pending jobs | nodes scored | jobs placed | tasks placed "
        "| cycle CPU (median) | jobs placed per CPU-s | nodes used | free GPUs on partly used nodes |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in (int(x) for x in args.nodes.split(",")):
        cluster = synthetic_cluster(n)
        snap = snapshot_of(cluster)
        pending = pending_jobs(args.jobs, seed=n)
        for mode, pol in modes.items():
            k = sample_size(Session(snap, pol, 0.0, ()))
            if mode == "every node" and table[-1].split("|")[3].strip() == "all":
                continue  # the automatic run scored every node already
            scored = "all" if k == 0 else f"sample of {k}"
            times = []
            res = None
            for _ in range(args.repeat if mode == "automatic" else 1):
                t0 = time.process_time()
                res = run_cycle(snap, pending, pol, now=0.0)
                times.append(time.process_time() - t0)
            assert res is not None
            med = statistics.median(times)
            placed = res.stats.placed
            tasks = sum(len(b.tasks) for b in res.binds)
            nodes_used, fragments = packing(res, 8)
            line = (
                f"| {n:,} | {args.jobs:,} | {scored} | {placed:,} | {tasks:,} | {med:.2f} s "
                f"| {placed / med:,.0f} | {nodes_used:,} | {fragments:,} |"
            )
            print(line, flush=True)
            table.append(line)
    text = "\n".join(table)
    print(text)
    if not args.no_write:
        write_section("cycle", text)


if __name__ == "__main__":
    main()

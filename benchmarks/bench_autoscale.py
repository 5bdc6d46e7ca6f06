"""Cluster autoscaling on the Philly trace: an autoscaled node pool against the same pool fixed
at its maximum size, node-hours next to JCT.

The pool is examples/cluster-autoscaling.yaml: the built-in `philly` cluster's node (8 P100
GPUs, 48 CPUs, 512 GiB), at most 96 nodes (the `philly` cluster's 768 GPUs; `--max-nodes`).
Autoscaled: it starts at 0 nodes (`--min-nodes`); nodes are asked for when gangs wait
(core/cluster_autoscale.py), join 300 s later (`--delay`) and are removed after 600 s with
nothing running (`--idle`). Fixed: the pool at its maximum all the time. Both replay the whole
trace (or the first `--limit` jobs) with the same policy (default fifo), checkpoints every hour,
60 s restart cost. Without options, the same as

    aisched simulate --trace philly --cluster examples/cluster-autoscaling.yaml [--pools-at-max]

Node-hours count a node from the moment it is asked for until it is removed, over the window
from the first submission to the last finish; JCT is finish minus submit.

    python benchmarks/bench_autoscale.py [--limit N] [--max-nodes 96] [--min-nodes 0] [--delay 300] [--idle 600] [--policy fifo] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from aisched.core.policy import preset
from aisched.model.cluster import Cluster, NodePool
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.metrics import PolicyMetrics, compute_metrics
from aisched.sim.traces import load_philly
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

CLUSTER = Path(__file__).parent.parent / "examples" / "cluster-autoscaling.yaml"


def philly_pool(args: argparse.Namespace) -> NodePool:
    """The example file's pool, with what the options change."""
    (pool,) = resolve_cluster(str(CLUSTER)).node_pools
    return replace(
        pool,
        max_nodes=args.max_nodes if args.max_nodes is not None else pool.max_nodes,
        min_nodes=args.min_nodes if args.min_nodes is not None else pool.min_nodes,
        provisioning_delay_s=args.delay if args.delay is not None else pool.provisioning_delay_s,
        scale_down_idle_s=args.idle if args.idle is not None else pool.scale_down_idle_s,
    )


def clusters(args: argparse.Namespace) -> dict[str, Cluster]:
    pool = philly_pool(args)
    auto = Cluster(tuple(pool.node(i) for i in range(pool.min_nodes)), node_pools=(pool,))
    return {"autoscaled": auto, "fixed": auto.at_max()}


def replay(mode: str, args: argparse.Namespace) -> tuple[str, PolicyMetrics, float]:
    trace = load_philly(limit=args.limit)
    cluster = clusters(args)[mode]
    t0 = time.perf_counter()
    result = simulate(trace, cluster, preset(args.policy), SimConfig())
    wall = time.perf_counter() - t0
    m = compute_metrics(result)
    print(
        f"{mode}: {m.node_hours:,.0f} node-hours, median JCT {(m.median_jct_s or 0) / 3600:.2f} h, "
        f"wall {wall:.1f} s",
        flush=True,
    )
    return mode, m, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, help="replay only the first N jobs (default: all)")
    ap.add_argument("--max-nodes", type=int, help="default: the file's (96)")
    ap.add_argument("--min-nodes", type=int, help="default: the file's (0)")
    ap.add_argument("--delay", type=float, help="provisioning delay (s); default: the file's")
    ap.add_argument("--idle", type=float, help="scale-down idle time (s); default: the file's")
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    modes = ["autoscaled", "fixed"]
    t0 = time.perf_counter()
    # The two replays are independent: side by side, in processes.
    with ProcessPoolExecutor(max_workers=2) as ex:
        runs = list(ex.map(replay, modes, [args] * len(modes)))
    elapsed = time.perf_counter() - t0
    results = {mode: (m, wall) for mode, m, wall in runs}
    rows = [
        "| cluster | node-hours | mean nodes | peak nodes | nodes added / removed | median JCT (h) | avg JCT (h) | avg queueing (h) | GPU util. | jobs finished | sim wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, (m, wall) in results.items():
        window_h = m.makespan_s / 3600 or 1.0
        rows.append(
            f"| {mode} | {m.node_hours:,.0f} | {m.node_hours / window_h:.1f} | {m.peak_nodes} "
            f"| {m.nodes_added:,} / {m.nodes_removed:,} | {(m.median_jct_s or 0) / 3600:.2f} "
            f"| {(m.avg_jct_s or 0) / 3600:.2f} | {(m.avg_queueing_s or 0) / 3600:.2f} "
            f"| {(m.gpu_utilisation or 0):.1%} | {m.jobs_finished:,} / {m.jobs_submitted:,} "
            f"| {wall:.0f} s |"
        )
    auto, fixed = results["autoscaled"][0], results["fixed"][0]
    pool = philly_pool(args)
    saved = 1 - auto.node_hours / fixed.node_hours if fixed.node_hours else 0.0
    jct_ratio = (auto.avg_jct_s or 0) / (fixed.avg_jct_s or 1)
    jobs = f"first {args.limit:,}" if args.limit else "all"
    text = (
        f"Philly trace ({jobs} jobs, {auto.jobs_submitted:,} replayed), policy {args.policy}, "
        f"checkpoints every hour, 60 s restart cost. One pool of 8-GPU nodes (P100, 48 CPUs, "
        f"512 GiB): autoscaled between {pool.min_nodes} and {pool.max_nodes} nodes (nodes join "
        f"{pool.provisioning_delay_s:g} s after they are asked for and leave after "
        f"{pool.scale_down_idle_s:g} s idle), against the same pool fixed at {pool.max_nodes} "
        "nodes.\n\n"
        + "\n".join(rows)
        + f"\n\nThe autoscaled pool used {saved:.1%} fewer node-hours; its average JCT is "
        f"{jct_ratio:.2f}x the fixed pool's. Node-hours bill a node from the moment it is asked "
        "for until it is removed, over the window from the first submission to the last finish; "
        "mean nodes is node-hours over that window. Both replays ran side by side and took "
        f"{elapsed:.0f} s end to end; wall times are rough (shared cores)."
    )
    print(text)
    if not args.no_write:
        write_section("autoscale", text)


if __name__ == "__main__":
    main()

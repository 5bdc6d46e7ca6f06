"""GPU fragmentation on openb: fgd against best-fit, worst-fit, dot-product and random placement.

The FGD paper's experiment (Weng et al., USENIX ATC '23): the openb default pod list arrives in
trace order on the openb node list (1,523 nodes, 6,212 GPUs) and nothing leaves; a pod that
does not fit when it arrives fails. Reported when the arrived GPU demand reaches 90, 95 and
100 % of capacity: the GPU allocated and the GPU demand left unallocated (failed), as shares of
capacity, and beside them the CPU-only pods that failed (which unallocated GPU does not count).
The same as

    aisched simulate --trace openb --saturate --placement fgd,bestfit,worstfit,dotprod,random

With `--nodes`, the same on node lists that vary CPUs and memory per GPU node: `openb` (the
list as it is), `gpu96` (every GPU node with 96 vCPUs, memory as listed) and `gpu128-2t` (every
GPU node with 128 vCPUs and 2 TiB); CPU-only nodes stay as listed. Each list gets its own
section of docs/benchmarks.md, and fgd's advantage over bestfit is given as a range over them.

    python benchmarks/bench_saturation.py [--variant default] [--placement ...] [--nodes openb,gpu96,gpu128-2t] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from aisched.core.policy import PLACEMENT_SCORES, preset
from aisched.model.cluster import Cluster
from aisched.model.job import Job
from aisched.sim.saturation import TABLE_HEADER, SaturationResult, saturate, table_rows
from aisched.sim.traces import load_openb_pods

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

NODE_LISTS = {
    "openb": "the openb node list",
    "gpu96": "the openb node list with every GPU node at 96 vCPUs",
    "gpu128-2t": "the openb node list with every GPU node at 128 vCPUs and 2 TiB",
}


def node_list(base: Cluster, name: str) -> Cluster:
    """`base` with its GPU nodes' CPUs and memory set as `name` says (see NODE_LISTS)."""
    if name == "openb":
        return base
    cpu, mem = {"gpu96": (96_000, None), "gpu128-2t": (128_000, 2 * 1024 * 1024)}[name]
    nodes = tuple(
        replace(n, milli_cpu=cpu, mem_mib=mem if mem is not None else n.mem_mib) if n.gpus else n
        for n in base.nodes
    )
    return replace(base, nodes=nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="default", help="openb pod list (default: default)")
    ap.add_argument("--placement", default=",".join(PLACEMENT_SCORES))
    ap.add_argument("--targets", default="0.9,0.95,1.0")
    ap.add_argument("--nodes", default="openb", help=f"node lists: {', '.join(NODE_LISTS)}")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    trace = load_openb_pods(variant=args.variant)
    assert trace.cluster is not None
    jobs = [tj.job for tj in trace.jobs]
    targets = [float(t) for t in args.targets.split(",")]
    advantages: list[str] = []
    for nodes in args.nodes.split(","):
        if nodes not in NODE_LISTS:
            ap.error(f"--nodes: unknown node list {nodes!r}; expected {', '.join(NODE_LISTS)}")
        cluster = node_list(trace.cluster, nodes)
        advantages.append(run_list(args, nodes, cluster, jobs, targets, trace.name))
    if len(advantages) > 1:
        text = (
            f"fgd against bestfit over {len(advantages)} node lists (openb `{args.variant}` pod "
            "list), unallocated GPUs and failed CPU-only pods at 100 % arrived:\n\n"
            + "\n".join(advantages)
        )
        print(text)
        if not args.no_write:
            write_section("saturation-range", text)


def run_list(
    args: argparse.Namespace,
    nodes: str,
    cluster: Cluster,
    jobs: list[Job],
    targets: list[float],
    trace_name: str,
) -> str:
    """One node list's runs; writes its section and returns its fgd-against-bestfit line."""
    results: list[SaturationResult] = []
    for name in args.placement.split(","):
        r = saturate(jobs, cluster, preset(name), targets=targets, trace_name=trace_name)
        results.append(r)
        end = r.points[-1]
        print(
            f"{name}: allocated {end.allocated_share:.2%}, unallocated "
            f"{end.unallocated_share:.2%} at {end.target:.0%} arrived; {r.wall_s:.1f} s",
            flush=True,
        )
    rows = [
        "| " + " | ".join(TABLE_HEADER) + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *("| " + " | ".join(row) + " |" for row in table_rows(results)),
    ]
    arrived = max(p.arrived for r in results for p in r.points)
    head = (
        f"openb `{args.variant}` pod list ({len(jobs):,} pods, replayed from the top once it "
        f"runs out: {arrived:,} arrivals to reach {max(targets):.0%}) on {NODE_LISTS[nodes]} "
        f"({len(cluster.nodes):,} nodes, {cluster.total_gpus:,} GPUs). Wall time per run: "
        + ", ".join(f"{r.policy_name} {r.wall_s:.0f} s" for r in results)
        + " (one run each; noisy, shared machine)."
    )
    text = head + "\n\n" + "\n".join(rows)
    print(text)
    if not args.no_write:
        write_section("saturation" if nodes == "openb" else f"saturation-{nodes}", text)
    last = {r.policy_name: r.points[-1] for r in results}
    fgd, best = last.get("fgd"), last.get("bestfit")
    if fgd is None or best is None:
        return f"- {nodes}: fgd and bestfit did not both run"
    less = (1 - fgd.failed_gpus / best.failed_gpus) * 100 if best.failed_gpus else 0.0
    return (
        f"- {nodes}: fgd leaves {fgd.failed_gpus:,.1f} GPUs unallocated, bestfit "
        f"{best.failed_gpus:,.1f} ({less:.0f} % less); failed CPU-only pods: fgd "
        f"{fgd.failed_cpu_only:,}, bestfit {best.failed_cpu_only:,}"
    )


if __name__ == "__main__":
    main()

"""GPU fragmentation on openb: fgd against best-fit, worst-fit, dot-product and random placement.

The FGD paper's experiment (Weng et al., USENIX ATC '23): the openb default pod list arrives in
trace order on the openb node list (1,523 nodes, 6,212 GPUs) and nothing leaves; a pod that
does not fit when it arrives fails. Reported when the arrived GPU demand reaches 90, 95 and
100 % of capacity: the GPU allocated and the GPU demand left unallocated (failed), as shares of
capacity. The same as

    aisched simulate --trace openb --saturate --placement fgd,bestfit,worstfit,dotprod,random

Writes the table into docs/benchmarks.md.

    python benchmarks/bench_saturation.py [--variant default] [--placement ...] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aisched.core.policy import PLACEMENT_SCORES, preset
from aisched.sim.saturation import TABLE_HEADER, SaturationResult, saturate, table_rows
from aisched.sim.traces import load_openb_pods

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="default", help="openb pod list (default: default)")
    ap.add_argument("--placement", default=",".join(PLACEMENT_SCORES))
    ap.add_argument("--targets", default="0.9,0.95,1.0")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    trace = load_openb_pods(variant=args.variant)
    assert trace.cluster is not None
    cluster = trace.cluster
    jobs = [tj.job for tj in trace.jobs]
    targets = [float(t) for t in args.targets.split(",")]
    results: list[SaturationResult] = []
    for name in args.placement.split(","):
        r = saturate(jobs, cluster, preset(name), targets=targets, trace_name=trace.name)
        results.append(r)
        last = r.points[-1]
        print(
            f"{name}: allocated {last.allocated_share:.2%}, unallocated "
            f"{last.unallocated_share:.2%} at {last.target:.0%} arrived; {r.wall_s:.1f} s",
            flush=True,
        )
    rows = [
        "| " + " | ".join(TABLE_HEADER) + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *("| " + " | ".join(row) + " |" for row in table_rows(results)),
    ]
    arrived = max(p.arrived for r in results for p in r.points)
    head = (
        f"openb `{args.variant}` pod list ({len(jobs):,} pods, replayed from the top once it "
        f"runs out: {arrived:,} arrivals to reach {max(targets):.0%}) on the openb node list "
        f"({len(cluster.nodes):,} nodes, {cluster.total_gpus:,} GPUs). Wall time per run: "
        + ", ".join(f"{r.policy_name} {r.wall_s:.0f} s" for r in results)
        + " (one run each; noisy, shared machine)."
    )
    text = head + "\n\n" + "\n".join(rows)
    print(text)
    if not args.no_write:
        write_section("saturation", text)


if __name__ == "__main__":
    main()

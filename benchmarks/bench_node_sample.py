"""What scoring a bounded sample of feasible nodes costs in packing, on the real traces.

Large clusters score a sample of the feasible nodes per task group, not every one
(`node_sample`, automatic from `placement.AUTO_SAMPLE_FROM_NODES` nodes), so that placement
does not grow with the cluster. The real traces' clusters are smaller than that, so here the
sample is forced on, as a share of the cluster's nodes, to see what it would cost.

Hold-out: the share is chosen on one part of the data and reported on others.
1. Choose: the openb `gpushare40` pod list filled into the openb cluster (the FGD paper's
   saturation run) under bestfit; the smallest share among SHARES whose GPU allocated at 100 %
   arrived is within 0.5 percentage points of scoring every node.
2. Report, with that share: the openb `default` pod list (another list, same cluster) under
   bestfit and fgd, and the Philly trace (another trace and cluster) under fifo on
   `benchmarks/philly-512.yaml` (its first --philly-jobs jobs, one queue): JCT, queueing and
   utilisation with the sample against scoring every node.

    python benchmarks/bench_node_sample.py [--philly-jobs 20000] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from aisched.core.policy import Policy, preset
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.metrics import compute_metrics
from aisched.sim.saturation import saturate
from aisched.sim.traces import load_openb_pods, load_philly, one_queue
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

SHARES = (0.01, 0.02, 0.05, 0.10)
TOLERANCE = 0.005
PHILLY_CLUSTER = Path(__file__).parent / "philly-512.yaml"


def sampled(policy: Policy, share: float | None, nodes: int) -> Policy:
    """`policy` scoring every node (share None) or a share of the nodes (at least 8)."""
    return replace(policy, node_sample=0 if share is None else max(8, round(share * nodes)))


def allocated(variant: str, placement: str, share: float | None) -> tuple[float, float]:
    """GPU allocated at 100 % arrived (share of capacity) and CPU seconds of the run."""
    trace = load_openb_pods(variant=variant)
    assert trace.cluster is not None
    policy = sampled(preset(placement), share, len(trace.cluster.nodes))
    t0 = time.process_time()
    r = saturate([tj.job for tj in trace.jobs], trace.cluster, policy, targets=[1.0])
    return r.points[-1].allocated_share, time.process_time() - t0


def choose_share() -> tuple[float, list[str]]:
    full, _ = allocated("gpushare40", "bestfit", None)
    lines = [f"every node: {full:.2%}"]
    chosen = SHARES[-1]
    for share in SHARES:
        got, _ = allocated("gpushare40", "bestfit", share)
        lines.append(f"{share:.0%} of nodes: {got:.2%}")
        print(f"choose (openb gpushare40, bestfit): {share:.0%} -> {got:.2%} (all {full:.2%})")
        if full - got <= TOLERANCE:
            chosen = share
            break
    return chosen, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--philly-jobs", type=int, default=20_000)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    share, chosen_lines = choose_share()
    rows = [
        "| data (held out) | policy | nodes scored | figure | every node | sample | CPU-s every node / sample |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    openb_nodes = len(load_openb_pods(variant="default").cluster.nodes)  # type: ignore[union-attr]
    for placement in ("bestfit", "fgd"):
        full, cpu_full = allocated("default", placement, None)
        got, cpu_got = allocated("default", placement, share)
        k = max(8, round(share * openb_nodes))
        rows.append(
            f"| openb `default`, {openb_nodes:,} nodes | {placement} | {k} | GPU allocated at "
            f"100 % arrived | {full:.2%} | {got:.2%} | {cpu_full:.1f} / {cpu_got:.1f} |"
        )
        print(rows[-1], flush=True)
    trace = one_queue(load_philly(limit=args.philly_jobs))
    cluster = resolve_cluster(str(PHILLY_CLUSTER))
    k = max(8, round(share * len(cluster.nodes)))
    runs = {}
    for label, s in (("every node", None), ("sample", share)):
        t0 = time.process_time()
        result = simulate(
            trace, cluster, sampled(preset("fifo"), s, len(cluster.nodes)), SimConfig()
        )
        runs[label] = (compute_metrics(result), time.process_time() - t0)
    (m_full, c_full), (m_s, c_s) = runs["every node"], runs["sample"]
    where = f"Philly, first {len(trace.jobs):,} jobs, one queue, {len(cluster.nodes)} nodes"
    for name, f, g in (
        ("avg JCT (h)", m_full.avg_jct_s, m_s.avg_jct_s),
        ("avg queueing (h)", m_full.avg_queueing_s, m_s.avg_queueing_s),
    ):
        rows.append(
            f"| {where} | fifo | {k} | {name} | {(f or 0) / 3600:.3f} | {(g or 0) / 3600:.3f} "
            f"| {c_full:.1f} / {c_s:.1f} |"
        )
    rows.append(
        f"| {where} | fifo | {k} | GPU utilisation | {(m_full.gpu_utilisation or 0):.2%} "
        f"| {(m_s.gpu_utilisation or 0):.2%} | |"
    )
    print("\n".join(rows[-3:]), flush=True)
    text = (
        f"Share of nodes chosen on openb `gpushare40` under bestfit (GPU allocated at 100 % "
        f"arrived; the smallest share within {TOLERANCE:.1%} points of scoring every node): "
        f"{'; '.join(chosen_lines)}. Chosen: {share:.0%}.\n\nReported on data not used to "
        "choose it:\n\n" + "\n".join(rows)
    )
    print(text)
    if not args.no_write:
        write_section("node-sample", text)


if __name__ == "__main__":
    main()

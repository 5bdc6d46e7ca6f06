"""Learned scheduling measured off the data it was tuned on: fifo, las, qssf and the oracles on
Philly weeks split into a tuning part and a held-out part.

Splits (fixed before any parameter was chosen, by VC and month):
- tuning: VC 6214e9's week of 2017-10-01..07 (8,562 jobs). qssf's order weight, preemption
  guards and starvation guard, and the predictor's calibration, were chosen on it alone.
- held-out: VC 6214e9's week of 2017-11-12..18 (another month), VC 6c71a0's week of
  2017-10-15..21 and VC 11cb48's week of 2017-11-12..18 (other VCs). Reported, never tuned on.

Each week runs on two clusters of 8-GPU nodes sized from its own offered load (GPU-time
submitted over the week, divided by its length): a roomy one (`ROOMY` x the load) and a tight
one (`TIGHT` x the load), rounded to whole nodes; for the tuning week that is 64 and 32 GPUs.
Every job is in one queue, checkpoints every hour, 60 s restart cost (the simulator's defaults).

Prints per row the average, median and p99 JCT, preemptions, and for the predicted policies
the predictor's coverage (share of true runtimes at or under the predicted upper bound) and
median error ratio max(pred/true, true/pred); writes both splits into docs/benchmarks.md.

    python benchmarks/bench_holdout.py [--split tuning,held-out] [--policy ...] [--jobs N] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from aisched.core.policy import preset
from aisched.model.cluster import Cluster
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import estimator_for
from aisched.sim.metrics import PolicyMetrics, compute_metrics
from aisched.sim.traces import Trace, load_philly, one_queue
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402
from bench_philly_week import write_week as write_vc_days  # noqa: E402

POLICIES = "fifo,las,qssf,sjf-oracle,srtf-oracle"
ROOMY = 1.75
TIGHT = 0.88
GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class Week:
    vc: str
    first: str  # inclusive days, YYYY-MM-DD
    last: str


SPLITS: dict[str, tuple[Week, ...]] = {
    "tuning": (Week("6214e9", "2017-10-01", "2017-10-07"),),
    "held-out": (
        Week("6214e9", "2017-11-12", "2017-11-18"),
        Week("6c71a0", "2017-10-15", "2017-10-21"),
        Week("11cb48", "2017-11-12", "2017-11-18"),
    ),
}


def write_week(out: Path, week: Week) -> int:
    """Copy one VC's rows of the week from the shared Philly CSV to `out`; returns the count."""
    return write_vc_days(out, week.vc, (week.first, week.last))


def load_week(week: Week) -> Trace:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "philly.csv"
        write_week(path, week)
        return one_queue(load_philly(path))


def offered_gpus(trace: Trace, week: Week) -> float:
    """GPU-time submitted in the week over the week's length: the GPUs it keeps busy on average."""
    days = (date.fromisoformat(week.last) - date.fromisoformat(week.first)).days + 1
    return sum(tj.duration_s * tj.job.num_gpus for tj in trace.jobs) / (days * 86400.0)


def cluster_of(gpus: int) -> Cluster:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.yaml"
        path.write_text(
            "pools:\n  - name: philly\n    zones: 1\n    racks_per_zone: 1\n"
            f"    nodes_per_rack: {gpus // GPUS_PER_NODE}\n    gpus_per_node: {GPUS_PER_NODE}\n"
            "    gpu_model: P100\n    gpu_mem_gib: 24\n    cpus: 48\n    mem_gib: 512\n"
        )
        cluster: Cluster = resolve_cluster(str(path))
        return cluster


def sizes(load: float) -> tuple[int, int]:
    def whole_nodes(x: float) -> int:
        return max(1, round(x / GPUS_PER_NODE)) * GPUS_PER_NODE

    return whole_nodes(ROOMY * load), whole_nodes(TIGHT * load)


@dataclass(frozen=True, slots=True)
class Row:
    split: str
    week: Week
    gpus: int
    policy: str
    metrics: PolicyMetrics
    cpu_s: float


def run_one(split: str, week: Week, gpus: int, policy: str) -> Row:
    trace = load_week(week)
    cluster = cluster_of(gpus)
    pol = preset(policy)
    t0 = time.process_time()
    result = simulate(trace, cluster, pol, SimConfig(), estimator=estimator_for(pol))
    cpu_s = time.process_time() - t0
    m = compute_metrics(result)
    print(f"{split} {week.vc} {week.first} {gpus} GPUs {policy}: avg JCT "
          f"{(m.avg_jct_s or 0) / 3600:.2f} h, {cpu_s:.0f} CPU-s", flush=True)  # fmt: skip
    return Row(split, week, gpus, policy, m, cpu_s)


def _h(x: float | None) -> str:
    return f"{(x or 0.0) / 3600:.2f}"


def table(rows: list[Row]) -> str:
    out = [
        "| week | GPUs | policy | avg JCT (h) | vs srtf-oracle | median JCT (h) | p99 JCT (h) | p99 vs fifo | preemptions | coverage | median error ratio | CPU-s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ref = {(r.week, r.gpus, r.policy): r.metrics for r in rows}
    for r in rows:
        m = r.metrics
        srtf = ref.get((r.week, r.gpus, "srtf-oracle"))
        fifo = ref.get((r.week, r.gpus, "fifo"))
        vs = f"{(m.avg_jct_s or 0) / srtf.avg_jct_s:.2f}x" if srtf and srtf.avg_jct_s else "-"
        p99 = f"{(m.p99_jct_s or 0) / fifo.p99_jct_s:.2f}x" if fifo and fifo.p99_jct_s else "-"
        predicted = not r.policy.endswith("-oracle") and m.estimate_under_upper is not None
        cov = f"{m.estimate_under_upper:.1%}" if predicted and m.estimate_under_upper else "-"
        err = f"{m.estimate_median_ratio:.2f}" if predicted and m.estimate_median_ratio else "-"
        out.append(
            f"| {r.week.vc} {r.week.first}..{r.week.last[5:]} | {r.gpus} | {r.policy} "
            f"| {_h(m.avg_jct_s)} | {vs} | {_h(m.median_jct_s)} | {_h(m.p99_jct_s)} | {p99} "
            f"| {m.preemptions:,} | {cov} | {err} | {r.cpu_s:.0f} |"
        )
    return "\n".join(out)


def goals(rows: list[Row]) -> str:
    """The issue's goals, each said plainly as met or not, per row."""
    ref = {(r.week, r.gpus, r.policy): r.metrics for r in rows}
    lines: list[str] = []
    for week, gpus in dict.fromkeys((r.week, r.gpus) for r in rows):
        q, f, s = (ref.get((week, gpus, p)) for p in ("qssf", "fifo", "srtf-oracle"))
        if q is None:
            continue
        parts = []
        if s is not None and s.avg_jct_s:
            ratio = (q.avg_jct_s or 0) / s.avg_jct_s
            parts.append(f"qssf/srtf-oracle {ratio:.2f}x")
        if f is not None and f.p99_jct_s:
            ok = (q.p99_jct_s or 0) <= f.p99_jct_s
            parts.append(f"p99 {'<=' if ok else '>'} fifo's ({'met' if ok else 'not met'})")
        if q.estimate_under_upper is not None:
            ok = q.estimate_under_upper >= 0.85
            parts.append(
                f"coverage {q.estimate_under_upper:.1%} ({'met' if ok else 'not met'} >= 85 %)"
            )
        lines.append(f"- {week.vc} {week.first}, {gpus} GPUs: " + "; ".join(parts))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="tuning,held-out")
    ap.add_argument("--policy", default=POLICIES)
    ap.add_argument("--jobs", type=int, default=2, help="replays to run side by side")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    policies = args.policy.split(",")
    for split in args.split.split(","):
        if split not in SPLITS:
            ap.error(f"--split: unknown split {split!r}; expected {', '.join(SPLITS)}")
        tasks: list[tuple[str, Week, int, str]] = []
        heads: list[str] = []
        for week in SPLITS[split]:
            trace = load_week(week)
            load = offered_gpus(trace, week)
            roomy, tight = sizes(load)
            heads.append(
                f"VC {week.vc}, {week.first}..{week.last}: {len(trace.jobs):,} jobs, offered "
                f"load {load:.1f} GPUs, run on {roomy} and {tight} GPUs"
            )
            tasks += [(split, week, g, p) for g in (roomy, tight) for p in policies]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(run_one, *zip(*tasks, strict=True)))
        tuned = (
            "Parameters chosen on this split (tuned figures)."
            if split == "tuning"
            else "Held out: no parameter was chosen on these weeks."
        )
        body = (
            f"Split `{split}`. {tuned} Nodes of 8 GPUs sized {ROOMY}x and {TIGHT}x each week's "
            "offered load; one queue; checkpoints every hour, 60 s restart cost. Coverage: share "
            "of finished jobs whose true runtime is at or under the predicted upper bound "
            "(nominal 90 %). CPU-s: process time of the replay.\n\n"
            + "\n".join(f"- {h}" for h in heads)
            + "\n\n"
            + table(rows)
            + "\n\nGoals (qssf <= 1.25x srtf-oracle on the tuning week at 64 GPUs; qssf p99 <= "
            "fifo p99 on every row; coverage >= 85 % on held-out weeks):\n\n" + goals(rows)
        )
        print(body, flush=True)
        if not args.no_write:
            write_section(f"holdout-{split}", body)


if __name__ == "__main__":
    main()

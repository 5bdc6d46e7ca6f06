"""Inference and training on one pool: a diurnal inference service beside the Philly trace, with
and without opportunistic batch.

The service's load follows a day: `base + peak × (1 − cos(2πt/day)) / 2` requests per second,
`target` rps per replica, one GPU per replica. Every 15 minutes the HPA rule of the service
(`core.autoscale.decide`, 30-minute scale-down window) sets the replica count; each replica
becomes a high-priority, non-preemptible one-GPU job of the trace, arriving when a scale-up adds
it and lasting until the scale-down that removes it (newest first). Training is the first
`--days` days of the Philly trace, preemptible, checkpointing hourly. Both go through the real
simulator and scheduling core (`default` preset: a replica that does not fit preempts
training).

- reserved: the service owns `max_replicas` GPUs (one node pool); training gets the rest.
  Replicas start at once; training never sees the service's idle headroom.
- opportunistic: one pool; training may use whatever replicas leave idle and is preempted
  (checkpoint, requeue) when the service scales up.

SLO attainment: the share of replica-seconds the service asked for that it got (a replica that
waits to start leaves the service under-provisioned meanwhile). GPU utilisation: GPU-seconds
used (training and replicas) over the pool's GPU-seconds until the last training job ended.

    python benchmarks/bench_diurnal_mix.py [--days 7] [--nodes 32] [--no-write]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from aisched.core.autoscale import Recommendation, decide
from aisched.core.policy import preset
from aisched.model.cluster import GPU, Cluster, Node
from aisched.model.job import Job, JobKind, TaskGroup
from aisched.model.resources import Resources
from aisched.model.service import ServiceSpec
from aisched.sim.engine import SimConfig, SimResult, simulate
from aisched.sim.traces import load_philly
from aisched.sim.traces.base import Trace, TraceJob

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

DAY_S = 86400.0
STEP_S = 900.0


def pool(nodes: int, prefix: str) -> list[Node]:
    return [
        Node(
            name=f"{prefix}{i}",
            milli_cpu=64_000,
            mem_mib=512 * 1024,
            gpus=tuple(GPU(g, "V100", 32 * 1024) for g in range(8)),
            rack=f"{prefix}rack{i // 8}",
        )
        for i in range(nodes)
    ]


def replica_jobs(days: float, spec: ServiceSpec, base: float, peak: float) -> list[TraceJob]:
    """The replica jobs the HPA rule asks for over `days` (each a one-GPU job)."""
    request = Resources(milli_cpu=4000, mem_mib=16 * 1024, gpu=1)
    live: list[tuple[str, float]] = []  # (id, start) oldest first
    out: list[TraceJob] = []
    history: list[Recommendation] = []
    end = days * DAY_S
    t, n = 0.0, 0
    while t < end:
        rps = base + peak * (1 - math.cos(2 * math.pi * t / DAY_S)) / 2
        current = len(live)
        load = rps / current if current else rps
        d, history = decide(spec, current, load, history, t)
        while len(live) < d.desired:
            n += 1
            live.append((f"svc-{n}", t))
        while len(live) > d.desired:
            rid, start = live.pop()
            out.append(_replica(rid, start, t - start, request))
        t += STEP_S
    out.extend(_replica(rid, start, end - start, request) for rid, start in live)
    return out


def _replica(rid: str, start: float, duration: float, request: Resources) -> TraceJob:
    job = Job(
        rid,
        (TaskGroup("replica", 1, request),),
        name=rid,
        kind=JobKind.INFER,
        queue="default",
        priority=1000,
        preemptible=False,
        submit_time_s=start,
    )
    return TraceJob(job, max(duration, 1.0), "service")


def run(trace: Trace, cluster: Cluster) -> tuple[SimResult, float]:
    t0 = time.perf_counter()
    result = simulate(trace, cluster, preset("default"), SimConfig(checkpoint_interval_s=3600.0))
    return result, time.perf_counter() - t0


def allocated_gpu_s(result: SimResult, until: float) -> float:
    """GPU-seconds allocated in [0, until), from the run's timeline (a step function)."""
    total = 0.0
    points = result.timeline
    for (t, gpus, _, _), nxt in zip(points, [*points[1:], None], strict=True):
        end = until if nxt is None else min(nxt[0], until)
        if end > t:
            total += gpus * (end - t)
    return total


def figures(
    result: SimResult, gpus: float, window_s: float, extra_service_gpu_s: float = 0.0
) -> dict[str, float]:
    train = [r for r in result.jobs if not r.job_id.startswith("svc-")]
    replicas = [r for r in result.jobs if r.job_id.startswith("svc-")]
    done = [r for r in train if r.finish_s is not None]
    jct = [r.finish_s - r.submit_s for r in done if r.finish_s is not None]
    asked = sum(r.duration_s for r in replicas)
    late = sum(
        min((r.first_start_s if r.first_start_s is not None else result.end_s) - r.submit_s,
            r.duration_s)
        for r in replicas
    )  # fmt: skip
    used = allocated_gpu_s(result, window_s) + extra_service_gpu_s
    return {
        "slo": 1.0 if not replicas and extra_service_gpu_s else 1 - late / asked if asked else 1.0,
        "jct_h": statistics.fmean(jct) / 3600 if jct else math.nan,
        "jct_p90_h": (sorted(jct)[int(0.9 * (len(jct) - 1))] / 3600) if jct else math.nan,
        "queue_h": statistics.fmean((r.first_start_s or 0) - r.submit_s for r in done) / 3600
        if done
        else math.nan,
        "done": len(done),
        "jobs": len(train),
        "util": used / (gpus * window_s),
        "preemptions": sum(r.preemptions for r in train),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start-day", type=float, default=40.0, help="where the window begins")
    ap.add_argument("--days", type=float, default=5.0)
    ap.add_argument("--nodes", type=int, default=48, help="8-GPU nodes in the whole pool")
    ap.add_argument("--base-rps", type=float, default=1000.0)
    ap.add_argument("--peak-rps", type=float, default=11800.0)
    ap.add_argument("--target", type=float, default=100.0, help="rps per replica")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()

    philly = load_philly()
    start, end = args.start_day * DAY_S, (args.start_day + args.days) * DAY_S
    train = [
        replace(
            tj, job=replace(tj.job, queue="default", submit_time_s=tj.job.submit_time_s - start)
        )
        for tj in philly.jobs
        if start <= tj.job.submit_time_s < end
    ]
    max_replicas = math.ceil((args.base_rps + args.peak_rps) / args.target)
    spec = ServiceSpec(1, max_replicas, target=args.target, scale_down_window_s=1800.0)
    replicas = replica_jobs(args.days, spec, args.base_rps, args.peak_rps)
    service_gpu_s = sum(r.duration_s for r in replicas)
    reserved_nodes = math.ceil(max_replicas / 8)
    gpus = args.nodes * 8.0
    print(
        f"{len(train):,} training jobs over {args.days:g} days; service {args.base_rps:g}.."
        f"{args.base_rps + args.peak_rps:g} rps, {len(replicas)} replica jobs, up to "
        f"{max_replicas} GPUs; pool {args.nodes} nodes ({gpus:g} GPUs)",
        flush=True,
    )

    # Reserved: training alone on the nodes the service does not own; replicas start at once.
    reserved, wall_r = run(
        Trace("philly-window", tuple(train)), Cluster(pool(args.nodes - reserved_nodes, "t"))
    )
    window = args.days * DAY_S
    r = figures(reserved, gpus, window, extra_service_gpu_s=service_gpu_s)
    # Opportunistic: one pool, replicas preempt training.
    both = sorted([*train, *replicas], key=lambda tj: (tj.job.submit_time_s, tj.job.id))
    shared, wall_o = run(
        Trace("philly-window+service", tuple(both)), Cluster(pool(args.nodes, "n"))
    )
    o = figures(shared, gpus, window)

    rows = [
        "| mode | service SLO attainment | training jobs done | avg JCT (h) | p90 JCT (h) "
        "| avg queueing (h) | GPU util. | training preemptions | sim wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, f, wall in (("reserved", r, wall_r), ("opportunistic", o, wall_o)):
        line = (
            f"| {name} | {f['slo']:.2%} | {f['done']:,} / {f['jobs']:,} | {f['jct_h']:.2f} "
            f"| {f['jct_p90_h']:.2f} | {f['queue_h']:.2f} | {f['util']:.1%} "
            f"| {f['preemptions']:,} | {wall:.1f} s |"
        )
        print(line, flush=True)
        rows.append(line)
    text = "\n".join(rows)
    text += (
        f"\n\n{len(train):,} Philly jobs (days {args.start_day:g} to "
        f"{args.start_day + args.days:g} of the trace, one queue); a pool of "
        f"{args.nodes} nodes × 8 GPUs; the service {args.base_rps:g}–"
        f"{args.base_rps + args.peak_rps:g} rps over a day, {args.target:g} rps per one-GPU "
        f"replica, 1–{max_replicas} replicas ({len(replicas)} replica jobs), 15-minute "
        "autoscaler rounds, 30-minute scale-down window. Reserved: the service owns "
        f"{reserved_nodes} nodes. GPU utilisation: GPUs allocated (training and replicas) over "
        f"the whole pool during the {args.days:g}-day window."
    )
    if not args.no_write:
        write_section("diurnal", text)


if __name__ == "__main__":
    main()

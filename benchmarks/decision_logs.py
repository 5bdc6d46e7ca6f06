"""Dump the simulator's decision log of each policy on the Philly week of `bench_philly_week.py`
and on the first jobs of the loaded 512-GPU Philly replay (`bench_replay.py --cluster
benchmarks/philly-512.yaml`), so that a change meant to make the cycle faster can be checked to
decide exactly what it decided before: run it before and after, then `diff -r` the two folders.

Each run writes `<case>-<policy>.log` (one decision per line: time, kind, job, details) and,
with `--statuses`, `<case>-<policy>.statuses` (a digest of every cycle's status per pending
job, in pending order), and prints a SHA-256 per file with the run's CPU-seconds.

    python benchmarks/decision_logs.py OUT_DIR [--cases week,replay512] [--limit 20000]
        [--policy fifo-strict,fifo,las,srtf-oracle] [--statuses]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aisched.sim.engine as engine
from aisched.core.cycle import CycleResult
from aisched.core.policy import Policy, preset
from aisched.core.snapshot import PendingJob, Snapshot
from aisched.model.cluster import Cluster
from aisched.sim.engine import SimConfig, simulate
from aisched.sim.estimators import estimator_for
from aisched.sim.traces import Trace, fit_gangs_to, load_philly
from aisched.spec import resolve_cluster

sys.path.insert(0, str(Path(__file__).parent))
from bench_philly_week import CLUSTER as WEEK_CLUSTER  # noqa: E402
from bench_philly_week import write_week  # noqa: E402

REPLAY_CLUSTER = Path(__file__).parent / "philly-512.yaml"


def week_case() -> tuple[Trace, Cluster]:
    cluster = resolve_cluster(str(WEEK_CLUSTER))
    with tempfile.TemporaryDirectory() as tmp:
        week = Path(tmp) / "philly.csv"
        write_week(week)
        trace, _ = fit_gangs_to(load_philly(week), cluster)
    return trace, cluster


def replay_case(limit: int) -> tuple[Trace, Cluster]:
    return load_philly(limit=limit), resolve_cluster(str(REPLAY_CLUSTER))


def _status_recorder(sink: Any) -> Callable[..., CycleResult]:
    real = engine.run_cycle

    def recording(
        snapshot: Snapshot, pending: Sequence[PendingJob], policy: Policy, now: float, **kw: Any
    ) -> CycleResult:
        result = real(snapshot, pending, policy, now, **kw)
        d = result.diagnostics
        line = "|".join(f"{pj.id}:{d[pj.id]}" for pj in pending)
        sink.update(f"{now!r} {line}\n".encode())
        return result

    return recording


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--cases", default="week,replay512")
    ap.add_argument("--limit", type=int, default=20_000, help="jobs of the 512-GPU replay")
    ap.add_argument("--policy", default="fifo-strict,fifo,las,srtf-oracle")
    ap.add_argument("--statuses", action="store_true", help="also digest every cycle's statuses")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for case in args.cases.split(","):
        trace, cluster = week_case() if case == "week" else replay_case(args.limit)
        for name in args.policy.split(","):
            policy = preset(name)
            digest = hashlib.sha256()
            real = engine.run_cycle
            if args.statuses:
                engine.run_cycle = _status_recorder(digest)  # type: ignore[assignment]
            c0 = time.process_time()
            try:
                result = simulate(
                    trace, cluster, policy, SimConfig(), estimator=estimator_for(policy)
                )
            finally:
                engine.run_cycle = real  # type: ignore[assignment]
            cpu_s = time.process_time() - c0
            text = "".join(
                f"{t!r} {kind} {job} {' '.join(map(str, rest))}\n"
                for t, kind, job, rest in result.log
            )
            log = args.out / f"{case}-{name}.log"
            log.write_text(text)
            summary = f"{hashlib.sha256(text.encode()).hexdigest()[:16]}"
            if args.statuses:
                (args.out / f"{case}-{name}.statuses").write_text(digest.hexdigest() + "\n")
                summary += f" statuses {digest.hexdigest()[:16]}"
            print(
                f"{case} {name}: {len(result.log):,} entries, {result.cycles:,} cycles, "
                f"{cpu_s:.1f} CPU-s, log {summary}",
                flush=True,
            )


if __name__ == "__main__":
    main()

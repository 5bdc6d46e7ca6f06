"""What a finished job costs the service loop when many waiting jobs depend on it (pipelines).

A real loop (`service.loop.Scheduler`) over a SQLite store, with the fake executor and a fake
clock, as in tests/service: `--heads` running jobs, and `--waiters` pending jobs that each
depend on all of them (`depends_on`, condition success). Then the heads end one at a time;
each end is one loop step, whose CPU time (user + system of this process) is measured. Every
head but the last leaves all waiters waiting (their status changes: one dependency fewer to
wait for); with `--release`, every head ends and the last one, which releases them all, is
measured apart. Prints the median CPU seconds per finished head and writes the figures into
docs/benchmarks.md; `--before` quotes the same figure measured on the code before, with the
ratio (run it there with `--no-write`).

    python benchmarks/bench_pipelines.py [--heads 100] [--waiters 10000] [--ends 10]
        [--release] [--before CPU_S] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from aisched.core.policy import preset
from aisched.executors.base import ExitKind
from aisched.model.job import Dependency, DependencyCondition, Job, RestartPolicy
from aisched.model.queue import QueueTree
from aisched.service.loop import LoopConfig, Scheduler
from aisched.store.db import Store
from aisched.testing import job
from aisched.testing.fakes import FakeExecutor, fake_node

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

SUBMIT_CHUNK = 500  # waiters per submission: one loop step each


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make_job(name: str, deps: tuple[str, ...], gpus: int) -> Job:
    j = job(name).task(gpu=gpus).build()
    return replace(
        j,
        name=name,
        restart_policy=RestartPolicy.NEVER,
        depends_on=tuple(Dependency(d, DependencyCondition.SUCCESS) for d in deps),
    )


def submit(sched: Scheduler, jobs: list[Job]) -> list[str]:
    fut = sched.submit_all(tuple((j, "native", ()) for j in jobs))
    sched.step()
    return [str(r["id"]) for r in fut.result(0)]


def measure(
    home: Path, heads: int, waiters: int, ends: int, release: bool
) -> tuple[float, float, float | None]:
    """(setup CPU-s, median CPU-s of a head's end that leaves the waiters waiting, CPU-s of
    the last head's end, which releases them all, if `release`)."""
    fx = FakeExecutor([fake_node(gpus=heads, cpus=heads * 2, mem_gib=heads * 8)])
    sched = Scheduler(
        Store.sqlite(home / "state.db"),
        fx,
        preset("default"),
        QueueTree(),
        LoopConfig(data_dir=home, cycle_interval_s=5.0, max_backoff_s=60.0, cycle_gap_factor=0),
        clock=Clock(),
    )
    sched.recover()
    t0 = time.process_time()
    head_ids = submit(sched, [make_job(f"head{i}", (), 1) for i in range(heads)])
    for start in range(0, waiters, SUBMIT_CHUNK):
        n = min(SUBMIT_CHUNK, waiters - start)
        submit(sched, [make_job(f"w{start + i}", tuple(head_ids), 0) for i in range(n)])
    setup = time.process_time() - t0
    assert len(sched.pipelines.blocked) == waiters, "every waiter must be held back"

    def end(head: str) -> float:
        for key in fx.keys(head):
            fx.exit(key, 0, ExitKind.EXITED)
        t = time.process_time()
        sched.step()
        return time.process_time() - t

    costs = [end(h) for h in head_ids[: min(ends, heads - 1)]]
    if not release:
        return setup, statistics.median(costs), None
    for h in head_ids[len(costs) : -1]:  # unmeasured: only the last end is measured again
        end(h)
    last = end(head_ids[-1])
    assert not sched.pipelines.blocked, "the last head's end must release every waiter"
    return setup, statistics.median(costs), last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=100)
    ap.add_argument("--waiters", type=int, default=10_000)
    ap.add_argument("--ends", type=int, default=10, help="heads' ends measured (median)")
    ap.add_argument("--release", action="store_true", help="end every head; measure the last")
    ap.add_argument("--before", type=float, help="the same figure from the code before, to quote")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup, per_end, last = measure(Path(tmp), args.heads, args.waiters, args.ends, args.release)
    print(f"setup (submit {args.heads} heads and {args.waiters} waiters): {setup:.2f} CPU-s")
    print(f"one head ends, waiters still wait: {per_end:.3f} CPU-s (median of {args.ends})")
    rows = [
        "| loop step | CPU-s |",
        "| --- | ---: |",
        f"| one head ends, {args.waiters:,} waiters still wait (median of {args.ends}) "
        f"| {per_end:.3f} |",
    ]
    if last is not None:
        print(f"the last head ends, every waiter is released: {last:.2f} CPU-s")
        rows.append(f"| the last head ends, {args.waiters:,} waiters released | {last:.2f} |")
    if args.before is not None:
        print(f"ratio, before / now, per end: {args.before / per_end:.1f}x")
        rows.append(
            f"| one head ends, the code before (`--before`, same machine) | {args.before:.3f} "
            f"({args.before / per_end:.1f}x) |"
        )
    text = (
        f"{args.heads} running jobs, {args.waiters:,} pending jobs each depending on all of "
        "them (the loop over SQLite, the fake executor). Each end rewrites the status of all "
        f"{args.waiters:,} waiters (their reason counts what they still await): that write is "
        "most of what is left.\n\n" + "\n".join(rows)
    )
    if not args.no_write:
        write_section("pipelines", text)


if __name__ == "__main__":
    main()

"""Launch latency and throughput of the local executor, with tiny tasks (`true`).

One at a time: for each of N tasks, the time the `launch()` call takes, the time from the call to
the task's command running (the supervisor's `started_at`, written once exec succeeded), and the
time until its exit comes out of `poll()` (woken by the executor's wakeup callback). Then a
burst: N launches back to back, giving launches/s (calls only) and tasks completed/s (until
every exit has been seen). Prints medians and p99s; writes nothing into docs.

    python benchmarks/bench_launch.py [--tasks 200] [--mem-mechanism auto|cgroup-v1|rlimit|none]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from aisched.executors import task_files
from aisched.executors.base import TaskKey, TaskLaunch
from aisched.executors.local import LocalExecutor
from aisched.model.cluster import Node


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]


class Bench:
    def __init__(self, root: Path, mechanism: str) -> None:
        self.root = root
        node = Node("bench", milli_cpu=len(os.sched_getaffinity(0)) * 1000, mem_mib=1024)
        self.ex = LocalExecutor(root / "state", node, mem_mechanism=mechanism)
        self.woken = threading.Event()
        self.ex.set_wakeup(self.woken.set)
        self.seen: set[TaskKey] = set()

    def request(self, attempt: int, i: int) -> TaskLaunch:
        return TaskLaunch(
            job_id="bench",
            attempt=attempt,
            task=f"t-{i}",
            node="bench",
            command=("true",),
            env={"PATH": os.environ.get("PATH", os.defpath)},
            workdir=None,
            milli_cpu=1000,
            mem_limit_mib=256,
            gpus=(),
            log_path=str(self.root / "logs" / f"{attempt}-{i}.log"),
            grace_period_s=1.0,
        )

    def wait_exits(self, keys: set[TaskKey]) -> None:
        while not keys <= self.seen:
            self.woken.wait(1.0)
            self.woken.clear()
            for ev in self.ex.poll():
                assert ev.exit_code == 0, ev
                self.seen.add(ev.key)

    def one_at_a_time(self, n: int) -> dict[str, list[float]]:
        call, started, done = [], [], []
        for i in range(n):
            t_wall, t0 = time.time(), time.perf_counter()
            h = self.ex.launch(self.request(0, i))
            call.append(time.perf_counter() - t0)
            self.wait_exits({h.key})
            done.append(time.perf_counter() - t0)
            rec = task_files.read_json(str(self.ex.task_dir(h.key) / task_files.STARTED))
            assert rec is not None
            started.append(rec["started_at"] - t_wall)
        return {
            "launch() call": call,
            "launch to command running": started,
            "launch to exit seen": done,
        }

    def burst(self, n: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        keys = {self.ex.launch(self.request(1, i)).key for i in range(n)}
        launched = time.perf_counter() - t0
        self.wait_exits(keys)
        return n / launched, n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--mem-mechanism", default="auto")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), args.mem_mechanism)
        info = bench.ex.info()
        print(f"local executor, memory limit by {info.memory_limit}, {args.tasks} tasks `true`,")
        print(f"{len(os.sched_getaffinity(0))} usable cores")
        print()
        print("| one at a time | median | p99 |")
        print("| --- | ---: | ---: |")
        for name, xs in bench.one_at_a_time(args.tasks).items():
            print(f"| {name} | {statistics.median(xs) * 1000:.1f} ms | {p99(xs) * 1000:.1f} ms |")
        launches, completed = bench.burst(args.tasks)
        print()
        print(
            f"burst of {args.tasks}: {launches:.0f} launches/s, {completed:.0f} tasks completed/s"
        )
        bench.ex.close()


if __name__ == "__main__":
    main()

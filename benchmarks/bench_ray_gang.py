"""Time from submit to every task running, for a 16-task gang on a local multi-node Ray cluster.

Starts a Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head with no CPUs and
`--nodes` worker nodes of 4 declared GPUs each, in two racks), a real `aisched up --ray ADDRESS`
on it, and submits, `--runs` times, a gang of `--tasks` tasks of 1 GPU and 0.25 CPU each over
HTTP. Each task writes the time its process started into a file and then waits to be released.
Two figures per run, from submission (the service's `submitted_at`) to the tasks' own clocks
when their processes started: the first task running, and every task running.

Then the gang is cancelled, and the next run waits until Ray holds no GPU. Prints the figures
and their medians and writes them to docs/benchmarks.md (unless --no-write).

    python benchmarks/bench_ray_gang.py [--runs 5] [--tasks 16] [--nodes 4] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402
from _service import admin_headers, free_port, start_service  # noqa: E402

MIB = 1 << 20
GPUS_PER_NODE = 4
# Submit to all 16 running with one Ray actor per task (the executor before the node agents),
# median of 5 runs of this command on the development machine.
BEFORE_S = 10.11
RAY_ENV = {
    # A shared cluster asks for its token, and aisched up as root refuses one that does not.
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN": secrets.token_hex(32),
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    "RAY_enable_metrics_collection": "0",
}
TASK = textwrap.dedent(
    """
    import os, sys, time
    started = time.time()
    name = f"started-{os.environ['AISCHED_JOB_ID']}-{os.environ['RANK']}"
    with open(name + ".tmp", "w") as f:
        f.write(repr(started))
    os.replace(name + ".tmp", name)
    while not os.path.exists("release"):
        time.sleep(0.2)
    """
)


def start_cluster(nodes: int) -> Any:
    os.environ.update(RAY_ENV)
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": 80 * MIB, "include_dashboard": False},
    )
    for i in range(nodes):
        rack = f"r{i % 2}"
        cluster.add_node(
            num_cpus=4,
            num_gpus=GPUS_PER_NODE,
            memory=4096 * MIB,
            object_store_memory=80 * MIB,
            labels={"aisched/name": f"n{i}", "aisched/rack": rack},
        )
    return cluster


def wait(what: str, check: Any, timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while (got := check()) is None or got is False:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return got


def one_run(http: httpx.Client, work: Path, tasks: int) -> tuple[float, float]:
    job = {
        "name": "gang",
        "replicas": tasks,
        "command": [sys.executable, "task.py"],
        "resources": {"cpus": 0.25, "gpus": 1, "mem": "128M"},
        "workdir": str(work),
        "grace_period": "5s",
    }
    job_id = http.post("/v1/jobs", json=job).json()["id"]
    files = [work / f"started-{job_id}-{r}" for r in range(tasks)]
    wait("every task to start", lambda: all(f.exists() for f in files))
    submitted = http.get(f"/v1/jobs/{job_id}").json()["submitted_at"]
    starts = [float(f.read_text()) - submitted for f in files]
    first, running = min(starts), max(starts)
    http.post(f"/v1/jobs/{job_id}/cancel")
    wait("the gang to stop", lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] == "cancelled")
    return first, running


def ray_gpus_held(address: str) -> float:
    import ray

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    total = ray.cluster_resources().get("GPU", 0.0)
    return float(total - ray.available_resources().get("GPU", 0.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    if args.tasks > args.nodes * GPUS_PER_NODE:
        raise SystemExit(f"--tasks {args.tasks} needs more than {args.nodes} nodes of 4 GPUs")

    t0 = time.perf_counter()
    cluster = start_cluster(args.nodes)
    print(f"Ray cluster of {args.nodes} nodes up in {time.perf_counter() - t0:.1f} s", flush=True)
    firsts: list[float] = []
    runs: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="aisched-bench-ray-") as tmp:
            home, work = Path(tmp) / "home", Path(tmp) / "work"
            home.mkdir()
            work.mkdir()
            (work / "task.py").write_text(TASK)
            port = free_port()
            proc = start_service(home, port, ["--ray", cluster.gcs_address], timeout_s=120)
            try:
                with httpx.Client(
                    base_url=f"http://127.0.0.1:{port}", timeout=30, headers=admin_headers(home)
                ) as http:
                    for i in range(args.runs):
                        first, running = one_run(http, work, args.tasks)
                        firsts.append(first)
                        runs.append(running)
                        print(f"run {i + 1}: first task running after {first:.2f} s, "
                              f"all {args.tasks} after {running:.2f} s", flush=True)  # fmt: skip
                        wait("Ray to hold no GPU", lambda: ray_gpus_held(cluster.gcs_address) == 0)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
    med_first, med_run = statistics.median(firsts), statistics.median(runs)
    print(f"median over {args.runs} runs: first task running {med_first:.2f} s, "
          f"all running {med_run:.2f} s")  # fmt: skip
    figures = json.dumps([round(x, 2) for x in runs])
    body = f"""
`aisched up --ray` on a Ray cluster on this one machine: a head with no CPUs and {args.nodes}
nodes of {GPUS_PER_NODE} declared GPUs, in two racks. A gang of {args.tasks} tasks (1 GPU, 0.25
CPU each) is submitted over HTTP; from its submission (the service's clock) to the first and to
the last task's process running (the tasks' own clocks). The gang reserves its resources in
Ray through one placement group (a bundle per task, held to its node by `ray.io/node-id`), and
the long-lived agent of each node (one Ray actor per node, started when aisched first sees the
node) starts the node's tasks as processes: no Ray worker is started for the gang. Before
(one Ray actor, so one fresh Python worker, per task) the same command gave {BEFORE_S:.2f} s
to all 16 running (first 9.12 s), median of 5 runs on this machine: now
{BEFORE_S / med_run:.0f}× less. The first run follows the service's start at once, so it
also waits for the agents' own start (one Ray worker per node, once).

| figure | median over {args.runs} runs | each run |
| --- | ---: | --- |
| submit to the first task running | {med_first:.2f} s | {json.dumps([round(x, 2) for x in firsts])} |
| submit to all {args.tasks} tasks running | {med_run:.2f} s | {figures} |
"""
    if not args.no_write:
        write_section("ray-gang", body)


if __name__ == "__main__":
    main()

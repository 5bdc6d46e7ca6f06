"""High availability's costs: the takeover time after kill -9 of the leader, and the live
service's speed on PostgreSQL against SQLite.

Starts a real PostgreSQL server (initdb/pg_ctl in a temporary directory, default durability:
fsync and synchronous commit on) and real `aisched up` processes.

1. Takeover: a leader and a standby on one database and data directory, with the default
   lease (8 s, renewed every 2 s, a standby looking every 1 s) and `--running` sleeping jobs
   for the new leader to adopt. `--kills` times: kill -9 the leader, time until the standby
   says it leads (`/v1/healthz` role), and until it is ready (`/v1/readyz` 200: recovered,
   loop running); start the killed one again as the standby. Median and max of the kills.
2. Speed, the same measures as bench_service.py (its functions) on each store: submit-to-
   running of tiny jobs one at a time, and submissions/s of a burst of jobs that wait, from
   concurrent keep-alive clients, with the service's CPU time per submission.

    python benchmarks/bench_ha.py [--kills 5] [--running 10] [--latency-jobs 100]
        [--burst-jobs 1000] [--clients 32] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402
from _service import admin_headers, admin_headers_at, free_port, start_service  # noqa: E402
from bench_service import TINY, burst, cpu_s, latency, wait_all  # noqa: E402

from aisched.testing import postgres  # noqa: E402

NODE = ["--gpus", "4", "--cpus", "64", "--mem", "64G"]


def start_instance(home: Path, name: str, port: int, url: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aisched", "up", "--port", str(port), "--data-dir", str(home),
         "--socket", str(home / f"{name}.sock"), "--database", url, *NODE],
        stdout=subprocess.DEVNULL,
        stderr=open(home / f"{name}.log", "ab"),  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    wait(lambda: health(port).get("ok") is True, 60, f"{name} to answer")
    return proc


def health(port: int) -> dict[str, Any]:
    try:
        return dict(httpx.get(f"http://127.0.0.1:{port}/v1/healthz", timeout=1).json())
    except httpx.HTTPError:
        return {}


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait(check: Any, timeout_s: float, what: str, every_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(every_s)


def takeovers(pg: postgres.PostgresServer, kills: int, running: int) -> list[tuple[float, float]]:
    """(kill → leading, kill → ready) seconds for each kill."""
    url = pg.create_database("ha")
    out: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        ports = {"a": free_port(), "b": free_port()}
        procs = {name: start_instance(home, name, ports[name], url) for name in ("a", "b")}
        leader = "a" if health(ports["a"]).get("role") == "leader" else "b"
        try:
            headers = admin_headers_at(home / f"{leader}.sock")
            with httpx.Client(
                base_url=f"http://127.0.0.1:{ports[leader]}", headers=headers, timeout=30
            ) as http:
                ids = [
                    http.post(
                        "/v1/jobs",
                        json={"command": ["sleep", "3600"], "resources": {"cpus": 0.1}},
                    ).json()["id"]
                    for _ in range(running)
                ]
                wait_all(http, ids, ("running",))
            for k in range(kills):
                standby = "b" if leader == "a" else "a"
                t0 = time.monotonic()
                os.killpg(procs[leader].pid, signal.SIGKILL)
                procs[leader].wait(10)
                port = ports[standby]
                wait(lambda p=port: health(p).get("role") == "leader", 60, "the takeover")
                leading = time.monotonic() - t0
                wait(lambda p=port: ready(p), 60, "the new leader to be ready")
                out.append((leading, time.monotonic() - t0))
                print(
                    f"kill {k + 1}: leading after {out[-1][0]:.2f} s, ready after "
                    f"{out[-1][1]:.2f} s",
                    flush=True,
                )
                procs[leader] = start_instance(home, leader, ports[leader], url)
                leader = standby
            with httpx.Client(
                base_url=f"http://127.0.0.1:{ports[leader]}", headers=headers, timeout=30
            ) as http:
                for job_id in ids:
                    http.post(f"/v1/jobs/{job_id}/cancel")
                wait_all(http, ids, ("cancelled",))
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(30)
    return out


def server_cpu_s(pg: postgres.PostgresServer) -> float:
    """CPU time of our PostgreSQL server so far: its postmaster's own and that of its children
    it has reaped (cutime, cstime), plus its live children's (backends)."""
    main = int((pg.root / "data" / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{main}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / tick
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == main:
                total += (int(stat[11]) + int(stat[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return total


def speed(
    database: str | None, pg: postgres.PostgresServer, args: argparse.Namespace
) -> dict[str, float]:
    """bench_service.py's latency and waiting-burst figures for one store."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        port = free_port()
        extra = [] if database is None else ["--database", database]
        proc = start_service(home, port, [*NODE, *extra], timeout_s=60)
        try:
            headers = admin_headers(home)
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}", timeout=60, headers=headers
            ) as http:
                lat = latency(http, args.latency_jobs)
                blocker = http.post(
                    "/v1/jobs",
                    json={"command": ["sleep", "3600"], "resources": {"gpus": 4}, "workdir": "/"},
                ).json()["id"]
                wait_all(http, [blocker], ("running",))
                waiting = {**TINY, "resources": {"cpus": 0.01, "mem": "16M", "gpus": 1}}
                cpu0, server0 = cpu_s(proc.pid), server_cpu_s(pg)
                rate, ids = burst(
                    port, args.burst_jobs, args.clients, waiting, headers["Authorization"]
                )
                cpu_ms = (cpu_s(proc.pid) - cpu0) / args.burst_jobs * 1000
                server_ms = (server_cpu_s(pg) - server0) / args.burst_jobs * 1000
                for job_id in [*ids, blocker]:
                    http.post(f"/v1/jobs/{job_id}/cancel")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    return {**lat, "rate": rate, "cpu_ms": cpu_ms, "server_ms": server_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--running", type=int, default=10)
    ap.add_argument("--latency-jobs", type=int, default=100)
    ap.add_argument("--burst-jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    pg = postgres.start(durable=True)
    try:
        kills = takeovers(pg, args.kills, args.running)
        figures = {}
        for name, url in (("SQLite", None), ("PostgreSQL", pg.create_database("speed"))):
            figures[name] = f = speed(url, pg, args)
            print(
                f"{name}: submit-to-running median {f['median_ms']:.1f} ms, p99 "
                f"{f['p99_ms']:.1f} ms; {f['rate']:.0f} submissions/s "
                f"({f['cpu_ms']:.2f} ms service CPU each)",
                flush=True,
            )
    finally:
        pg.stop()
    leading = [k[0] for k in kills]
    readys = [k[1] for k in kills]
    s, p = figures["SQLite"], figures["PostgreSQL"]
    load = os.getloadavg()[0]
    body = f"""
Takeover: two `aisched up` on one PostgreSQL database (a real server, fsync on) and one data
directory, the default lease (8 s, renewed every 2 s; a standby looks every 1 s), with
{args.running} running jobs to adopt; the leader killed with SIGKILL {args.kills} times
(the killed one started again as the standby each time). Then the same service measures as
`bench_service.py` on each store ({os.cpu_count()} cores; load average {load:.1f} at the end).

| figure | median | max | target |
| --- | ---: | ---: | ---: |
| kill -9 → the standby leads | {statistics.median(leading):.2f} s | {max(leading):.2f} s | < 15 s |
| kill -9 → the new leader is ready (recovered, loop running) | {statistics.median(readys):.2f} s | {max(readys):.2f} s | |

| figure | SQLite | PostgreSQL | ratio |
| --- | ---: | ---: | ---: |
| submit-to-running, median ({args.latency_jobs} jobs) | {s["median_ms"]:.1f} ms | {p["median_ms"]:.1f} ms | {p["median_ms"] / s["median_ms"]:.2f} |
| submit-to-running, p99 | {s["p99_ms"]:.1f} ms | {p["p99_ms"]:.1f} ms | {p["p99_ms"] / s["p99_ms"]:.2f} |
| submissions/s, {args.burst_jobs} jobs that wait, {args.clients} clients | {s["rate"]:.0f} | {p["rate"]:.0f} | {p["rate"] / s["rate"]:.2f} |
| service CPU per submission | {s["cpu_ms"]:.2f} ms | {p["cpu_ms"]:.2f} ms | {p["cpu_ms"] / s["cpu_ms"]:.2f} |
| PostgreSQL server CPU per submission | (none) | {p["server_ms"]:.2f} ms | |

The takeover is bounded by the lease: a standby sees it expire at most 8 s after the last
renewal, which came at most 2 s before the kill, and looks every 1 s; recovery (adopting the
running tasks) comes after. The PostgreSQL server runs on the same machine, so its CPU
competes with the service's for the same cores; with PostgreSQL each of the leader's write
transactions also locks and checks the lease row (the fencing term) first. Rates and latencies
on this shared machine move with its load; the CPU figures and the ratios less so.
"""
    if not args.no_write:
        write_section("ha", body)


if __name__ == "__main__":
    main()

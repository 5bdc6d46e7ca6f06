"""The live service's speed: submit-to-running latency and sustained submissions per second.

Starts a real `aisched up` (a subprocess, its own data directory, a loopback port) and talks to
it over HTTP, as the CLI does.

1. Latency: `--latency-jobs` tiny jobs (`true`, 0.01 CPU), submitted one after another with a
   short pause, so each meets an idle scheduler. Submit-to-running is measured by the service's
   own clock: from the job's submission time to the moment its task's process was started
   (`tasks[0].started_at - submitted_at`). The client's round trip of the submission is
   reported too.
2. Throughput: `--burst-jobs` submissions from `--clients` concurrent keep-alive connections
   (a raw asyncio HTTP client, so the client's own CPU on the same machine stays small), each
   sending its next submission as soon as the last was answered, in two regimes: jobs that must wait (every GPU is held, so the burst measures the
   submission path and cycles over a growing queue), and jobs that start at once (`true`), so
   launching competes with submitting for the same 2 cores.

3. A long queue (issue 16): `--queued` jobs waiting in all (the burst's and more), then the
   latency of `--queued-latency-jobs` tiny jobs that can run beside them (and the average
   length of the service's cycles meanwhile, from its own metrics), then one bulk cancel
   (`POST /v1/jobs/cancel`, what `aisched cancel --state pending` sends) of every waiting job,
   timed from the request to its answer (the loop has cancelled and stored them all by then).

Prints the figures (medians, p99, rates) and writes them to docs/benchmarks.md.

Also prints the service's CPU time per submission (from /proc), a figure less sensitive than
rates to whatever else the machine is doing.

    python benchmarks/bench_service.py [--latency-jobs 200] [--burst-jobs 2000] [--clients 32]
        [--queued 5000] [--queued-latency-jobs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402
from _service import admin_headers, free_port, start_service  # noqa: E402

TINY = {"command": ["true"], "resources": {"cpus": 0.01, "mem": "16M"}, "workdir": "/"}


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def wait_all(http: httpx.Client, ids: list[str], states: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for job_id in ids:
        while True:
            j = http.get(f"/v1/jobs/{job_id}").json()
            if j["state"] in states:
                out.append(j)
                break
            time.sleep(0.02)
    return out


def latency(http: httpx.Client, n: int) -> dict[str, float]:
    ids, rtts = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        r = http.post("/v1/jobs", json=TINY)
        rtts.append(time.perf_counter() - t0)
        ids.append(r.json()["id"])
        time.sleep(0.03)
    jobs = wait_all(http, ids, ("succeeded", "failed"))
    lat = [j["tasks"][0]["started_at"] - j["submitted_at"] for j in jobs]
    return {
        "median_ms": statistics.median(lat) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "rtt_median_ms": statistics.median(rtts) * 1000,
        "rtt_p99_ms": percentile(rtts, 99) * 1000,
        "failed": float(sum(j["state"] != "succeeded" for j in jobs)),
    }


async def _post_many(port: int, body: bytes, count: int, ids: list[str], auth: str) -> None:
    """`count` submissions, one after another, on one keep-alive connection: a raw HTTP/1.1
    client, so that the client's own CPU (on the same machine) stays small."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        + f"Authorization: {auth}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    try:
        for _ in range(count):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            reply = json.loads(await reader.readexactly(length))
            if status != 201:
                raise SystemExit(f"a submission failed with HTTP {status}: {reply}")
            ids.append(reply["id"])
    finally:
        writer.close()


def burst(
    port: int, n: int, clients: int, doc: dict[str, Any], auth: str
) -> tuple[float, list[str]]:
    """Submissions per second of `n` jobs from `clients` concurrent connections."""
    ids: list[str] = []
    body = json.dumps(doc).encode()
    per = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]

    async def run() -> None:
        await asyncio.gather(*(_post_many(port, body, k, ids, auth) for k in per))

    t0 = time.perf_counter()
    asyncio.run(run())
    return n / (time.perf_counter() - t0), ids


def cycles(http: httpx.Client) -> tuple[float, float]:
    """(seconds, count) of the service's scheduling cycles so far, from its own histogram."""
    got = {}
    for line in http.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("aisched_scheduling_cycle_duration_seconds_sum",
                    "aisched_scheduling_cycle_duration_seconds_count"):  # fmt: skip
            got[name.rsplit("_", 1)[1]] = float(value)
    return got["sum"], got["count"]


def cpu_s(pid: int) -> float:
    """CPU time (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-jobs", type=int, default=200)
    ap.add_argument("--burst-jobs", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--queued", type=int, default=5000)
    ap.add_argument("--queued-latency-jobs", type=int, default=50)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        port = free_port()
        proc = start_service(
            home, port, ["--gpus", "4", "--cpus", "64", "--mem", "64G"], timeout_s=30
        )
        url = f"http://127.0.0.1:{port}"
        try:
            headers = admin_headers(home)
            auth = headers["Authorization"]
            with httpx.Client(base_url=url, timeout=60, headers=headers) as http:
                lat = latency(http, args.latency_jobs)
                print(
                    f"submit-to-running over {args.latency_jobs} tiny jobs: median "
                    f"{lat['median_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms; submission round "
                    f"trip median {lat['rtt_median_ms']:.1f} ms, p99 {lat['rtt_p99_ms']:.1f} ms",
                    flush=True,
                )
                blocker = http.post(
                    "/v1/jobs",
                    json={"command": ["sleep", "3600"], "resources": {"gpus": 4}, "workdir": "/"},
                ).json()["id"]
                wait_all(http, [blocker], ("running",))
                waiting = {**TINY, "resources": {"cpus": 0.01, "mem": "16M", "gpus": 1}}
                cpu0 = cpu_s(proc.pid)
                rate_wait, wait_ids = burst(port, args.burst_jobs, args.clients, waiting, auth)
                cpu_wait = (cpu_s(proc.pid) - cpu0) / args.burst_jobs * 1000
                print(f"burst of {args.burst_jobs} waiting jobs: {rate_wait:.0f} submissions/s "
                      f"(service CPU {cpu_wait:.2f} ms per submission)", flush=True)  # fmt: skip
                more = max(args.queued - len(wait_ids), 0)
                if more:
                    wait_ids += burst(port, more, args.clients, waiting, auth)[1]
                sum0, count0 = cycles(http)
                lat_q = latency(http, args.queued_latency_jobs)
                sum1, count1 = cycles(http)
                cycle_ms = (sum1 - sum0) / max(count1 - count0, 1) * 1000
                print(f"with {len(wait_ids)} pending: submit-to-running over "
                      f"{args.queued_latency_jobs} tiny jobs: median {lat_q['median_ms']:.1f} ms, "
                      f"p99 {lat_q['p99_ms']:.1f} ms; {count1 - count0:.0f} cycles of "
                      f"{cycle_ms:.1f} ms on average", flush=True)  # fmt: skip
                cpu0, t0 = cpu_s(proc.pid), time.perf_counter()
                bulk = http.post("/v1/jobs/cancel", json={"state": "pending"}).json()
                cancel_s = time.perf_counter() - t0
                cancel_cpu = cpu_s(proc.pid) - cpu0
                if bulk["count"] != len(wait_ids):
                    raise SystemExit(f"bulk cancel took {bulk['count']} of {len(wait_ids)} jobs")
                print(f"bulk cancel of {bulk['count']} pending jobs: {cancel_s:.2f} s "
                      f"(service CPU {cancel_cpu:.2f} s)", flush=True)  # fmt: skip
                http.post(f"/v1/jobs/{blocker}/cancel")
                rate_run, run_ids = burst(port, args.burst_jobs, args.clients, TINY, auth)
                burst_end = time.time()
                print(f"burst of {args.burst_jobs} jobs that run at once: {rate_run:.0f} "
                      "submissions/s", flush=True)  # fmt: skip
                done = wait_all(http, run_ids, ("succeeded", "failed"))
                # By the service's clock (the last job's end), not by when this client's
                # polling, one GET per job, got round to seeing it.
                drain = max(max(j["finished_at"] for j in done) - burst_end, 0.0)
                ok = sum(j["state"] == "succeeded" for j in done)
                print(f"  all {len(done)} ran ({ok} succeeded) {drain:.1f} s after the burst",
                      flush=True)  # fmt: skip
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    load = os.getloadavg()[0]
    body = f"""
A real `aisched up` (declared 4 GPUs, 64 CPUs) on loopback, driven over HTTP from the same
machine ({os.cpu_count()} cores; load average {load:.1f} when the run ended). Latency is the
service's own clock from the submission's arrival to the task's supervisor being started;
tiny jobs (`true`), one at a time.

| figure | value | target |
| --- | ---: | ---: |
| submit-to-running, median ({args.latency_jobs} jobs) | {lat["median_ms"]:.1f} ms | < 100 ms |
| submit-to-running, p99 | {lat["p99_ms"]:.1f} ms | |
| submission round trip (HTTP), median / p99 | {lat["rtt_median_ms"]:.1f} / {lat["rtt_p99_ms"]:.1f} ms | |
| submissions/s, {args.burst_jobs} jobs that wait, {args.clients} clients | {rate_wait:.0f} | ≥ 500 |
| service CPU per submission (jobs that wait) | {cpu_wait:.2f} ms | |
| submissions/s, {args.burst_jobs} jobs that start at once, {args.clients} clients | {rate_run:.0f} | |
| time for all of those to have run, after the burst (the last one's end) | {drain:.1f} s | |
| with {bulk["count"]:,} pending: submit-to-running of a runnable job, median / p99 ({args.queued_latency_jobs} jobs) | {lat_q["median_ms"]:.1f} / {lat_q["p99_ms"]:.1f} ms | < 50 ms |
| a scheduling cycle meanwhile, on average (the service's own histogram, {count1 - count0:.0f} cycles) | {cycle_ms:.1f} ms | |
| bulk cancel of those {bulk["count"]:,} (`POST /v1/jobs/cancel`), request to answer | {cancel_s:.2f} s (service CPU {cancel_cpu:.2f} s) | < 10 s |
"""
    if not args.no_write:
        write_section("service", body)


if __name__ == "__main__":
    main()

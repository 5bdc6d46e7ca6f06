"""How much CPU a client command costs: `aisched --help`, `aisched jobs` and `aisched run`
against a running `aisched up`, each run as its own process, as a user would.

A client command only sends a request and prints the answer, so its cost is the interpreter's
start and its imports; it must not import numpy, the core or the simulator
(tests/cli/test_client_imports.py checks that). Prints the median CPU seconds (user + system)
per command over the runs, and writes them into docs/benchmarks.md.

    python benchmarks/bench_cli_start.py [--runs 10] [--pending 200] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402
from _service import admin_headers, free_port, start_service  # noqa: E402

AISCHED = str(Path(sys.executable).with_name("aisched"))


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr.decode()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(runs: int, env: dict[str, str]) -> list[str]:
    commands = {
        "aisched --help": [AISCHED, "--help"],
        "aisched jobs": [AISCHED, "jobs"],
        "aisched run --gpus 1 -- true": [AISCHED, "run", "--gpus", "1", "--", "true"],
    }
    rows = []
    for label, argv in commands.items():
        cpus = [cpu_of(argv, env) for _ in range(runs)]
        rows.append(
            f"| `{label}` | {statistics.median(cpus):.3f} | {min(cpus):.3f} | {max(cpus):.3f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--pending", type=int, default=200, help="jobs waiting while it is measured")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs alone")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home, port = Path(tmp), free_port()
        proc = start_service(home, port, ["--gpus", "1", "--cpus", "1"], timeout_s=60)
        # Over TCP every request needs a token (the CLI reads it from AISCHED_TOKEN).
        headers = admin_headers(home)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=headers)
        # One job holds the only GPU, so the rest stay pending and `jobs` lists them all.
        doc = {"command": ["sleep", "3600"], "resources": {"gpus": 1}, "workdir": "/"}
        blocker = http.post("/v1/jobs", json=doc).json()["id"]
        try:
            for _ in range(args.pending):
                http.post("/v1/jobs", json={**doc, "command": ["true"]}).raise_for_status()
            token = headers["Authorization"].removeprefix("Bearer ")
            env = {**os.environ, "AISCHED_SERVER": str(http.base_url), "AISCHED_TOKEN": token}
            rows = measure(args.runs, env)
        finally:
            # The blocker's task outlives the service by design (a restarted service adopts
            # it): cancel it and let it end before the service stops.
            http.post(f"/v1/jobs/{blocker}/cancel")
            deadline = time.monotonic() + 30
            while http.get(f"/v1/jobs/{blocker}").json()["state"] == "running":
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    table = "\n".join(
        [
            f"{args.pending} jobs pending on `aisched up`; CPU seconds (user + system) of the "
            f"client process, over {args.runs} runs each.",
            "",
            "| command | median CPU-s | min | max |",
            "| --- | ---: | ---: | ---: |",
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        write_section("cli-start", table)


if __name__ == "__main__":
    main()

"""The soak run: a real `aisched up` killed with SIGKILL and restarted at random moments while
a few hundred short jobs are submitted and run; afterwards every job must have run exactly
once, counted by the side effect each one leaves (a line in a file of its own).

Used by the e2e test (tests/e2e/test_soak_e2e.py) and the benchmark (benchmarks/bench_soak.py).

1. A submitter sends the jobs in order, each with an Idempotency-Key of its own; a request the
   service did not answer (it was killed) is sent again with the same key until one answers.
2. A killer sends SIGKILL to `aisched up` at `kills` random moments (seeded), and starts it
   again at once on the same data directory; the tasks live on under their supervisors.
3. Once everything is submitted and the killer is done, it waits for every job to end.
4. The count: a job is a duplicate when its side-effect file has more than one line or when
   one key made two jobs; it is lost when it did not succeed or left no line.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass
class SoakResult:
    jobs: int
    kills: int
    duplicates: int
    lost: int
    wall_s: float
    states: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # one line per job that went wrong

    def line(self) -> str:
        return (
            f"jobs {self.jobs}, kills {self.kills}, duplicates {self.duplicates}, "
            f"lost {self.lost} ({self.wall_s:.0f} s)"
        )


class _Up:
    """`aisched up` as a child process, restartable on one data directory and port."""

    def __init__(self, home: Path, port: int, args: list[str], log: Path) -> None:
        self.home, self.port, self.args, self.log = home, port, args, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"
        # The API over the Unix socket: the kernel says who we are, no token to keep. A short
        # path of its own (a socket's path is limited to 107 bytes).
        self.socket = Path(tempfile.mkdtemp(prefix="ais-soak-")) / "s.sock"

    def client(self, timeout_s: float) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket))
        return httpx.Client(transport=transport, base_url="http://aisched", timeout=timeout_s)

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "aisched", "up", "--port", str(self.port),
                 "--data-dir", str(self.home), "--socket", str(self.socket), *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aisched up exited {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(f"{self.url}/v1/healthz", timeout=1).json()["ok"]:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"aisched up did not answer within {timeout_s} s; see {self.log}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _job(i: int, side: Path, work_s: float) -> dict[str, Any]:
    # The side effect comes after the work, so a task killed halfway and run again shows.
    script = f'sleep {work_s}; echo "$AISCHED_JOB_ID $AISCHED_RESTART_COUNT" >> {side / str(i)}'
    return {
        "name": f"soak-{i}",
        "command": ["sh", "-c", script],
        "resources": {"cpus": 0.1, "mem": "32M"},
        "restart": {"policy": "never"},
    }


def run_soak(
    base: Path,
    *,
    jobs: int = 300,
    kills: int = 12,
    seed: int = 17,
    work_s: float = 0.3,
    submit_over_s: float = 40.0,
    port: int,
    timeout_s: float = 300.0,
) -> SoakResult:
    rng = random.Random(seed)
    home, side = base / "home", base / "side"
    home.mkdir(parents=True)
    side.mkdir()
    up = _Up(home, port, ["--cpus", "4", "--mem", "8G", "--gpus", "0"], base / "service.log")
    t0 = time.monotonic()
    up.start()
    ids: dict[int, str] = {}
    done_submitting = threading.Event()

    def submit() -> None:
        with up.client(10) as http:
            for i in range(jobs):
                while True:
                    try:
                        r = http.post(
                            "/v1/jobs",
                            json=_job(i, side, work_s),
                            headers={"Idempotency-Key": f"soak-{i}"},
                        )
                        if r.status_code == 201:
                            ids[i] = r.json()["id"]
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.1)  # down (killed) or not ready: the same key again
                time.sleep(submit_over_s / jobs)
        done_submitting.set()

    submitter = threading.Thread(target=submit, name="soak-submit", daemon=True)
    submitter.start()
    moments = sorted(rng.uniform(1.0, submit_over_s + 10.0) for _ in range(kills))
    done_kills = 0
    try:
        for at in moments:
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            up.kill9()
            done_kills += 1
            up.start()
        submitter.join(timeout_s)
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            try:
                with up.client(10) as http:
                    live = http.get("/v1/jobs").json()["jobs"]
            except httpx.HTTPError:
                live = [None]
            if done_submitting.is_set() and not live:
                break
            time.sleep(0.5)
        with up.client(30) as http:
            every = http.get("/v1/jobs", params={"all": "true", "limit": 100_000}).json()["jobs"]
    finally:
        up.stop()
    return _count(jobs, done_kills, ids, every, side, time.monotonic() - t0)


def _count(
    n: int, kills: int, ids: dict[int, str], every: list[dict[str, Any]], side: Path, wall: float
) -> SoakResult:
    by_name: dict[str, list[dict[str, Any]]] = {}
    states: dict[str, int] = {}
    for j in every:
        by_name.setdefault(j["name"], []).append(j)
        states[j["state"]] = states.get(j["state"], 0) + 1
    duplicates = lost = 0
    problems: list[str] = []
    for i in range(n):
        made = by_name.get(f"soak-{i}", [])
        path = side / str(i)
        runs = path.read_text().splitlines() if path.exists() else []
        if len(made) > 1 or len(runs) > 1:
            duplicates += 1
            problems.append(f"soak-{i}: {len(made)} jobs, {len(runs)} runs: {runs}")
        elif not made or made[0]["state"] != "succeeded" or not runs:
            lost += 1
            what = made[0]["state"] if made else "never stored"
            problems.append(f"soak-{i}: {what}, {len(runs)} runs (id {ids.get(i)})")
    return SoakResult(n, kills, duplicates, lost, wall, states, problems)


if __name__ == "__main__":  # pragma: no cover - by hand: python -m aisched.testing.soak DIR
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = int(s.getsockname()[1])
    print(run_soak(Path(sys.argv[1]), port=free, jobs=int(os.environ.get("JOBS", "300"))).line())

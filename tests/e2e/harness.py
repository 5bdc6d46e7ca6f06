"""A real `aisched up` on a loopback port and a Unix socket, driven by the real `aisched`
command (subprocesses).

Each test gets its own service (its own data directory, port and socket) with 4 declared GPUs,
4 CPUs and 8 GiB, so the whole flow runs on a machine without GPUs. The CLI talks over the
socket, as a local user's does; `api` is an HTTP client over TCP with an admin token, made
through the CLI once the service is up. Tasks outlive the service by design (the next start
adopts them), so teardown cancels every live job before stopping it.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# Ports the kernel never hands out by itself (below its ephemeral range, where every outgoing
# connection takes its local port) and above Ray's workers' own (10002-19999 by default).
PORTS_FROM = 20000
# The ports this process handed out lately: a test may pick two before it starts either.
_handed_out: set[int] = set()


def _my_ports(low: int) -> range:
    """This pytest worker's share of [PORTS_FROM, low): its own slice under pytest-xdist, so
    that a port one worker found free is not found free by another before its service binds
    it (the whole range when run without workers)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    span = (low - PORTS_FROM) // count
    start = PORTS_FROM + int(worker) * span
    return range(start, start + span)


def free_port() -> int:
    """A port free now that only an explicit bind can take before the service binds it: one
    from the ephemeral range (a bind to port 0) was taken once by an outgoing connection of
    Ray's, during the minute a service on Ray takes to start, and that start failed. Not one
    this process handed out lately, nor one another pytest worker may hand out."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = _my_ports(low) if low > PORTS_FROM + 1000 else range(0, 1)
    if len(_handed_out) > len(ports) // 2:
        _handed_out.clear()
    for _ in range(200):
        port = random.choice(ports)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
            if port:
                _handed_out.add(port)
            return port
    raise AssertionError("no free port found below the ephemeral range")


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Held by one process of this machine at a time (an flock): for what the tests make once
    per machine (local users, images), which two pytest workers would otherwise make at once."""
    path = Path(tempfile.gettempdir(), f"aisched-tests-{name}.lock")
    fd = os.open(path, os.O_RDONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T in /proc): a failpoint paused it."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


@dataclass
class Service:
    home: Path
    port: int
    work: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    # A short path of its own (a socket's path is limited to 107 bytes), reachable by every
    # local user: tests run the CLI as other users too.
    socket: Path = field(init=False)
    token: str = ""
    # Set in the service's environment only (not the CLI's), e.g. a failpoint.
    extra_env: dict[str, str] = field(default_factory=dict)
    # Runs `aisched up` (e.g. `setpriv` with fewer capabilities); empty: run it directly.
    launcher: list[str] = field(default_factory=list)
    _api: httpx.Client | None = None

    def __post_init__(self) -> None:
        self.log = self.home / "service.log"
        sock_dir = Path(tempfile.mkdtemp(prefix="ais-"))
        sock_dir.chmod(0o755)
        self.socket = sock_dir / "aisched.sock"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin_token(self) -> str:
        """An admin's token, made once by root over the socket with the real CLI."""
        if not self.token:
            self.token = self.cli("token", "create", "root", "--admin").stdout.strip()
        return self.token

    @property
    def api(self) -> httpx.Client:
        """The REST API over TCP, as an admin."""
        if self._api is None:
            self._api = httpx.Client(
                base_url=self.url,
                headers={"Authorization": f"Bearer {self.admin_token()}"},
                timeout=10,
            )
        return self._api

    def alive_leader(self, term: int = 1) -> dict[str, object]:
        """What `/v1/healthz` answers for this service leading (term 1: its first start)."""
        return {"ok": True, "role": "leader", "term": term, "leader": self.url}

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "AISCHED_SERVER": f"unix:{self.socket}",
            "AISCHED_HOME": str(self.home),
        }

    def start(self, timeout_s: float = 30.0, *, https: bool = False) -> None:
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", "aisched", "up", "--port", str(self.port),
             "--data-dir", str(self.home), "--socket", str(self.socket), *self.args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**self.env(), **self.extra_env},
            start_new_session=True,
        )  # fmt: skip
        out.close()

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"aisched up exited:\n{self.log.read_text()}")
            try:
                url = f"https://127.0.0.1:{self.port}" if https else self.url
                r = httpx.get(f"{url}/v1/healthz", timeout=1, verify=not https)
                return bool(r.json()["ok"])
            except httpx.HTTPError:
                return False

        wait_for("the service to answer", up, timeout_s)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait_exit(self, timeout_s: float) -> int:
        """Its exit status; past the timeout, its threads' stacks go to its log first (the
        service dumps them on SIGUSR1), so that a failure shows where it waited."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise AssertionError(
                f"aisched up did not exit within {timeout_s} s:\n{self.log.read_text()[-20000:]}"
            ) from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cli(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "aisched", *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.work,
            input=stdin,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"aisched {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def cli_json(self, *args: str) -> Any:
        # Right after the subcommand: anything after `--` belongs to the job's command.
        return json.loads(self.cli(args[0], "--json", *args[1:]).stdout)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.cli_json("show", job_id)  # type: ignore[no-any-return]

    def wait_state(self, job_id: str, *states: str, timeout_s: float = 30.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            j = self.job(job_id)
            return j if j["state"] in states else None

        return wait_for(f"job {job_id} to be {' or '.join(states)}", check, timeout_s)  # type: ignore[no-any-return]

    def run(self, *args: str) -> str:
        """`aisched run ARGS`; returns the new job's id."""
        return str(self.cli_json("run", *args)["id"])


def cancel_all(svc: Service, timeout_s: float = 30.0) -> None:
    """Cancel every live job of `svc` (started again if it is down) and wait up to `timeout_s`
    for them to end."""
    if svc.proc is None or svc.proc.poll() is not None:
        try:
            svc.start()
        except AssertionError:
            return
    try:
        live = svc.api.get("/v1/jobs").json()["jobs"]
        for j in live:
            svc.api.post(f"/v1/jobs/{j['id']}/cancel")
        wait_for(
            "every job to end",
            lambda: not svc.api.get("/v1/jobs").json()["jobs"],
            timeout_s=timeout_s,
        )
    except (httpx.HTTPError, AssertionError):
        pass


@contextmanager
def local_service(tmp_path: Path, config: str | None = None) -> Iterator[Service]:
    """A started service of its own (data directory, port) on 4 declared GPUs, 4 CPUs and 8 GiB,
    with `config` as its config file; every live job is cancelled before it stops."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    args = ["--gpus", "4", "--cpus", "4", "--mem", "8G"]
    if config is not None:
        (home / "config.yaml").write_text(config)
        args += ["--config", str(home / "config.yaml")]
    svc = Service(home, free_port(), work, args)
    svc.start()
    try:
        yield svc
    finally:
        cancel_all(svc)
        svc.stop()


@contextmanager
def users_service(tmp_path: Path, config: str | None = None) -> Iterator[Service]:
    """`local_service` in a folder the local test users may pass through: their jobs run in
    their homes and their CLIs reach its socket; the service's own files stay private."""
    tmp_path.chmod(0o755)
    with local_service(tmp_path, config) as svc:
        yield svc


@contextmanager
def database_locked(db: Path) -> Iterator[None]:
    """Another process holds the state database's write lock for the block (a wedged store)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(120)",
         str(db)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        yield
    finally:
        holder.kill()
        holder.wait()

"""A real `aisched up` for the benchmarks that drive the live service over HTTP: started with
its socket in its data directory, and an admin token made over that socket for the HTTP
client (`admin_headers`)."""

from __future__ import annotations

import getpass
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(
    home: Path, port: int, args: Sequence[str], timeout_s: float
) -> subprocess.Popen[bytes]:
    """`aisched up ARGS` on `port` with its data in `home` (its log in home/service.log), in a
    session of its own (stop it with `os.killpg`); returns once it answers its health check."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aisched", "up", "--port", str(port), "--data-dir", str(home),
         "--socket", str(home / "s.sock"), *args],
        stdout=subprocess.DEVNULL,
        stderr=open(home / "service.log", "wb"),  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/healthz", timeout=1).json()["ok"]:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit(f"the service did not start:\n{(home / 'service.log').read_text()}")


def admin_headers(home: Path) -> dict[str, str]:
    """HTTP headers with an admin token for the service started in `home`."""
    return admin_headers_at(home / "s.sock")


def admin_headers_at(sock: Path) -> dict[str, str]:
    """HTTP headers with an admin token, made through the service's socket `sock`."""
    token = subprocess.run(
        [sys.executable, "-m", "aisched", "token", "create", getpass.getuser(), "--admin",
         "--server", f"unix:{sock}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return {"Authorization": f"Bearer {token}"}

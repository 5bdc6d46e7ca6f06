"""The throw-away PostgreSQL server of `aisched.testing.postgres` does not outlive the process
that started it: killed with -9, its watchdog stops the server and removes its directory."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aisched.testing import postgres

STARTER = """
import sys
from aisched.testing import postgres
server = postgres.start()
print(server.root, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_server_whose_owner_is_killed_is_stopped_and_removed() -> None:
    try:
        postgres.bin_dir()
    except postgres.PostgresUnavailable as e:
        pytest.skip(str(e))
    owner = subprocess.Popen(
        [sys.executable, "-c", STARTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    root = Path(owner.stdout.readline().strip())
    pid = int((root / "data" / "postmaster.pid").read_text().split()[0])
    assert alive(pid)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and (root.exists() or alive(pid)):
        time.sleep(0.2)
    assert (root.exists(), alive(pid)) == (False, False)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

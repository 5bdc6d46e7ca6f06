"""A replica's port is the replica's: a process of another local user that binds it first (it
is free between the service choosing it and the replica binding it, and after a replica dies)
is neither probed nor scraped nor listed, so it cannot make the service scale or take its
clients. Real sockets of real local users (root and nobody) in the kernel's tables."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from clients import client_for

from aisched.service.app import Service
from aisched.service.listeners import accepting_uid
from aisched.testing.fakes import FakeExecutor, fake_node

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser"
)

# Answers 200 to every GET on HOST:PORT and prints a line for each, so the test can count them.
SERVER = """
import http.server, socket, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(self.path, flush=True)
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a): pass
class S(http.server.HTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
S((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


@contextmanager
def serving(
    port: int, as_user: str | None, host: str = "127.0.0.1"
) -> Iterator[subprocess.Popen[str]]:
    python = "/usr/bin/python3" if as_user else sys.executable  # one nobody may run
    cmd = [python, "-c", SERVER, host, str(port)]
    proc = subprocess.Popen(
        ["runuser", "-u", as_user, "--", *cmd] if as_user else cmd,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        until("the server to listen", lambda: accepting_uid(host, port, 1.0) is not None)
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def until(what: str, check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def test_a_replica_port_held_by_another_user_is_not_the_replica(
    open_service: Callable[..., Service],
) -> None:
    svc = open_service(FakeExecutor([fake_node(gpus=2)]), autoscaler_interval="100ms")
    client = client_for(svc)
    body = {
        "name": "web",
        "kind": "service",
        "command": ["python", "serve.py"],
        "service": {"min_replicas": 1, "max_replicas": 2, "target": 10,
                    "readiness_path": "/healthz", "metrics_path": "/metrics"},
    }  # fmt: skip
    sid = client.post("/v1/jobs", json=body).json()["id"]
    (rid,) = until(
        "a replica", lambda: client.get(f"/v1/jobs/{sid}").json()["service"]["replica_ids"]
    )
    env = client.get(f"/v1/jobs/{rid}").json()["env"]
    port = int(next(v for group in env.values() for k, v in group.items() if k.endswith("_PORT")
                    and k.startswith("AISCHED_SERVICE")))  # fmt: skip
    # The fake executor runs nothing: the port is free for whoever binds it first.
    with serving(port, "nobody") as squatter:
        assert accepting_uid("127.0.0.1", port, 1.0) == pwd.getpwnam("nobody").pw_uid
        time.sleep(1.0)  # ten rounds of the autoscaler
        status = client.get(f"/v1/jobs/{sid}").json()["service"]
        assert (status["ready"], status["endpoints"]) == (0, [])
    assert squatter.stdout is not None and squatter.stdout.read() == ""  # never asked
    # The replica's own user (here the service's) listening there is the replica, even with
    # another user's listener on another address of the port, which takes none of its
    # connections (it made the replica "not ready" for as long as it listened).
    with serving(port, "nobody", "::1") as beside, serving(port, None) as own:
        until(
            "the replica to be ready",
            lambda: client.get(f"/v1/jobs/{sid}").json()["service"]["ready"] == 1,
        )
    assert own.stdout is not None and "/healthz" in own.stdout.read()
    assert beside.stdout is not None and beside.stdout.read() == ""

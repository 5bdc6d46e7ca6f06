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


def replica_port(client: Any, rid: str) -> int:
    env = client.get(f"/v1/jobs/{rid}").json()["env"]
    return int(next(v for group in env.values() for k, v in group.items()
                    if k == "AISCHED_SERVICE_PORT"))  # fmt: skip


def test_a_replica_port_held_by_another_user_is_not_the_replica_and_it_is_replaced(
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

    def replicas() -> list[str]:
        return list(client.get(f"/v1/jobs/{sid}").json()["service"]["replica_ids"])

    sid = client.post("/v1/jobs", json=body).json()["id"]
    (rid,) = until("a replica", replicas)
    port = replica_port(client, rid)
    # The fake executor runs nothing: the port is free for whoever binds it first. The replica
    # could not listen there: it is neither probed nor listed, and one on another port takes
    # its place (a squatter could otherwise keep another user's service down for good).
    with serving(port, "nobody") as squatter:
        assert accepting_uid("127.0.0.1", port, 1.0) == pwd.getpwnam("nobody").pw_uid
        (new,) = until("a new replica", lambda: [r for r in replicas() if r != rid])
        old = until("the old replica to end", lambda: (j := client.get(f"/v1/jobs/{rid}").json())
                    ["state"] == "cancelled" and j)  # fmt: skip
        why = [e["message"] for e in old["events"] if e["kind"] == "cancelling"]
        assert why == [f"replaced: replica {rid}'s port {port} is held by another user"]
        status = client.get(f"/v1/jobs/{sid}").json()["service"]
        assert (status["replica_ids"], status["ready"], status["endpoints"]) == ([new], 0, [])
    assert squatter.stdout is not None and squatter.stdout.read() == ""  # never asked
    assert replica_port(client, new) != port
    # The replica's own user (here the service's) listening there is the replica, even with
    # another user's listener on another address of the port, which takes none of its
    # connections: it is ready, and not replaced.
    port = replica_port(client, new)
    with serving(port, "nobody", "::1") as beside, serving(port, None) as own:
        until(
            "the replica to be ready",
            lambda: client.get(f"/v1/jobs/{sid}").json()["service"]["ready"] == 1,
        )
        assert replicas() == [new]
    assert own.stdout is not None and "/healthz" in own.stdout.read()
    assert beside.stdout is not None and beside.stdout.read() == ""

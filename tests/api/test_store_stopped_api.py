"""A PostgreSQL server that stops answering (SIGSTOP of the postmaster and every backend): the
service stays alive, says in readiness that the store fails, answers requests with a clear
error within its bounds rather than never, and once the server goes on (SIGCONT) carries on
with nothing lost and no job launched twice.

The server is this test's own (`aisched.testing.postgres`), not the session's shared one,
which other tests use while this one is stopped."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from clients import client_for
from test_faults_api import ids, until

from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.service.identity import service_user
from aisched.testing import postgres
from aisched.testing.builders import job
from aisched.testing.fakes import FakeExecutor, fake_node

# Much longer than any wait of the service's own (2 s for an answer, 5 s for a submission to
# be stored): past it a request is taken to hang for ever.
NEVER_S = 60.0


@pytest.fixture
def own_server() -> Iterator[postgres.PostgresServer]:
    try:
        server = postgres.start()
    except postgres.PostgresUnavailable as e:
        pytest.skip(str(e))
    yield server
    server.resume()  # a test that failed while it was stopped
    server.stop()


def answered(request: Callable[[], httpx.Response]) -> httpx.Response:
    """The response of `request`, made in a thread; fails if none came in NEVER_S."""
    got: list[httpx.Response] = []
    t = threading.Thread(target=lambda: got.append(request()), daemon=True)
    t.start()
    t.join(NEVER_S)
    assert got, f"no answer in {NEVER_S:g} s: the request hangs on the stopped server"
    return got[0]


def test_a_stopped_postgresql_server_is_a_failing_store_not_a_hang(
    own_server: postgres.PostgresServer, tmp_path: Path
) -> None:
    fx = FakeExecutor([fake_node(gpus=4)])
    settings: dict[str, Any] = {
        "data_dir": str(tmp_path),
        "database": own_server.create_database(),
        "cycle_interval": "0.2s",
        # One instance: its lease must outlast the pause, or it would step down for a standby
        # (docs/ha.md), which is not what this test is about.
        "lease_ttl": "600s",
        "limits": {"store_busy_timeout": "0.5s", "store_statement_timeout": "1s"},
    }
    svc = Service.open(load_config(None, settings), executor=fx)
    svc.start()
    try:
        client = client_for(svc)
        doc = {"command": ["sleep", "100"]}
        first = client.post("/v1/jobs", json=doc).json()["id"]
        until("it to run", lambda: client.get(f"/v1/jobs/{first}").json()["state"] == "running")

        own_server.pause()
        try:
            # Straight to the loop (a request's token could not be checked): its step fails.
            kept = svc.scheduler.submit(job("kept").task(1, cpu=0.1).user(service_user()).build())
            # The lease's renewal may fail first and be said too (its own line): wait for the
            # loop's step to have failed as well.
            until(
                "readiness to say the store fails",
                lambda: [
                    p
                    for p in client.get("/v1/readyz").json()["problems"]
                    if p.startswith("the store is failing (")
                ],
            )
            listed = answered(lambda: client.get("/v1/jobs"))
            posted = answered(lambda: client.post("/v1/jobs", json=doc))
        finally:
            own_server.resume()

        for refused in (listed, posted):
            assert refused.status_code == 503
            assert refused.json()["error"].startswith("the state database cannot answer now (")
        assert svc.scheduler.thread is not None and svc.scheduler.thread.is_alive()

        until("readiness", lambda: client.get("/v1/readyz").status_code == 200)
        assert kept.result(timeout=NEVER_S)["id"] == "2"
        assert ids(client) == ["2", "1"]  # the kept submission, stored once
        until(
            "the second job to run", lambda: client.get("/v1/jobs/2").json()["state"] == "running"
        )
        assert client.get(f"/v1/jobs/{first}").json()["state"] == "running"
        assert Counter(launch.key[0] for launch in fx.launched) == {"1": 1, "2": 1}
    finally:
        svc.close()

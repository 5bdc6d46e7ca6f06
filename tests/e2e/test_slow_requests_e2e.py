"""A request that is slow to handle holds up no other request: the real service, real HTTP."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from harness import Service, database_locked, free_port, wait_for

from aisched.testing.postgres import PostgresServer


def answer_meanwhile(service: Service, path: str) -> None:
    """Liveness and `path` are answered over the local socket while a slow request waits."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(service.socket))) as local:
        assert local.get("http://x/v1/healthz", timeout=60).json()["ok"] is True
        assert local.get(f"http://x{path}", timeout=60).status_code == 200


def test_a_job_file_slow_to_read_holds_up_no_other_request(service: Service) -> None:
    # Many tiny nested lists: seconds of pure-Python YAML for half a MiB (13 s for 1 MiB), and
    # on the event loop every other request, the probes' too, waited for it.
    body = ("name: slow\nx: [" + "[]," * 170_000 + "[]]\n").encode()
    proc = psutil.Process(service.proc.pid if service.proc else 0)
    service.api.get("/v1/healthz").raise_for_status()  # the token made before the clock
    busy_from = sum(proc.cpu_times()[:2])
    answer: dict[str, Any] = {}

    def submit() -> None:
        answer["status"] = service.api.post(
            "/v1/jobs", content=body, headers={"Content-Type": "application/yaml"}, timeout=120
        ).status_code

    sender = threading.Thread(target=submit)
    sender.start()
    try:
        wait_for(
            "the service to read the job file", lambda: sum(proc.cpu_times()[:2]) > busy_from + 1
        )
        answer_meanwhile(service, "/v1/jobs")
        assert "status" not in answer, "the reading ended before the other requests were answered"
    finally:
        sender.join(120)
    assert answer["status"] == 422  # `x: unknown key`, once read


def test_a_store_locked_by_another_process_holds_up_no_other_request(service: Service) -> None:
    job = service.run("--", "echo", "hi")
    service.wait_state(job, "succeeded")
    # An admin of another name: reading root's job's logs is written to the audit log.
    ops = service.cli("token", "create", "ops", "--admin").stdout.strip()
    answer: dict[str, Any] = {}

    def read_logs() -> None:
        answer["status"] = httpx.get(
            f"{service.url}/v1/jobs/{job}/logs",
            headers={"Authorization": f"Bearer {ops}"},
            timeout=120,
        ).status_code

    with database_locked(service.home / "state.db"):
        reader = threading.Thread(target=read_logs)
        reader.start()
        # The read reaches its audit line at once and waits there for the lock (30 s);
        # on the event loop, every request below waited with it.
        time.sleep(1)
        answer_meanwhile(service, "/v1/jobs")
        assert "status" not in answer, "the read ended before the other requests"
    reader.join(120)
    assert answer["status"] == 200  # once the lock is let go


def test_a_login_whose_token_check_waits_on_the_store_holds_up_no_other_request(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    # The login form's token check reads the store. On the event loop, a login that waited
    # on the store (here, another session locking the tokens table) held every request.
    svc = Service(tmp_path / "home", free_port(), tmp_path, ["--gpus", "1"])
    svc.home.mkdir()
    url = pg_server.create_database()
    svc.args += ["--database", url]
    svc.start()
    answer: dict[str, Any] = {}

    def log_in() -> None:
        answer["status"] = httpx.post(
            f"{svc.url}/login", data={"token": token}, timeout=120
        ).status_code

    try:
        token = svc.admin_token()
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as db:
            db.execute("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
            sender = threading.Thread(target=log_in)
            sender.start()
            with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as watch:
                waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted"
                wait_for(
                    "the login to wait for the lock",
                    lambda: watch.execute(waiting).fetchone() == (1,),
                )
            answer_meanwhile(svc, "/v1/info")
            assert "status" not in answer, "the login ended before the other requests"
        sender.join(120)
        assert answer["status"] == 303  # once the lock is let go
    finally:
        svc.stop()

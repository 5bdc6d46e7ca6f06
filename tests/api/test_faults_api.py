"""Submissions under faults, through the real app, store and loop (the fake executor runs no
processes): Idempotency-Key, paths checked at submission, disk pressure, a locked store."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clients import client_for
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.service.identity import service_user
from aisched.service.loop import Rejected
from aisched.store.errors import StoreError
from aisched.testing.builders import job
from aisched.testing.fakes import FakeExecutor, fake_node

OpenService = Callable[..., Service]  # the open_service fixture of conftest.py


def ids(client: TestClient) -> list[str]:
    return [j["id"] for j in client.get("/v1/jobs", params={"all": "true"}).json()["jobs"]]


def until(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def test_a_retried_submission_with_the_same_key_gives_the_first_job(client: TestClient) -> None:
    doc = {"command": ["echo", "hi"]}
    first = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1"})
    again = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1"})
    other = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-2"})
    # A header that names another user names nobody: it is still the same caller's key.
    forged = client.post(
        "/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1", "X-Aisched-User": "bob"}
    )
    assert [r.status_code for r in (first, again, other, forged)] == [201, 201, 201, 201]
    assert [r.json()["id"] for r in (first, again, other, forged)] == ["1", "1", "2", "1"]
    assert ids(client) == ["2", "1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root service runs another user's jobs")
def test_the_same_key_from_another_user_is_another_job(
    client: TestClient, client_as: Callable[[str], TestClient]
) -> None:
    doc = {"command": ["echo", "hi"]}
    first = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1"})
    theirs = client_as("nobody").post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1"})
    assert [(r.status_code, r.json()["id"]) for r in (first, theirs)] == [(201, "1"), (201, "2")]


def test_a_retried_pipeline_gives_the_same_jobs(client: TestClient) -> None:
    text = "name: a\ncommand: [echo, a]\n---\nname: b\ncommand: [echo, b]\ndepends_on: [a]\n"
    headers = {"Idempotency-Key": "p-1", "Content-Type": "application/yaml"}
    first = client.post("/v1/jobs", content=text, headers=headers)
    again = client.post("/v1/jobs", content=text, headers=headers)
    assert (first.status_code, again.status_code) == (201, 201)
    assert [j["id"] for j in first.json()["jobs"]] == ["1", "2"]
    assert [j["id"] for j in again.json()["jobs"]] == ["1", "2"]
    assert ids(client) == ["2", "1"]


def test_a_missing_workdir_or_command_file_is_refused_at_submission(
    client: TestClient, tmp_path: Path
) -> None:
    (tmp_path / "script.sh").write_text("#!/bin/sh\n")
    r = client.post("/v1/jobs", json={"command": ["true"], "workdir": str(tmp_path / "nope")})
    assert (r.status_code, r.json()) == (
        422,
        {
            "error": "invalid job",
            "problems": [f"request: workdir: no such directory: {tmp_path / 'nope'}"],
        },
    )
    r = client.post(
        "/v1/jobs",
        json={
            "tasks": [
                {"name": "a", "command": ["./missing.sh"], "workdir": str(tmp_path)},
                {"name": "b", "command": ["./script.sh"], "workdir": str(tmp_path)},
            ]
        },
        params={"source": "job.yaml"},
    )
    assert (r.status_code, r.json()["problems"]) == (
        422,
        [
            f"job.yaml: tasks.0.command.0: no such file: {tmp_path / 'missing.sh'}",
            f"job.yaml: tasks.1.command.0: not executable: {tmp_path / 'script.sh'}",
        ],
    )
    assert ids(client) == []


def test_a_container_job_is_checked_for_its_host_paths_not_its_images_paths(
    client: TestClient, tmp_path: Path
) -> None:
    """Its workdir and command are inside its image; its hostPath volumes are on this machine."""
    doc = {
        "command": ["/opt/app/run.sh"],
        "workdir": "/opt/app",
        "image": "localhost/app:1",
        "volumes": [{"host_path": str(tmp_path)}, {"host_path": str(tmp_path / "gone")}],
    }
    r = client.post("/v1/jobs", json=doc, params={"source": "job.yaml"})
    assert (r.status_code, r.json()["problems"]) == (
        422,
        [f"job.yaml: volumes.1.host_path: no such file or directory: {tmp_path / 'gone'}"],
    )
    doc["volumes"] = [{"host_path": str(tmp_path)}]
    assert client.post("/v1/jobs", json=doc).status_code == 201


def test_under_disk_pressure_submissions_are_refused_and_readiness_says_why(
    open_service: OpenService, fx: FakeExecutor, tmp_path: Path
) -> None:
    svc = open_service(fx)
    client = client_for(svc)
    assert client.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
    svc.health.min_free_bytes = 1 << 60  # more than any disk has: pressure now
    svc.health.refresh_s = 0.0
    ready = client.get("/v1/readyz")
    # That measurement serves the submission's refusal too: the free space, said to the MiB,
    # moves between two readings while other tests write to the disk.
    svc.health.refresh_s = 3600.0
    assert ready.status_code == 503
    body = ready.json()
    assert (body["ready"], body["disk_pressure"]) == (False, True)
    assert body["problems"][0].startswith("disk pressure: ")
    assert body["problems"][0].endswith(
        f"free for the data directory {tmp_path}, below the 1024 PiB it keeps free"
    )
    r = client.post("/v1/jobs", json={"command": ["true"]})
    assert r.status_code == 507
    assert r.json() == {
        "error": f"the service is not accepting new jobs: {body['problems'][0]}",
        "problems": [],
    }
    assert client.get("/v1/healthz").json() == {  # alive all along
        "ok": True,
        "role": "leader",
        "term": 1,
        "leader": str(svc.home),
    }
    assert "aisched_disk_pressure 1.0" in client.get("/metrics").text
    svc.health.min_free_bytes = 0  # space is back
    svc.health.refresh_s = 0.0
    assert client.get("/v1/readyz").status_code == 200
    assert client.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
    assert ids(client) == ["2", "1"]


class Holder:
    """Another writer that holds the jobs table against writes, readers going on (SQLite:
    the whole database, WAL readers going on)."""

    def __init__(self, svc: Service, tmp_path: Path) -> None:
        self.sqlite = svc.store.engine.dialect.name == "sqlite"
        if self.sqlite:
            # Waits for a step of the loop that holds the database now to end.
            self.conn: Any = sqlite3.connect(
                tmp_path / "state.db", isolation_level=None, timeout=30
            )
            self.conn.execute("BEGIN EXCLUSIVE")
        else:
            self.conn = svc.store.engine.raw_connection()
            self.conn.cursor().execute("LOCK TABLE jobs IN EXCLUSIVE MODE")

    @property
    def error(self) -> str:
        if self.sqlite:
            return "(sqlite3.OperationalError) database is locked"
        return "(psycopg.errors.LockNotAvailable) canceling statement due to lock timeout"

    def release(self) -> None:
        if self.sqlite:
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()
        self.conn.close()


def test_a_locked_store_fails_steps_visibly_and_loses_nothing(
    open_service: OpenService, fx: FakeExecutor, tmp_path: Path
) -> None:
    svc = open_service(fx, limits={"store_busy_timeout": "0.2s"})
    client = client_for(svc)
    holder = Holder(svc, tmp_path)  # another writer holds the database
    answers: list[Any] = []
    doc = {"command": ["echo", "kept"]}

    def submit() -> None:
        answers.append(client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "x"}))

    t = threading.Thread(target=submit)
    t.start()
    t.join(30)
    (first,) = answers
    assert first.status_code == 503
    assert first.json()["error"].startswith("the submission is not stored yet: the store cannot")
    ready = client.get("/v1/readyz").json()
    assert ready["ready"] is False
    assert ready["problems"][0].startswith("the store is failing (")
    assert ready["problems"][0].endswith(f"steps in a row): {holder.error}")
    assert client.post("/v1/jobs", json=doc).status_code == 503  # refused at once now
    (node,) = client.get("/v1/nodes").json()["nodes"]
    assert ready["problems"][0] in node["notes"]  # `aisched nodes` shows it too
    holder.release()
    until("readiness", lambda: client.get("/v1/readyz").status_code == 200)
    again = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "x"})
    assert (again.status_code, again.json()["id"]) == (201, "1")
    assert ids(client) == ["1"]  # stored once, by the retried batch
    until("the job to run", lambda: client.get("/v1/jobs/1").json()["state"] == "running")
    errors = [
        line for line in client.get("/metrics").text.splitlines()
        if line.startswith("aisched_loop_errors_total ")
    ]  # fmt: skip
    assert len(errors) == 1 and float(errors[0].split()[1]) >= 1


class ReadBlocker:
    """Another connection that holds the jobs table against reads as well as writes. SQLite:
    a connection in exclusive locking mode, which WAL readers wait for too; it can take the
    database only while no other connection is open, so the service's idle ones are closed
    first (it opens new ones as it needs them, as after a restart of its pool). PostgreSQL:
    an ACCESS EXCLUSIVE lock on the table."""

    def __init__(self, svc: Service, tmp_path: Path) -> None:
        self.sqlite = svc.store.engine.dialect.name == "sqlite"
        if self.sqlite:
            svc.store.engine.dispose()
            # Waits for a step of the loop that holds the database now to end.
            self.conn: Any = sqlite3.connect(
                tmp_path / "state.db", isolation_level=None, timeout=30
            )
            self.conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            self.conn.execute("BEGIN EXCLUSIVE")
        else:
            self.conn = svc.store.engine.raw_connection()
            self.conn.cursor().execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")

    @property
    def error(self) -> str:
        if self.sqlite:
            return "(sqlite3.OperationalError) database is locked"
        return "(psycopg.errors.LockNotAvailable) canceling statement due to lock timeout"

    def release(self) -> None:
        if self.sqlite:
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()
        self.conn.close()


def test_a_submission_whose_key_cannot_be_read_is_answered_503_and_made_once_when_sent_again(
    open_service: OpenService, fx: FakeExecutor, tmp_path: Path
) -> None:
    """The loop reads the store for an Idempotency-Key after taking the submission off its
    queue; a store that fails that read must still leave the caller with an answer."""
    svc = open_service(fx, limits={"store_busy_timeout": "0.2s"})
    client = client_for(svc)  # its token is stored before the store is blocked
    blocker = ReadBlocker(svc, tmp_path)
    held = job("").name("kept").task(1, cpu=0.1).user(service_user()).build()
    try:
        future = svc.scheduler.submit(held, idempotency_key="k-1")
        with pytest.raises(Rejected) as refused:
            future.result(timeout=30)
    finally:
        blocker.release()
    assert refused.value.status == 503
    assert str(refused.value) == (
        f"not taken: the store could not be read to check its Idempotency-Key ({blocker.error}"
        "); nothing was changed: send it again with the same Idempotency-Key (GET /v1/readyz "
        "says when the store is back)"
    )
    doc = {"name": "kept", "command": ["true"]}
    first = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1"})
    again = client.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "k-1"})
    assert [(r.status_code, r.json()["id"]) for r in (first, again)] == [(201, "1"), (201, "1")]
    assert ids(client) == ["1"]


def test_a_cancel_the_store_cannot_write_is_a_503_and_carried_out_once_it_can(
    open_service: OpenService, fx: FakeExecutor, tmp_path: Path
) -> None:
    svc = open_service(fx, limits={"store_busy_timeout": "0.2s"})
    client = client_for(svc)
    one = client.post("/v1/jobs", json={"command": ["sleep", "100"]}).json()["id"]
    two = client.post("/v1/jobs", json={"command": ["sleep", "100"]}).json()["id"]
    until(
        "both to run",
        lambda: {j["state"] for j in client.get("/v1/jobs").json()["jobs"]} == {"running"},
    )
    holder = Holder(svc, tmp_path)  # another writer holds the database
    answers: list[Any] = []
    threads = [
        threading.Thread(target=lambda: answers.append(client.post(f"/v1/jobs/{one}/cancel"))),
        threading.Thread(
            target=lambda: answers.append(client.post("/v1/jobs/cancel", json={"mine": True}))
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [a.status_code for a in answers] == [503, 503]
    for a in answers:
        assert a.json()["error"].startswith("the cancel is not stored yet: the store cannot")
    holder.release()
    until(
        "the cancels to be carried out",
        lambda: {client.get(f"/v1/jobs/{j}").json()["state"] for j in (one, two)} == {"cancelled"},
    )


def _start_after(damage: str, tmp_path: Path, database_url: str | None) -> str:
    """What starting again says once a stored job's row has had `damage` (an SQL SET)."""
    cfg = load_config(None, {"data_dir": str(tmp_path), "database": database_url})
    svc = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    svc.start()
    jid = client_for(svc).post("/v1/jobs", json={"command": ["sleep", "100"]}).json()["id"]
    svc.close()
    engine = create_engine(database_url or f"sqlite:///{tmp_path / 'state.db'}")
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE jobs SET {damage} WHERE id = :id"), {"id": jid})
    engine.dispose()
    again = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    try:
        with pytest.raises(StoreError) as err:
            again.start()
    finally:
        again.close()
    message = str(err.value)
    assert message.endswith("restore the database from a backup, or mend or delete that row, "
                            "then start again"), message  # fmt: skip
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("state = 'bogus'", "ValueError: 'bogus' is not a valid JobState"),
        ('spec = \'{"not": "a job"}\'', "CodecError: stored job has unknown fields: not"),
    ],
)
def test_a_damaged_job_row_stops_the_start_with_one_line_naming_it(
    tmp_path: Path, database_url: str | None, damage: str, why: str
) -> None:
    message = _start_after(damage, tmp_path, database_url)
    assert message.startswith(f"the state database's job '1' cannot be read ({why}")


def test_a_job_row_whose_spec_is_not_json_stops_the_start_with_one_line(tmp_path: Path) -> None:
    # SQLite keeps what it is given (PostgreSQL refuses to store such a value).
    message = _start_after("spec = '{not json'", tmp_path, None)
    assert message.startswith("the state database holds a damaged job or task row (Expecting")


def test_a_read_the_store_cannot_answer_is_a_503_that_says_so(
    open_service: OpenService, fx: FakeExecutor, tmp_path: Path
) -> None:
    # It was a bare 500 "Internal Server Error": nothing said the store, not the request,
    # was at fault, nor that a retry would do.
    svc = open_service(fx, limits={"store_busy_timeout": "0.2s"})
    client = client_for(svc)  # its token is stored before the store is blocked
    blocker = ReadBlocker(svc, tmp_path)
    try:
        r = client.get("/v1/jobs")
    finally:
        blocker.release()
    assert r.status_code == 503
    assert r.json()["error"].startswith("the state database cannot answer now (")
    assert r.json()["error"].endswith("GET /v1/readyz says when it is back: try again then")
    assert client.get("/v1/jobs").status_code == 200

"""`limits.keep_ended`: an ended job is forgotten (its row, tasks, events and files in the data
directory) once it ended that long ago; a job not ended never is, nor the newest job, so no id
is given out twice. `limits.user_max_ended_bytes`: one user's oldest ended jobs go sooner,
when what their ended jobs keep passes it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from clients import client_for
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from aisched.service import retention
from aisched.service.app import Service
from aisched.testing.fakes import FakeExecutor, fake_node

JOB = {"command": ["sleep", "100"], "resources": {"gpus": 4}}


def until(what: str, check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def forgotten(client: TestClient) -> dict[str, float]:
    """`aisched_jobs_forgotten_total` by `why`."""
    return {
        m.labels["why"]: m.value
        for f in text_string_to_metric_families(client.get("/metrics").text)
        for m in f.samples
        if m.name == "aisched_jobs_forgotten_total"
    }


def test_ended_jobs_are_forgotten_after_keep_ended_and_no_others(
    open_service: Callable[..., Service], fx: FakeExecutor, tmp_path: Path
) -> None:
    svc = open_service(fx, limits={"keep_ended": "1s"})
    client = client_for(svc)

    def submit() -> str:
        r = client.post("/v1/jobs", json=JOB)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def state(job_id: str) -> str | None:
        r = client.get(f"/v1/jobs/{job_id}")
        return None if r.status_code == 404 else str(r.json()["state"])

    running, ended, newest = submit(), submit(), submit()  # 4 GPUs each: one runs
    until("the first job to run", lambda: state(running) == "running")
    logs = tmp_path / "logs" / ended
    logs.mkdir(parents=True)
    (logs / "main-0.log").write_text("output\n")
    outside = tmp_path / "outside"
    outside.write_text("not the job's\n")
    (logs / "link").symlink_to(outside)
    for job_id in (ended, newest):
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    until("the ended job to be forgotten", lambda: state(ended) is None)
    assert not logs.exists() and outside.read_text() == "not the job's\n"
    with svc.store.read() as tx:
        assert tx.events_of(ended) == [] and tx.tasks_of(ended) == []
    # The newest job is kept (the next id counts from it), and one running for longer than
    # `keep_ended` is never forgotten.
    time.sleep(1.5)
    assert (state(newest), state(running)) == ("cancelled", "running")
    assert forgotten(client) == {"keep_ended": 1, "user_max_ended_bytes": 0}
    # Read before the next submission: once it is made, `newest` is no longer the newest job,
    # and the next pass (a tenth of `keep_ended`) may forget it too.
    assert submit() == str(int(newest) + 1)


def test_keep_ended_zero_keeps_every_ended_job(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    client: TestClient = client_for(open_service(fx, limits={"keep_ended": 0}))
    first = client.post("/v1/jobs", json=JOB).json()["id"]
    client.post("/v1/jobs", json=JOB)
    assert client.post(f"/v1/jobs/{first}/cancel").status_code == 202
    time.sleep(1.0)
    assert client.get(f"/v1/jobs/{first}").json()["state"] == "cancelled"


def test_a_users_oldest_ended_jobs_go_past_user_max_ended_bytes_also_after_a_restart(
    open_service: Callable[..., Service], tmp_path: Path
) -> None:
    # Each job below keeps a 100 KiB log, two folders and its document: two fit in 300K.
    limits = {"user_max_ended_bytes": "300K", "keep_ended": 0}
    svc = open_service(FakeExecutor([fake_node(gpus=4)]), limits=limits)
    mine, theirs = client_for(svc, "nobody"), client_for(svc)

    def state(job_id: str) -> str | None:
        r = client_for(svc).get(f"/v1/jobs/{job_id}")
        return None if r.status_code == 404 else str(r.json()["state"])

    def ended(client: TestClient, log_bytes: int) -> str:
        r = client.post("/v1/jobs", json=JOB)
        assert r.status_code == 201, r.text
        job_id = str(r.json()["id"])
        until(f"job {job_id} to start", lambda: state(job_id) == "running")
        logs = tmp_path / "logs" / job_id / "1"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "main-0.log").write_bytes(b"x" * log_bytes)
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        until(f"job {job_id} to end", lambda: state(job_id) == "cancelled")
        return job_id

    others = ended(theirs, 250 * 1024)
    first = [ended(mine, 100 * 1024) for _ in range(4)]
    until("alice's two oldest to be forgotten", lambda: state(first[1]) is None)
    assert [state(j) for j in (first[0], *first[2:], others)] == [
        None,
        "cancelled",
        "cancelled",
        "cancelled",
    ]
    assert not (tmp_path / "logs" / first[0]).exists()
    # Whoever asks for a forgotten job is told where it likely went; an id never given, not.
    admin, gone = client_for(svc), first[0]
    asked = (f"/v1/jobs/{gone}", f"/v1/jobs/{gone}/logs", f"/v1/jobs/{gone}/cancel")
    for r in (admin.get(asked[0]), admin.get(asked[1]), admin.post(asked[2])):
        assert r.status_code == 404, r.text
        assert r.json()["error"] == (
            f"no job {gone}: an ended job is forgotten limits.keep_ended after it ended, and "
            "sooner when its user's ended jobs keep more than limits.user_max_ended_bytes"
        )
    assert admin.get("/v1/jobs/999999").json()["error"] == "no job 999999"
    assert forgotten(admin) == {"keep_ended": 0, "user_max_ended_bytes": 2}
    # What the store says each document takes is what the service counted (PostgreSQL too).
    with svc.store.read() as tx:
        sizes = {i: n for i, _, n in tx.ended_doc_sizes()}
        specs = {r["id"]: r["spec"] for r in tx.list_jobs()}
    assert sizes == {i: len(json.dumps(specs[i])) for i in (others, *first[2:])}
    svc.close()
    svc = open_service(FakeExecutor([fake_node(gpus=4)]), limits=limits)
    mine = client_for(svc, "nobody")
    later = ended(mine, 100 * 1024)
    until("alice's oldest kept to be forgotten", lambda: state(first[2]) is None)
    assert [state(j) for j in (first[3], later, others)] == ["cancelled"] * 3


def test_an_id_of_digits_that_are_not_ascii_names_no_job(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    # '¹' is a digit to str.isdigit but not to int (the answer was a 500); '٣' is 3 to int,
    # and no job's id: ids are ASCII digits.
    client = client_for(open_service(fx))
    for _ in range(3):
        assert client.post("/v1/jobs", json=JOB).status_code == 201
    for job_id in ("¹", "٣", "²³"):
        for r in (
            client.get(f"/v1/jobs/{job_id}"),
            client.get(f"/v1/jobs/{job_id}/logs"),
            client.post(f"/v1/jobs/{job_id}/cancel"),
        ):
            assert r.status_code == 404, r.text
            assert r.json()["error"] == f"no job {job_id}"


def _old_audit_rows(svc: Service, count: int, age_s: float) -> None:
    with svc.store.tx() as tx:
        for i in range(count):
            tx.add_audit(
                {
                    "time": time.time() - age_s,
                    "actor": "root",
                    "via": "socket",
                    "action": "cancel",
                    "target": f"job {i + 1}",
                    "owner": "ana",
                    "detail": "was running",
                }
            )


def test_audit_rows_are_deleted_after_keep_audit_in_batches(
    open_service: Callable[..., Service], fx: FakeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: nothing ever deleted an audit row."""
    monkeypatch.setattr(retention, "FORGET_AT_MOST", 3)  # 7 old rows: three batches
    # Checked every tenth of it: the first pass, at the start, found none of the rows below.
    svc = open_service(fx, limits={"keep_audit": "60s"})
    _old_audit_rows(svc, 7, age_s=7200)
    client = client_for(svc)
    r = client.post("/v1/tokens", json={"user": "ana"})  # a fresh row, of now
    assert r.status_code == 201, r.text

    def audit() -> list[tuple[str, str]]:
        return [(a["action"], a["target"]) for a in client.get("/v1/audit").json()]

    until("the old audit rows to be deleted", lambda: len(audit()) == 1, timeout_s=30)
    assert audit() == [("token create", f"token {r.json()['id']}")]


def test_keep_audit_zero_keeps_every_audit_row(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    svc = open_service(fx, limits={"keep_audit": 0, "keep_ended": "1s"})
    _old_audit_rows(svc, 3, age_s=10 * 365 * 86400)
    client = client_for(svc)
    # The loop's retention pass runs (a job is forgotten), and the audit rows stay.
    jobs = [client.post("/v1/jobs", json=JOB).json()["id"] for _ in range(2)]
    assert client.post(f"/v1/jobs/{jobs[0]}/cancel").status_code == 202
    until(
        "the ended job to be forgotten",
        lambda: client.get(f"/v1/jobs/{jobs[0]}").status_code == 404,
    )
    assert len(client.get("/v1/audit").json()) == 3 + 1  # and the cancel's own row

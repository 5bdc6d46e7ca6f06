"""`limits.user_max_jobs`: one user's jobs not yet ended are bounded, so one user cannot fill the
queue, the store and every cycle for the others. Past it a submission is a 429 that says why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from clients import client_for
from fastapi.testclient import TestClient

from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.testing.fakes import FakeExecutor, fake_node

JOB = {"command": ["sleep", "100"], "resources": {"gpus": 4}}
PIPELINE = "jobs:\n" + "".join(f"  - {{name: s{i}, command: [sleep, '1']}}\n" for i in range(2))


def submit(client: TestClient, **extra: Any) -> Any:
    return client.post("/v1/jobs", json=JOB, **extra)


def test_a_user_past_the_limit_is_refused_with_429_and_others_are_not(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    svc = open_service(fx, limits={"user_max_jobs": 2})
    mine, nobody = client_for(svc), client_for(svc, "nobody")
    first = submit(mine, headers={"Idempotency-Key": "k1"}).json()["id"]
    waiting = submit(mine).json()["id"]  # one runs, one waits: both count
    r = submit(mine)
    assert r.status_code == 429, r.text
    (why,) = r.json()["problems"]
    assert "has 2 jobs not yet ended and may have at most 2 (limits.user_max_jobs;" in why
    # A retry of a job already taken is answered with that job, not refused.
    again = submit(mine, headers={"Idempotency-Key": "k1"})
    assert (again.status_code, again.json()["id"]) == (201, first)
    # Another user is not held back by this one's jobs; a file of jobs counts whole.
    assert submit(nobody).status_code == 201
    r = nobody.post("/v1/jobs", content=PIPELINE)
    assert r.status_code == 429, r.text
    assert "(this submission counts 2)" in r.json()["problems"][0]
    assert [j["user"] for j in mine.get("/v1/jobs").json()["jobs"]].count("nobody") == 1
    # A job that ends makes room.
    assert mine.post(f"/v1/jobs/{waiting}/cancel").status_code == 202
    assert submit(mine).status_code == 201


def test_the_count_is_taken_again_from_the_store_after_a_restart(tmp_path: Path) -> None:
    cfg = load_config(None, {"data_dir": str(tmp_path), "limits": {"user_max_jobs": 1}})
    svc = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    svc.start()
    try:
        assert submit(client_for(svc)).status_code == 201
    finally:
        svc.close()
    again = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    again.start()
    try:
        assert submit(client_for(again)).status_code == 429
    finally:
        again.close()


def test_a_service_counts_with_every_replica_it_may_scale_to(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    # Its replicas are admitted as it scales, unchecked: counted as one job, a service of a
    # user at the limit took 100 replicas (a second audit).
    svc = open_service(fx, limits={"user_max_jobs": 3})
    client = client_for(svc)

    def service(most: int) -> Any:
        body = {
            "name": f"s{most}",
            "kind": "service",
            "command": ["sleep", "100"],
            "service": {"min_replicas": most, "max_replicas": most, "readiness_path": None},
        }
        return client.post("/v1/jobs", json=body)  # fmt: skip

    r = service(3)
    assert r.status_code == 429, r.text
    assert "(this submission counts 4)" in r.json()["problems"][0]
    assert service(2).status_code == 201  # itself and two replicas: 3
    assert submit(client).status_code == 429


def big(name: str) -> dict[str, Any]:
    """A job whose document is about 100 KiB (a long environment value, as a config blob)."""
    blob = {"BLOB": "x" * (100 << 10)}
    return {"name": name, "command": ["sleep", "100"], "env": blob, "resources": {"gpus": 4}}


def test_a_byte_limit_under_10_kib_is_said_in_bytes(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    """A limit of 1K read "take 0.00 MiB ... at most 0.00 MiB"."""
    svc = open_service(fx, limits={"user_max_job_bytes": "1K"})
    r = client_for(svc).post("/v1/jobs", json=big("b0"))
    assert r.status_code == 429, r.text
    (why,) = r.json()["problems"]
    assert "at most 1,024 bytes (limits.user_max_job_bytes;" in why, why


def test_a_user_whose_documents_would_pass_the_byte_limit_is_refused_with_429(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    # 10,000 jobs of 1 MiB each would have put 10 GB in one user's name in the database.
    svc = open_service(fx, limits={"user_max_job_bytes": "350K"})
    mine, nobody = client_for(svc), client_for(svc, "nobody")
    ids = [mine.post("/v1/jobs", json=big(f"b{i}")).json()["id"] for i in range(3)]
    r = mine.post("/v1/jobs", json=big("b3"))
    assert r.status_code == 429, r.text
    (why,) = r.json()["problems"]
    assert "jobs not yet ended take 0.30 MiB of job documents, and this submission 0.10 MiB" in why
    assert "at most 0.34 MiB (limits.user_max_job_bytes;" in why
    # Small jobs still fit; another user is not held back; an ended job (one that waited:
    # it ends at once) makes room.
    assert submit(mine).status_code == 201
    assert nobody.post("/v1/jobs", json=big("n0")).status_code == 201
    assert mine.post(f"/v1/jobs/{ids[1]}/cancel").status_code == 202
    assert mine.post("/v1/jobs", json=big("b4")).status_code == 201


def test_the_bytes_are_counted_again_from_the_store_after_a_restart(tmp_path: Path) -> None:
    cfg = load_config(None, {"data_dir": str(tmp_path), "limits": {"user_max_job_bytes": "150K"}})
    svc = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    svc.start()
    try:
        assert client_for(svc).post("/v1/jobs", json=big("b0")).status_code == 201
    finally:
        svc.close()
    again = Service.open(cfg, executor=FakeExecutor([fake_node(gpus=4)]))
    again.start()
    try:
        assert client_for(again).post("/v1/jobs", json=big("b1")).status_code == 429
        assert submit(client_for(again)).status_code == 201
    finally:
        again.close()

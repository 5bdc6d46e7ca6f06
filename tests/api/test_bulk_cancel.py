"""Bulk cancel (`POST /v1/jobs/cancel`, `aisched cancel --all-mine/--queue/--state`): the
selection, the owner rules of one cancel, one audit line per call, and the count answered."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from aisched.service.identity import service_user

AsUser = Callable[[str], TestClient]


def job(gpus: int) -> dict[str, Any]:
    return {"command": ["sleep", "100"], "resources": {"gpus": gpus}}


def wait(client: TestClient, job_id: str, state: str) -> None:
    deadline = time.monotonic() + 10
    while (got := client.get(f"/v1/jobs/{job_id}").json()["state"]) != state:
        assert time.monotonic() < deadline, f"job {job_id} is {got}, not {state}"
        time.sleep(0.02)


def test_bulk_cancel_takes_what_it_names_under_the_owner_rules(
    client: TestClient, client_as: AsUser
) -> None:
    running = [client.post("/v1/jobs", json=job(2)).json()["id"] for _ in range(2)]
    for job_id in running:
        wait(client, job_id, "running")
    pending = [client.post("/v1/jobs", json=job(1)).json()["id"] for _ in range(3)]

    # A user's selection is their own jobs, whatever else it names: ana has none.
    r = client_as("ana").post("/v1/jobs/cancel", json={"state": "pending"})
    assert (r.status_code, r.json()) == (
        200,
        {"count": 0, "cancelled": 0, "stopping": 0, "jobs": []},
    )

    r = client.post("/v1/jobs/cancel", json={})
    assert (r.status_code, r.json()) == (
        422,
        {
            "error": "name the jobs to cancel",
            "problems": ["body: give at least one of mine, queue, state"],
        },
    )
    r = client.post("/v1/jobs/cancel", json={"state": "done"})
    assert r.status_code == 422 and r.json()["problems"][0].startswith("body.state:")

    r = client.post("/v1/jobs/cancel", json={"state": "pending"})
    assert (r.status_code, r.json()) == (
        200,
        {
            "count": 3,
            "cancelled": 3,
            "stopping": 0,
            "jobs": [{"id": i, "state": "cancelled"} for i in pending],
        },
    )
    assert [client.get(f"/v1/jobs/{i}").json()["state"] for i in pending] == ["cancelled"] * 3

    r = client.post("/v1/jobs/cancel", json={"mine": True, "queue": "default"})
    assert r.json() == {
        "count": 2,
        "cancelled": 0,
        "stopping": 2,
        "jobs": [{"id": i, "state": "running"} for i in running],
    }
    for job_id in running:
        wait(client, job_id, "cancelled")

    me = service_user()
    audit = client.get("/v1/audit").json()  # newest first
    none, nil, two = "0 cancelled", "0 stopping", "2 stopping"
    assert [(a["actor"], a["action"], a["target"], a["detail"]) for a in audit] == [
        (me, "cancel-many", f"jobs with user={me}, queue=default", f"2 jobs: {none}, {two}"),
        (me, "cancel-many", "jobs with user=*, state=pending", f"3 jobs: 3 cancelled, {nil}"),
        ("ana", "cancel-many", "jobs with user=ana, state=pending", f"0 jobs: {none}, {nil}"),
    ]  # fmt: skip  (one line per call, whatever its count)

"""A stored row no version of aisched wrote (edited by hand, damaged) fails the requests that
read it with a Problem document that names what failed, not with a bare 500 page: the CLI took
that page for a server that is not aisched ("it does not look like an aisched service")."""

from __future__ import annotations

import time

from clients import token_for
from fastapi.testclient import TestClient
from sqlalchemy import text

from aisched.service.api import create_app
from aisched.service.app import Service
from aisched.service.identity import service_user


def test_a_damaged_row_of_an_ended_job_fails_its_reads_with_a_problem(svc: Service) -> None:
    token = token_for(svc, service_user(), admin=True)
    client = TestClient(
        create_app(svc), headers={"Authorization": f"Bearer {token}"},
        raise_server_exceptions=False,
    )  # fmt: skip
    jid = client.post("/v1/jobs", json={"command": ["true"]}).json()["id"]
    assert client.post(f"/v1/jobs/{jid}/cancel").status_code in (200, 202)
    deadline = time.monotonic() + 10
    while client.get(f"/v1/jobs/{jid}").json()["state"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with svc.store.engine.begin() as conn:  # its spec, as a hand's edit could leave it
        conn.execute(text("UPDATE jobs SET spec = :spec WHERE id = :id"), {"spec": "{}", "id": jid})
    for path in (f"/v1/jobs/{jid}", "/v1/jobs?all=true"):
        r = client.get(path)
        assert r.status_code == 500
        assert r.json()["error"] == (
            "the service failed on this request (KeyError: 'groups'); the service's log has "
            "the details"
        )
    assert client.get("/v1/healthz").json()["ok"]  # the service goes on

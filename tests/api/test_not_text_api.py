"""A string that is not Unicode text (a lone surrogate, which a JSON escape can write: "\\udcff")
is refused with 422 naming its field wherever a body may hold it, and nothing of it is kept.
Taken as text, it made the answers that showed it fail with 500: a job stored with one was
then missing from every admin's listing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

WHY = "not Unicode text: it holds a lone surrogate (\\udcff), which UTF-8 cannot encode"


@pytest.mark.parametrize(
    ("route", "body", "where"),
    [
        ("/v1/jobs", '{"command": ["echo", "\\udcff"]}', "body.command.1"),
        ("/v1/jobs", '{"command": "true", "env": {"A": "x\\udcff"}}', "body.env.A"),
        ("/v1/jobs", '{"jobs": [{"name": "\\udcff", "command": "true"}]}', "body.jobs.0.name"),
        ("/v1/jobs/cancel", '{"queue": "\\udcff"}', "body.queue"),
        ("/v1/tokens", '{"user": "nobody", "note": "\\udcff"}', "body.note"),
        ("/v1/jobs/1/metrics", '{"\\udcff": 1}', "body.\\udcff (its key)"),
    ],
)
def test_a_lone_surrogate_is_refused_by_its_field_and_nothing_is_kept(
    client: TestClient, route: str, body: str, where: str
) -> None:
    tokens_before = client.get("/v1/tokens").json()
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["problems"] == [f"{where}: {WHY}"]
    assert client.get("/v1/jobs", params={"all": "true"}).json()["jobs"] == []
    assert client.get("/v1/tokens").json() == tokens_before


def test_a_surrogate_pair_is_text_and_an_escaped_backslash_is_not_an_escape(
    client: TestClient,
) -> None:
    body = '{"command": ["echo", "\\ud83d\\ude00", "\\\\udcff"]}'
    r = client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["job"]["groups"][0]["command"] == ["echo", "\U0001f600", "\\udcff"]
    assert [j["id"] for j in client.get("/v1/jobs").json()["jobs"]] == [r.json()["id"]]


def test_a_lone_surrogate_in_a_yaml_job_file_is_refused_by_its_field(client: TestClient) -> None:
    r = client.post("/v1/jobs?source=f.yaml", content='command: [echo, "\\udcff"]\n')
    assert (r.status_code, r.json()["problems"]) == (422, [f"f.yaml: command.1: {WHY}"])

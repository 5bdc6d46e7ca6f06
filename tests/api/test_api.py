"""The REST API in process: FastAPI's test client over the real app, store and loop thread, with
the fake executor standing in for processes (the e2e tests run real ones)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from aisched.service.identity import service_user
from aisched.testing.fakes import FakeExecutor

VOLCANO = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: pt}
spec:
  minAvailable: 2
  queue: default
  priorityClassName: high
  tasks:
    - name: worker
      replicas: 2
      template:
        spec:
          containers:
            - name: c
              image: pytorch/pytorch
              command: [python, train.py]
              resources: {limits: {nvidia.com/gpu: 1, cpu: "2", memory: 4Gi}}
"""


def wait(client: TestClient, job_id: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        j: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if j["state"] == state:
            return j
        assert time.monotonic() < deadline, f"job {job_id} is {j['state']}, not {state}"
        time.sleep(0.02)


def test_submit_json_then_show_list_and_finish(
    client: TestClient, fx: FakeExecutor, tmp_path: Path
) -> None:
    r = client.post(
        "/v1/jobs",
        json={"command": ["echo", "hi"], "resources": {"gpus": 2}},
        headers={"X-Aisched-User": "ana"},
        params={"workdir": str(tmp_path)},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    jid = body["id"]
    # The header is the client's word and names nobody: the token's user submitted it.
    assert (body["job"]["user"], body["job"]["name"], body["job"]["gpus"]) == (
        service_user(),
        "echo",
        2.0,
    )
    running = wait(client, jid, "running")
    assert [(t["name"], t["gpus"]) for t in running["tasks"]] == [("main-0", [0, 1])]
    # The job reads running once its intent is committed; its task is launched right after.
    deadline = time.monotonic() + 10
    while not fx.launched:
        assert time.monotonic() < deadline, "the task was never launched"
        time.sleep(0.01)
    assert fx.launched[0].workdir == str(tmp_path)
    assert [j["id"] for j in client.get("/v1/jobs").json()["jobs"]] == [jid]
    fx.exit(fx.keys(jid)[0], 0)
    fx._wakeup and fx._wakeup()
    done = wait(client, jid, "succeeded")
    assert [e["kind"] for e in done["events"]] == ["submitted", "placed", "started",
                                                    "task-exited", "succeeded"]  # fmt: skip
    assert client.get("/v1/jobs").json()["jobs"] == []
    assert [j["id"] for j in client.get("/v1/jobs", params={"all": "true"}).json()["jobs"]] == [jid]


def test_submit_a_volcano_job_as_yaml(client: TestClient, fx: FakeExecutor) -> None:
    r = client.post(
        "/v1/jobs",
        content=VOLCANO,
        headers={"content-type": "application/yaml"},
        params={"source": "pt.yaml"},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["job"]["format"] == "volcano"
    assert body["job"]["priority"] == 100
    # The image is run (docs/containers.md), no longer warned about.
    assert body["warnings"] == []
    wait(client, body["id"], "running")
    # The state is written before the tasks are launched (intent first): wait for the launches.
    deadline = time.monotonic() + 10
    while len(fx.launched) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted((t.task, t.env["RANK"], t.gpus) for t in fx.launched) == [
        ("worker-0", "0", (0,)),
        ("worker-1", "1", (1,)),
    ]


VC_TASKS = b"  tasks: [{template: {spec: {containers: [{command: [x]}]}}}]\n"
VC_HEAD = b"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\n"


@pytest.mark.parametrize(
    ("body", "ctype", "status", "want"),
    [
        (b"name: [", "application/yaml", 422, "j.yaml:1:8: YAML syntax error"),
        (b"command: [x]\nbogus: 1\n", "application/yaml", 422, "j.yaml: bogus: unknown key"),
        (b'{"command": ["x"], "resources": {"gpus": 5}}', "application/json", 422, "never fit"),
        (
            b'{"command": ["x"], "queue": "nope"}',
            "application/json",
            422,
            "j.yaml: queue: unknown queue 'nope'",
        ),
        # Without the field's path, a Volcano file's was hard to find.
        (
            VC_HEAD + b"metadata: {name: v}\nspec:\n  queue: research\n" + VC_TASKS,
            "application/yaml",
            422,
            "j.yaml: spec.queue: unknown queue 'research'",
        ),
        (
            VC_HEAD
            + b"metadata: {name: v, labels: {kai.scheduler/queue: research}}\nspec:\n"
            + VC_TASKS,
            "application/yaml",
            422,
            "j.yaml: metadata.labels.kai.scheduler/queue: unknown queue 'research'",
        ),
        (b"kind: Pod\napiVersion: v1\n", "application/yaml", 422, "aisched reads Volcano Jobs"),
        # Where the nesting went too deep (it said only "nested deeper than 64 levels").
        (
            b'{"command": ["x"],\n "env": ' + b"[" * 70,
            "application/json",
            422,
            "j.yaml: nested deeper than 64 levels at line 2, column 72",
        ),
    ],
)
def test_bad_documents_are_refused_with_a_problem(
    client: TestClient, body: bytes, ctype: str, status: int, want: str
) -> None:
    r = client.post(
        "/v1/jobs", content=body, headers={"content-type": ctype}, params={"source": "j.yaml"}
    )
    assert r.status_code == status
    problem = r.json()
    assert want in "\n".join([problem["error"], *problem["problems"]])
    assert client.get("/v1/jobs", params={"all": "true"}).json()["jobs"] == []


def test_cancel_pending_and_unknown(client: TestClient) -> None:
    big = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 4}}).json()["id"]
    wait(client, big, "running")
    small = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 1}}).json()["id"]
    shown = client.get(f"/v1/jobs/{small}").json()
    assert shown["state"] == "pending"
    r = client.post(f"/v1/jobs/{small}/cancel")
    assert (r.status_code, r.json()) == (202, {"id": small, "state": "cancelled"})
    assert client.post(f"/v1/jobs/{small}/cancel").status_code == 409
    assert client.post("/v1/jobs/77/cancel").status_code == 404
    assert client.get("/v1/jobs/77").status_code == 404


def test_nodes_queues_and_metrics(client: TestClient) -> None:
    jid = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 3}}).json()["id"]
    wait(client, jid, "running")
    node = client.get("/v1/nodes").json()["nodes"][0]
    assert [g["free_milli"] for g in node["gpus"]] == [0, 0, 0, 1000]
    assert node["gpus"][0]["used_by"] == [{"job": jid, "task": "main-0", "gpu_milli": 1000}]
    (q,) = client.get("/v1/queues").json()["queues"]
    assert (q["name"], q["running"], q["pending"], q["used"]["gpus"]) == ("default", 1, 0, 3.0)
    text = client.get("/metrics").text
    assert "aisched_allocated_gpus 3.0" in text
    assert 'aisched_jobs{state="running"} 1.0' in text
    info = client.get("/v1/info").json()
    assert (info["policy"], info["executor"]) == ("default", "fake")


def test_logs_of_an_attempt(client: TestClient, fx: FakeExecutor) -> None:
    jid = client.post("/v1/jobs", json={"command": ["x"], "replicas": 2}).json()["id"]
    wait(client, jid, "running")
    for launch in fx.launched:
        Path(launch.log_path).write_text(f"hello from {launch.task}\n")
    text = client.get(f"/v1/jobs/{jid}/logs").text
    assert text == "[main-0] hello from main-0\n[main-1] hello from main-1\n"
    assert client.get(f"/v1/jobs/{jid}/logs", params={"task": "main-1"}).text == (
        "hello from main-1\n"
    )
    assert client.get(f"/v1/jobs/{jid}/logs", params={"attempt": 5}).status_code == 404


def test_a_rate_too_long_for_a_float_is_refused_naming_its_field(client: TestClient) -> None:
    """Read through a float, 1 and 400 zeros was infinity: `int` of it raised, and the job
    was answered 500, "internal error"."""
    huge = "1" + "0" * 400
    r = client.post("/v1/jobs", json={"command": ["x"], "image": "a", "bandwidth": huge})
    assert r.status_code == 422, r.text
    assert r.json()["problems"] == [
        f"request: bandwidth: '1{'0' * 34}...' is more than the limit of 10Tbit"
    ]


def test_a_nul_in_an_id_a_parameter_or_a_field_is_the_requests_fault(client: TestClient) -> None:
    """PostgreSQL takes no text with a NUL: each of these failed in the store and was answered
    503, "the state database cannot answer now", for a request that was wrong."""
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("GET", "/v1/jobs", {"params": {"queue": "a\x00b"}}, "query.queue: "),
        ("GET", "/v1/jobs", {"params": {"user": "\x00"}}, "query.user: "),
        ("GET", "/v1/jobs/1%00", {}, "path.job_id: "),
        ("GET", "/v1/jobs/1%00/logs", {}, "path.job_id: "),
        ("POST", "/v1/jobs/1%00/cancel", {}, "path.job_id: "),
        ("POST", "/v1/jobs/cancel", {"json": {"queue": "a\x00"}}, "body.queue: "),
        ("POST", "/v1/tokens", {"json": {"user": "bob", "note": "a\x00"}}, "body.note: "),
        ("POST", "/v1/tokens/t%00/revoke", {}, "path.token_id: "),
    ]
    for method, url, kw, where in cases:
        r = client.request(method, url, **kw)
        assert r.status_code == 422, (url, kw, r.text)
        [line] = r.json()["problems"]
        assert line.startswith(where) and line.endswith("contains a NUL character"), line
    assert client.get("/v1/readyz").status_code == 200


def test_a_bad_request_body_or_parameter_is_said_in_the_words_job_files_get(
    client: TestClient,
) -> None:
    """Request bodies and parameters the API's own models check were answered in pydantic's
    words ("Extra inputs are not permitted", "Input should be a valid boolean, unable to
    interpret input") where a job file's same mistake gets the project's."""
    cases: list[tuple[str, str, dict[str, Any], list[str]]] = [
        ("POST", "/v1/jobs/cancel", {"json": {"bogus": 1}}, ["body.bogus: unknown key"]),
        (
            "POST",
            "/v1/jobs/cancel",
            {"json": {"mine": "perhaps"}},
            ["body.mine: expected true or false, got 'perhaps' (a string)"],
        ),
        (
            "POST",
            "/v1/jobs/cancel",
            {"json": {"state": "done"}},
            ["body.state: expected 'pending' or 'running', got 'done' (a string)"],
        ),
        (
            "POST",
            "/v1/jobs/cancel",
            {"json": [1]},
            ["body: Input should be a mapping (key: value pairs)"],
        ),
        (
            "POST",
            "/v1/tokens",
            {"json": {"user": 5, "admin": "maybe"}},
            [
                "body.user: expected a string, got 5 (an integer)",
                "body.admin: expected true or false, got 'maybe' (a string)",
            ],
        ),
        (
            "GET",
            "/v1/jobs",
            {"params": {"limit": "x"}},
            ["query.limit: expected an integer, got 'x' (a string)"],
        ),
        ("GET", "/v1/jobs", {"params": {"limit": 0}}, ["query.limit: must be at least 1, got 0"]),
    ]
    for method, url, kw, want in cases:
        r = client.request(method, url, **kw)
        assert (r.status_code, r.json()) == (
            422,
            {"error": "invalid request", "problems": want},
        ), (url, kw)

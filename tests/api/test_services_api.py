"""Services and pipelines through the API in process (fake executor, real loop, real
autoscaler thread): pushed load scales a service, bad metrics and bad files are named."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clients import client_for
from fastapi.testclient import TestClient

from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.service.scheduler_state import clock
from aisched.spec.errors import SpecError
from aisched.testing.fakes import FakeExecutor, fake_node

SERVICE: dict[str, Any] = {
    "name": "web",
    "kind": "service",
    "command": ["python", "serve.py"],
    "service": {
        "min_replicas": 1,
        "max_replicas": 3,
        "target": 10,
        "readiness_path": None,  # the fake executor's tasks answer nothing: ready once running
        "scale_down_window": "0s",
    },
}


def until(what: str, check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return got


def service_of(client: TestClient, sid: str) -> dict[str, Any]:
    out: dict[str, Any] = client.get(f"/v1/jobs/{sid}").json()["service"]
    return out


def test_pushed_load_scales_a_service_up_and_down(client: TestClient) -> None:
    r = client.post("/v1/jobs", json=SERVICE)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert r.json()["job"]["state"] == "running"
    until("one ready replica", lambda: service_of(client, sid)["ready"] == 1)
    assert client.post(f"/v1/jobs/{sid}/metrics", json={"rps": 25}).json() == {"service": sid}
    st = until("three replicas", lambda: (s := service_of(client, sid))["ready"] == 3 and s)
    assert st["desired"] == 3 and len(st["replica_ids"]) == 3
    replica = st["replica_ids"][0]
    assert client.get(f"/v1/jobs/{replica}").json()["replica_of"] == sid
    # A replica may report for itself too; the whole-service figure wins while it is fresh.
    assert client.post(f"/v1/jobs/{replica}/metrics", json={"rps": 1}).json() == {"service": sid}
    client.post(f"/v1/jobs/{sid}/metrics", json={"rps": 0})
    until("back to one replica", lambda: service_of(client, sid)["ready"] == 1)
    assert client.post(f"/v1/jobs/{sid}/cancel").json()["state"] == "running"  # stopping
    until("no live jobs", lambda: not client.get("/v1/jobs").json()["jobs"])


def test_a_service_with_no_minimum_scales_to_zero_and_back_on_pushed_load(
    client: TestClient,
) -> None:
    body = {**SERVICE, "service": {**SERVICE["service"], "min_replicas": 0}}
    sid = client.post("/v1/jobs", json=body).json()["id"]
    assert service_of(client, sid)["replica_ids"] == []
    client.post(f"/v1/jobs/{sid}/metrics", json={"rps": 15})
    until("two replicas", lambda: service_of(client, sid)["ready"] == 2)
    client.post(f"/v1/jobs/{sid}/metrics", json={"rps": 0})
    until("no replica", lambda: service_of(client, sid)["replica_ids"] == [])


def test_one_services_figures_cannot_stop_the_others_scaling(client: TestClient) -> None:
    # A huge load over a tiny target overflowed the rule, and the round stopped at it.
    tiny = {**SERVICE, "name": "tiny", "service": {**SERVICE["service"], "target": 1e-320}}
    first = client.post("/v1/jobs", json=tiny).json()["id"]
    client.post(f"/v1/jobs/{first}/metrics", json={"rps": 1e308})
    other = client.post("/v1/jobs", json=SERVICE).json()["id"]
    client.post(f"/v1/jobs/{other}/metrics", json={"rps": 25})
    until("the other service to scale", lambda: service_of(client, other)["ready"] == 3)
    assert service_of(client, first)["desired"] == 3


def fail_the_running_replica(client: TestClient, fx: FakeExecutor, sid: str) -> dict[str, Any]:
    """Wait for the service's replica to run, make its task exit with 1; its row once it has
    failed (no retries left)."""
    key = until("a running replica", lambda: next(iter(fx.running), None))
    assert client.get(f"/v1/jobs/{key[0]}").json()["replica_of"] == sid
    fx.exit(key, 1)
    return until(  # type: ignore[no-any-return]
        "the replica to fail",
        lambda: (j := client.get(f"/v1/jobs/{key[0]}").json())["state"] == "failed" and j,
    )


def test_a_crash_looping_service_waits_longer_before_each_new_replica_also_after_a_restart(
    tmp_path: Path, database_url: str | None
) -> None:
    # Each failed replica was replaced at once, for ever: a new replica every few seconds,
    # each using its retries, and the service's reason never named the failure.
    base = {"data_dir": str(tmp_path), "database": database_url, "cycle_interval": "0.2s"}
    cfg = load_config(None, {**base, "autoscaler_interval": "100ms"})
    body = {
        **SERVICE,
        "name": "crash",
        "restart": {"max_retries": 0, "backoff": "1s"},
        "service": {**SERVICE["service"], "max_replicas": 1},
    }
    fx = FakeExecutor([fake_node(gpus=1)])
    svc = Service.open(cfg, executor=fx)
    svc.start()
    try:
        client = client_for(svc)
        sid = client.post("/v1/jobs", json=body).json()["id"]
        first = fail_the_running_replica(client, fx, sid)
        second = fail_the_running_replica(client, fx, sid)
        # Its replacement waited a second, the backoff; the next one waits two.
        assert second["started_at"] - first["finished_at"] >= 1.0
        held = until("a held replica", lambda: service_of(client, sid)["replica_ids"])[0]
        assert client.get(f"/v1/jobs/{held}").json()["not_before"] == second["finished_at"] + 2
    finally:
        svc.close()
    # After a restart the run is derived from the failed replicas' ends: the third failure
    # in a row waits four seconds, not one.
    fx = FakeExecutor([fake_node(gpus=1)])
    again = Service.open(cfg, executor=fx)
    again.start()
    try:
        client = client_for(again)
        third = fail_the_running_replica(client, fx, sid)
        assert third["id"] == held and third["started_at"] - second["finished_at"] >= 2.0
        new = until("a held replica", lambda: service_of(client, sid)["replica_ids"])[0]
        job = client.get(f"/v1/jobs/{new}").json()
        assert (job["state"], job["not_before"]) == ("pending", third["finished_at"] + 4)
        failure = (
            f"replica {held} failed: task main-0 exited with code 1; no retries left (0) "
            "(3 replicas failed in a row)"
        )
        # The same words wherever the wait is shown: the replica held, the service's status,
        # its scaling and replica-failed events.
        waiting = f"{failure}: a new replica starts not before {clock(third['finished_at'] + 4)}"
        assert job["reason"] == waiting
        st = until("the status", lambda: (s := service_of(client, sid))["reason"] and s)
        assert st["reason"].endswith(f"; {waiting}")
        events = client.get(f"/v1/jobs/{sid}").json()["events"]
        said = [e["message"] for e in events if e["kind"] == "replica-failed"]
        assert said[-1] == f"{waiting} (a backoff of 4s)"
        scaling = [e["message"] for e in events if e["kind"] == "scaling"]
        assert scaling[-1].endswith(f"; {waiting}")
    finally:
        again.close()


def test_bad_metrics_are_refused_naming_the_field(client: TestClient) -> None:
    sid = client.post("/v1/jobs", json=SERVICE).json()["id"]
    batch = client.post("/v1/jobs", json={"command": "sleep 1"}).json()["id"]
    cases = [
        (sid, {"qps": 1}, 422, ["body: qps: unknown metric; one of latency_ms, rps"]),
        (sid, {"rps": -1}, 422, ["body: rps: expected a number of at least 0, got -1"]),
        (sid, {"rps": True}, 422, ["body: rps: expected a number of at least 0, got True"]),
        (sid, [], 422, ['body: expected an object such as {"rps": 12.5}; names: latency_ms, rps']),
    ]
    for job_id, body, status, problems in cases:
        r = client.post(f"/v1/jobs/{job_id}/metrics", json=body)
        assert (r.status_code, r.json()["problems"]) == (status, problems)
    big = "1" + "0" * 400  # an int JSON reads but no float holds
    least = "body: rps: expected a number of at least 0, got"
    raw = [
        (big.join(['{"rps": ', "}"]), f"{least} {big[:40]}..."),
        ('{"rps": ' + "9" * 5000 + "}", "body: not valid JSON: Exceeds the limit"),
        ("[" * 100_000, "body: nested deeper than"),
    ]  # fmt: skip
    for text, start in raw:
        r = client.post(f"/v1/jobs/{sid}/metrics", content=text)
        assert r.status_code == 422 and r.json()["problems"][0].startswith(start), r.text
    r = client.post(f"/v1/jobs/{batch}/metrics", json={"rps": 1})
    assert r.status_code == 409 and "not a running service" in r.json()["error"]
    assert client.post("/v1/jobs/999/metrics", json={"rps": 1}).status_code == 404


@pytest.mark.parametrize(
    ("service", "problem"),
    [
        (
            {"min_replicas": 4, "max_replicas": 2},
            "request: service.min_replicas: 4 is more than max_replicas 2",
        ),
        ({"target": 0}, "request: service.target: must be more than 0, got 0"),
        (
            {"min_replicas": 0, "metric": "latency_ms"},
            "request: service.min_replicas: 0 needs metric rps: a latency is measured on a "
            "running replica, so a latency_ms service scaled to zero would never get a replica "
            "again; give at least 1",
        ),
        # `min_replicas: 0` alone scales to zero (an unsaid maximum is at least 1).
        (
            {"max_replicas": 0},
            "request: service.max_replicas: must be at least 1, got 0",
        ),
    ],
)
def test_bad_service_files_are_refused_and_nothing_is_created(
    client: TestClient, service: dict[str, Any], problem: str
) -> None:
    r = client.post("/v1/jobs", json={**SERVICE, "service": service})
    assert (r.status_code, r.json()["problems"]) == (422, [problem])
    assert client.get("/v1/jobs?all=true").json()["jobs"] == []


def test_a_pipeline_as_a_json_jobs_list(client: TestClient) -> None:
    body = {
        "jobs": [
            {"name": "prep", "command": "true"},
            {"name": "train", "command": "true", "depends_on": ["prep"]},
        ]
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    prep, train = (j["id"] for j in r.json()["jobs"])
    assert client.get(f"/v1/jobs/{train}").json()["depends_on"] == [
        {"job": prep, "condition": "success"}
    ]
    bad = client.post(
        "/v1/jobs", json={"jobs": [{"name": "a", "command": "x", "depends_on": ["zz"]}]}
    )
    assert (bad.status_code, bad.json()["problems"]) == (
        422,
        [
            "request: job 'a': depends_on.0: no job 'zz' (neither a job of this submission by "
            "name nor an existing job by id)"
        ],
    )


def test_the_autoscaler_takes_its_interval_and_metric_age_from_the_config(
    open_service: Callable[..., Service],
) -> None:
    svc = open_service(
        FakeExecutor([fake_node(gpus=1)]), autoscaler_interval="250ms", metric_max_age="3s"
    )
    assert svc.autoscaler is not None
    assert (svc.autoscaler.interval_s, svc.autoscaler.metric_max_age_s) == (0.25, 3.0)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("autoscaler_interval", "0s", "autoscaler_interval: must be a duration above 0"),
        ("metric_max_age", "soon", "metric_max_age: 'soon' is not a duration"),
        # A timer that long overflowed time_t: the autoscaler's thread died of it, and SIGTERM's
        # stop thread of a shutdown_grace as long.
        (
            "autoscaler_interval",
            "100000000d",
            "autoscaler_interval: '100000000d' is longer than 366 days",
        ),
        ("limits", {"shutdown_grace": "367d"}, "limits.shutdown_grace: '367d' is longer than 366"),
        ("cycle_interval", True, "cycle_interval: expected a duration such as 30s or 5m"),
        ("queues", [], "queues: no queue: no job could be submitted"),
        ("limits", 5, "limits: Input should be a mapping \\(key: value pairs\\)$"),
        ("node", "x", "node: Input should be a mapping"),  # a traceback (dict("x"))
        (
            "policy",
            5,
            "policy: expected a preset's name, a policy file or a policy mapping, got "
            "5 \\(an integer\\)$",
        ),
        # '0' turned the log cap off and was 1 MiB of /dev/shm; 1K was taken as 4K.
        ("limits", {"log_max_size": "0"}, "limits.log_max_size: '0' is below 4K"),
        ("limits", {"log_max_size": "1K"}, "limits.log_max_size: '1K' is below 4K"),
        ("limits", {"shm_max_size": "0"}, "limits.shm_max_size: '0' is below 1M"),
        # Refused later by discovery as `mem_mib: ...` and `cpus: ...`, without file or key.
        ("node", {"mem": "0"}, "node.mem: '0' is below 1M"),
        # A size without its unit: "a valid string" for a bare number, and the key said twice.
        ("node", {"gpu_mem": 8}, "node.gpu_mem: 8 has no unit: give a unit, e.g. 8G or 512M$"),
        ("node", {"mem": 8}, "node.mem: 8 has no unit"),
        (
            "queues",
            [{"name": "default", "guarantee": {"mem": "8"}}],
            "queues.0.guarantee.mem: '8' has no unit: give a unit, e.g. 8G or 512M$",
        ),
        ("node", {"cpus": 0.0001}, "node.cpus: must be at least 0.001, got 0.0001"),
        ("port", True, "port: expected a number, got true \\(a boolean\\)"),  # it listened on 1
        ("limits", {"log_max_files": True}, "limits.log_max_files: expected a number, got true"),
        # NaN was "less than or equal to 100000"; infinity was taken as no limit.
        ("node", {"cpus": float("nan")}, "node.cpus: nan is not a finite number"),
        ("limits", {"request_rate": float("inf")}, "limits.request_rate: inf is not a finite"),
        # Cycles back to back while a job waited: a core's quarter for nothing.
        ("cycle_interval", 0, "cycle_interval: 0 is below 0.1s: cycles would run back to back"),
        # Past what the store holds: it stopped every step of the loop at its first job.
        (
            "priority_classes",
            {"huge": 10**23},
            "priority_classes.huge: must be at most 1,000,000,000, got 1",
        ),
        ("limits", {"user_max_jobs": -1}, "limits.user_max_jobs: must be at least 0, got -1$"),
        ("limits", {"keep_ended": "-1d"}, "limits.keep_ended: '-1d' is negative"),
        ("data_dir", "/tmp/x\x00y", "data_dir: holds a NUL byte"),  # a traceback from mkdir
        # The regular expression itself was the message.
        ("advertise", "foo", "advertise: 'foo' is not an address clients can reach: give http"),
    ],
)
def test_bad_settings_name_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_config(None, {key: value})

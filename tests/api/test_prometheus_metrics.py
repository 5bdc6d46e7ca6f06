"""/metrics in process: the Prometheus naming conventions, the figures after real decisions, and
that the Grafana dashboard in docs/ asks only for metrics the service exports."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clients import client_for
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.testing.fakes import FakeExecutor

GRAFANA = Path(__file__).parents[2] / "docs" / "grafana" / "aisched.json"
UNITS = ("_seconds", "_bytes", "_ratio", "_gpus", "_cpu_cores", "_jobs", "_info")
# Conditions, 1 or 0, unitless like Prometheus's own `up`.
CONDITIONS = ("aisched_ready", "aisched_disk_pressure", "aisched_leader")
# Plain numbers without a unit: the leader's term is a generation count (the fencing token).
NUMBERS = ("aisched_leader_term",)
# One series per resource, the unit in the `resource` label's value (`gpus`, `cpu_cores`,
# `memory_bytes`), as kube-state-metrics' quota metrics, so that usage and limit divide.
PER_RESOURCE = ("aisched_queue_user_limit", "aisched_queue_user_allocated")


def wait(client: TestClient, job_id: str, state: str) -> None:
    deadline = time.monotonic() + 10
    while client.get(f"/v1/jobs/{job_id}").json()["state"] != state:
        assert time.monotonic() < deadline, f"job {job_id} never became {state}"
        time.sleep(0.02)


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_names_follow_the_prometheus_conventions(client: TestClient) -> None:
    families = list(text_string_to_metric_families(client.get("/metrics").text))
    assert families
    for f in families:
        if f.name.endswith("_created"):
            continue  # the client library's creation timestamps of counters and histograms
        assert f.name.startswith("aisched_"), f.name
        assert re.fullmatch(r"[a-z_]+", f.name), f.name
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
        else:
            assert not f.name.endswith("_total"), f.name
            unitless = f.name == "aisched_jobs" or f.name in CONDITIONS + NUMBERS + PER_RESOURCE
            assert f.name.endswith(UNITS) or unitless, f"{f.name}: no unit"


def test_figures_follow_what_the_scheduler_did(client: TestClient, fx: FakeExecutor) -> None:
    jid = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 3}}).json()["id"]
    wait(client, jid, "running")
    got = samples(client)
    assert got[("aisched_jobs", (("state", "running"),))] == 1
    assert got[("aisched_jobs", (("state", "pending"),))] == 0
    assert got[("aisched_jobs_submitted_total", ())] == 1
    assert got[("aisched_queue_allocated_gpus", (("queue", "default"),))] == 3
    ratios = sorted(
        (dict(labels)["gpu"], v)
        for (name, labels), v in got.items()
        if name == "aisched_gpu_allocated_ratio"
    )
    assert ratios == [("0", 1.0), ("1", 1.0), ("2", 1.0), ("3", 0.0)]
    delay = ("aisched_job_queueing_delay_seconds_count", (("queue", "default"),))
    assert got[delay] == 1
    fx.exit(fx.keys(jid)[0], 0)
    fx._wakeup and fx._wakeup()
    wait(client, jid, "succeeded")
    got = samples(client)
    assert got[("aisched_jobs_finished_total", (("state", "succeeded"),))] == 1
    assert got[("aisched_jobs_submitted_total", ())] == 1
    assert got[("aisched_allocated_gpus", ())] == 0
    # The predictor scored its one answer: the prior (an hour, upper bound four hours) for a
    # job that ran under a second (counted as one): covered, and 3,600 times off.
    assert got[("aisched_predictor_scored_jobs", ())] == 1
    assert got[("aisched_predictor_coverage_ratio", ())] == 1.0
    assert round(got[("aisched_predictor_median_error_ratio", ())], 6) == 3600.0


def test_preemptions_are_counted(tmp_path: Path, fx: FakeExecutor) -> None:
    cfg = load_config(None, {"data_dir": str(tmp_path), "cycle_interval": "0.2s"})
    svc = Service.open(cfg, executor=fx)
    svc.start()
    try:
        client = client_for(svc)
        low = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 4}})
        wait(client, low.json()["id"], "running")
        high = client.post(
            "/v1/jobs", json={"command": ["x"], "resources": {"gpus": 4}, "priority": 10}
        )
        wait(client, high.json()["id"], "running")
        assert samples(client)[("aisched_preemptions_total", ())] == 1
    finally:
        svc.close()


def test_shrinks_are_counted(tmp_path: Path, fx: FakeExecutor) -> None:
    cfg = load_config(None, {"data_dir": str(tmp_path), "cycle_interval": "0.2s"})
    svc = Service.open(cfg, executor=fx)
    svc.start()
    try:
        client = client_for(svc)
        el = client.post(
            "/v1/jobs",
            json={
                "command": ["x"],
                "replicas": 4,
                "min_available": 1,
                "elastic": True,
                "resources": {"gpus": 1},
            },
        )
        wait(client, el.json()["id"], "running")
        other = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 2}})
        wait(client, other.json()["id"], "running")
        got = samples(client)
        assert got[("aisched_shrinks_total", ())] == 1
        assert got[("aisched_preemptions_total", ())] == 0
        shown = client.get(f"/v1/jobs/{el.json()['id']}").json()
        assert (shown["state"], shown["running_tasks"], shown["preemptions"]) == ("running", 2, 0)
    finally:
        svc.close()


def test_each_users_holding_against_a_queues_user_limit(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    queues = [
        {"name": "default"},
        {"name": "org", "user_limit": {"gpus": 2, "cpus": 2}},
        {"name": "team", "parent": "org"},
    ]
    svc = open_service(fx, queues=queues)
    # Two users with accounts here (a job is refused for a user who has none).
    alice, bob, admin = client_for(svc, "daemon"), client_for(svc, "nobody"), client_for(svc)

    def run(client: TestClient, queue: str) -> str:
        body = {"command": ["x"], "queue": queue, "resources": {"gpus": 1, "cpus": 0.5}}
        r = client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    # One user's jobs in org and in team under it count against org's limit together; the
    # other's job in default holds nothing against any user limit.
    for jid in (run(alice, "org"), run(alice, "team"), run(bob, "team"), run(bob, "default")):
        wait(admin, jid, "running")
    got = samples(admin)

    def series(name: str) -> dict[tuple[str, ...], float]:
        return {
            tuple(v for _, v in labels): value for (n, labels), value in got.items() if n == name
        }

    # Labels in name order: queue, resource (, user). Only the resources the limit caps.
    assert series("aisched_queue_user_limit") == {("org", "gpus"): 2, ("org", "cpu_cores"): 2}
    assert series("aisched_queue_user_allocated") == {
        ("org", "gpus", "daemon"): 2,
        ("org", "cpu_cores", "daemon"): 1,
        ("org", "gpus", "nobody"): 1,
        ("org", "cpu_cores", "nobody"): 0.5,
    }


def _grafana_metrics(doc: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for panel in doc["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"\baisched_[a-z_]+", target["expr"]))
    return names


def test_the_grafana_dashboard_uses_only_exported_metrics(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    # A queue with a user limit, so that its series exist too.
    svc = open_service(fx, queues=[{"name": "default", "user_limit": {"gpus": 2}}])
    client = client_for(svc)
    jid = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 1}}).json()["id"]
    wait(client, jid, "running")  # so that labelled series (queueing delay) exist
    exported = {name for name, _ in samples(client)}
    used = _grafana_metrics(json.loads(GRAFANA.read_text()))
    assert used and used <= exported, sorted(used - exported)

"""The dashboard's page and JSON in process, over the real app, store and loop thread, with the
fake executor standing in for processes (the browser test drives the real service)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from typing import Any

from clients import client_for
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy import event

from aisched.cli.top import frame
from aisched.service.app import Service
from aisched.service.dashboard import (
    JobGpus,
    UtilisationRing,
    UtilisationSample,
    dashboard_document,
    start_sampler,
)
from aisched.testing.fakes import FakeExecutor, fake_node

QUEUES = {
    "queues": [
        {"name": "research", "guarantee": {"gpus": 1}, "borrowing": True},
        {"name": "prod", "guarantee": {"gpus": 3}},
    ]
}


def submit(client: TestClient, gpus: float, **extra: Any) -> str:
    r = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": gpus}, **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def wait_for(client: TestClient, what: str, check: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        doc: dict[str, Any] = client.get("/v1/dashboard").json()
        if check(doc):
            return doc
        assert time.monotonic() < deadline, f"{what}: {doc}"
        time.sleep(0.02)


def gpus_of(doc: dict[str, Any]) -> list[tuple[int, str, list[str]]]:
    (rack,) = doc["racks"]
    (node,) = rack["nodes"]
    return [(g["index"], g["state"], [u["job"] for u in g["users"]]) for g in node["gpus"]]


def test_the_page_and_its_files_ship_with_the_package(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    # Nothing is fetched from elsewhere: every script and stylesheet is the service's own.
    assert 'src="static/dashboard.js"' in page.text
    assert "http://" not in page.text and "https://" not in page.text
    js = client.get("/static/dashboard.js")
    assert js.status_code == 200 and "v1/dashboard" in js.text
    assert client.get("/static/dashboard.css").status_code == 200
    assert client.get("/static/..%2Fapi.py").status_code == 404


def test_running_job_on_its_gpus_and_a_waiting_job_with_its_reason(client: TestClient) -> None:
    big = submit(client, 3, name="train")
    doc = wait_for(client, "the job on its GPUs", lambda d: d["summary"]["jobs"]["running"] == 1)
    assert gpus_of(doc) == [
        (0, "used", [big]),
        (1, "used", [big]),
        (2, "used", [big]),
        (3, "free", []),
    ]
    assert doc["racks"][0]["nodes"][0]["gpus"][0]["users"][0]["name"] == "train"
    waiting = submit(client, 2, name="eval")
    doc = wait_for(
        client,
        "a reason for the waiting job",
        # "not-considered" is the reason until its first cycle has looked at it (then it
        # changes, so comparing it with a later read would be a race).
        lambda d: d["pending"] and d["pending"][0]["reason_code"] not in ("", "not-considered"),
    )
    (p,) = doc["pending"]
    assert (p["id"], p["name"], p["gpus"]) == (waiting, "eval", 2.0)
    shown = client.get(f"/v1/jobs/{waiting}").json()
    assert (p["reason_code"], p["reason"]) == (shown["reason_code"], shown["reason"])
    assert p["reason"]
    assert [(j["id"], j["state"]) for j in doc["timeline"]] == [
        (big, "running"),
        (waiting, "pending"),
    ]
    running, pending = doc["timeline"]
    [(start, end)] = running["runs"]  # its one attempt, from its task's start, still running
    assert start >= running["started_at"] and end is None and pending["runs"] == []
    (q,) = doc["queues"]
    assert (q["name"], q["used_gpus"], q["running"], q["pending"]) == ("default", 3.0, 1, 1)
    assert q["borrowed_gpus"] == 0.0  # the only queue owns the cluster
    assert doc["summary"]["gpus"] == {"used": 3.0, "total": 4.0}
    assert doc["errors"] == []


def spec_reads(svc: Service, build: Callable[[], Any]) -> list[list[Any]]:
    """What `build` asks the store for jobs' documents (`spec`) on this thread: the parameters
    (job ids) of each statement that selects that column."""
    me = threading.get_ident()
    seen: list[list[Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        selected = statement.partition(" FROM ")[0]
        if threading.get_ident() == me and "spec" in selected:
            seen.append(list(params.values() if isinstance(params, dict) else params))

    event.listen(svc.store.engine, "before_cursor_execute", record)
    try:
        build()
    finally:
        event.remove(svc.store.engine, "before_cursor_execute", record)
    return seen


def test_a_poll_reads_no_jobs_document_but_once_for_an_ended_job(
    svc: Service, fx: FakeExecutor, client: TestClient
) -> None:
    # A user may make each job's document megabytes long: a poll must not read them to show
    # each job's GPUs. Live jobs' GPUs are in the scheduler; an ended job's document is read
    # once, then remembered.
    ended = submit(client, 1, name="ended")
    # The job reads running once its intent is committed; its task is launched right after.
    wait_for(
        client,
        "ended running and launched",
        lambda d: d["summary"]["jobs"]["running"] == 1 and bool(fx.keys(ended)),
    )
    fx.exit(fx.keys(ended)[0], 0)
    wait_for(client, "ended ended", lambda d: d["summary"]["jobs"].get("succeeded") == 1)
    running = submit(client, 3, name="running")
    waiting = submit(client, 2, name="waiting")
    wait_for(
        client,
        "one running, one waiting",
        lambda d: (d["summary"]["jobs"]["running"], d["summary"]["jobs"]["pending"]) == (1, 1),
    )
    assert ended not in svc.scheduler.jobs
    gpus = JobGpus()
    docs: list[dict[str, Any]] = []

    def build() -> None:
        docs.append(dashboard_document(svc, UtilisationRing(), time.time(), gpus=gpus))

    assert spec_reads(svc, build) == [[ended]]
    assert spec_reads(svc, build) == []
    for doc in docs:
        assert doc["errors"] == []
        assert [(p["id"], p["gpus"]) for p in doc["pending"]] == [(waiting, 2.0)]
        assert [(j["id"], j["gpus"]) for j in doc["timeline"]] == [
            (ended, 1.0),
            (running, 3.0),
            (waiting, 2.0),
        ]


def test_shared_gpus_are_marked_shared(client: TestClient) -> None:
    a = submit(client, 0.5)
    b = submit(client, 0.5)
    doc = wait_for(client, "both running", lambda d: d["summary"]["jobs"]["running"] == 2)
    assert gpus_of(doc) == [
        (0, "shared", [a, b]),
        (1, "free", []),
        (2, "free", []),
        (3, "free", []),
    ]


def test_queues_show_guarantee_usage_and_borrowed(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    client = client_for(open_service(fx, **QUEUES))
    submit(client, 3, queue="research")
    doc = wait_for(client, "research running", lambda d: d["summary"]["jobs"]["running"] == 1)
    by_name = {q["name"]: q for q in doc["queues"]}
    r, p = by_name["research"], by_name["prod"]
    assert (r["guarantee_gpus"], r["used_gpus"], r["borrowed_gpus"]) == (1.0, 3.0, 2.0)
    assert r["share"] == 0.75
    assert (p["guarantee_gpus"], p["used_gpus"], p["borrowed_gpus"]) == (3.0, 0.0, 0.0)


def test_a_child_queue_inside_its_parents_guarantee_has_borrowed_nothing(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    """train has no guarantee of its own; org's 3 GPUs cover it. Its GPUs were all shown as
    borrowed (usage minus its own guarantee, 0), though reclaim takes none of them back; the
    dashboard and `/v1/queues` (`aisched queues`) now say what reclaim would take."""
    queues = [
        {"name": "org", "guarantee": {"gpus": 3}},
        {"name": "train", "parent": "org"},
        {"name": "scratch"},
    ]
    client = client_for(open_service(fx, queues=queues))
    submit(client, 2, queue="train")
    submit(client, 1, queue="train")
    submit(client, 1, queue="scratch")
    doc = wait_for(client, "all running", lambda d: d["summary"]["jobs"]["running"] == 3)
    shown = {q["name"]: (q["used_gpus"], q["borrowed_gpus"]) for q in doc["queues"]}
    assert shown == {"org": (3.0, 0.0), "train": (3.0, 0.0), "scratch": (1.0, 1.0)}
    listed = client.get("/v1/queues").json()["queues"]
    assert {q["name"]: (q["used"]["gpus"], q["borrowed"]["gpus"]) for q in listed} == shown


def test_queues_show_each_users_holding_against_the_per_user_limit(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    queues = [{"name": "default"}, {"name": "team", "user_limit": {"gpus": 2}}]
    svc = open_service(fx, queues=queues)
    # Two users with accounts here (a job is refused for a user who has none).
    first, second = client_for(svc, "daemon"), client_for(svc, "nobody")
    for client in (first, first, second):
        submit(client, 1, queue="team")
    waiting = submit(first, 1, queue="team")
    doc = wait_for(
        client_for(svc),
        "three running, one held by its user's limit",
        lambda d: (
            d["summary"]["jobs"]["running"] == 3
            and d["pending"]
            and d["pending"][0]["reason_code"] == "wait-queue"
        ),
    )
    assert doc["pending"][0]["id"] == waiting
    by_name = {q["name"]: q for q in doc["queues"]}
    assert (by_name["default"]["user_limit"], by_name["default"]["users"]) == (None, [])
    team = by_name["team"]
    assert team["user_limit"] == {"gpus": 2.0}  # only what the limit caps
    assert team["users"] == [
        {"user": "daemon", "others": False, "gpus": 2.0, "at_limit": True},
        {"user": "nobody", "others": False, "gpus": 1.0, "at_limit": False},
    ]


def test_utilisation_samples_and_since(client: TestClient) -> None:
    first = client.get("/v1/dashboard").json()["utilisation"]
    assert len(first) == 1 and first[0]["gpus_total"] == 4.0
    later = client.get("/v1/dashboard", params={"since": first[-1]["time"]}).json()
    assert all(s["time"] > first[-1]["time"] for s in later["utilisation"])


def test_the_ring_keeps_only_the_newest_samples() -> None:
    ring = UtilisationRing(size=3)
    for t in range(5):
        ring.add(UtilisationSample(float(t), 0, 4, 0, 16, 0, 1, 0, 0))
    assert [s.time for s in ring.samples()] == [2.0, 3.0, 4.0]


def test_odd_state_costs_one_section_not_the_page(svc: Service, client: TestClient) -> None:
    # A usage entry for a queue that does not exist, with a value that is not a triple.
    svc.scheduler.usage[("ghost", "nobody")] = "garbage"  # type: ignore[assignment]
    try:
        r = client.get("/v1/dashboard")
        assert r.status_code == 200
        doc = r.json()
        assert doc["queues"] == [] and doc["errors"][0].startswith("queues: ")
        assert doc["racks"] and doc["summary"]["gpus"]["total"] == 4.0
    finally:
        del svc.scheduler.usage[("ghost", "nobody")]
    assert client.get("/v1/dashboard").json()["errors"] == []


def test_the_sampler_fills_the_ring_until_the_scheduler_stops(
    open_service: Callable[..., Service],
) -> None:
    svc = open_service(FakeExecutor([fake_node(gpus=2)]))
    ring = UtilisationRing()
    try:
        thread = start_sampler(svc.scheduler, ring, interval_s=0.01)
        deadline = time.monotonic() + 10
        while len(ring.samples()) < 3:
            assert time.monotonic() < deadline, "no samples"
            time.sleep(0.01)
        assert {(s.gpus_total, s.cpus_total) for s in ring.samples()} == {(2.0, 16.0)}
    finally:
        svc.close()
    thread.join(10)
    assert not thread.is_alive()


def test_queues_show_the_highest_priority_their_users_may_ask_for(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    queues = [
        {"name": "default"},
        {"name": "team", "max_priority": 50},
        {"name": "team-a", "parent": "team"},  # the nearest cap above it
        {"name": "team-b", "parent": "team", "max_priority": 10},
    ]
    client = client_for(open_service(fx, queues=queues))
    want = {"default": 0, "team": 50, "team-a": 50, "team-b": 10}
    listed = client.get("/v1/queues").json()["queues"]
    assert {q["name"]: q["max_priority"] for q in listed} == want
    shown = client.get("/v1/dashboard").json()["queues"]
    assert {q["name"]: q["max_priority"] for q in shown} == want


def test_a_parent_queue_counts_its_childrens_jobs_as_it_counts_their_usage(
    open_service: Callable[..., Service], fx: FakeExecutor
) -> None:
    """`aisched queues` showed a parent's usage of its children's running jobs beside 0 pending
    and 0 running."""
    queues = [
        {"name": "default"},
        {"name": "team"},
        {"name": "team-a", "parent": "team"},
        {"name": "team-b", "parent": "team"},
    ]
    client = client_for(open_service(fx, queues=queues))
    submit(client, 4, queue="team-a")
    wait_for(client, "the first job running", lambda d: d["summary"]["jobs"]["running"] == 1)
    submit(client, 1, queue="team-b")
    wait_for(client, "the second one waiting", lambda d: d["summary"]["jobs"]["pending"] == 1)
    listed = client.get("/v1/queues").json()["queues"]
    got = {q["name"]: (q["pending"], q["running"], q["used"]["gpus"]) for q in listed}
    assert got == {
        "default": (0, 0, 0.0),
        "team": (1, 1, 4.0),
        "team-a": (0, 1, 4.0),
        "team-b": (1, 0, 0.0),
    }


def test_waiting_jobs_are_the_longest_waiting_first_and_the_rest_are_counted(
    client: TestClient,
) -> None:
    # 207 waiting behind a job on every GPU: the 200 newest were read and then sorted, so the
    # 7 that had waited longest (the one holding the reservation among them) were missing.
    submit(client, 4, name="all")
    wait_for(client, "the first job running", lambda d: d["summary"]["jobs"]["running"] == 1)
    waiting = [submit(client, 1, name=f"w{i}") for i in range(207)]
    doc = wait_for(client, "207 waiting", lambda d: d["summary"]["jobs"]["pending"] == 207)
    assert [j["id"] for j in doc["pending"]] == waiting[:200]
    assert doc["pending_more"] == 7
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(frame(doc))
    assert "and 7 more waiting jobs, submitted later" in console.export_text()

"""Two service instances on one real PostgreSQL database (in process, over one fake executor
that plays the tasks both can see): one leads, the other serves reads and refuses changes
naming the leader, takes over when the leader stops, and a deposed leader stops at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from clients import client_for
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from aisched.model.cluster import Node
from aisched.service.app import Service, ServiceError
from aisched.service.config import load_config
from aisched.service.leader import Role
from aisched.store.db import Store, normalize_url
from aisched.store.lease import try_acquire
from aisched.store.schema import SCHEMA_VERSION
from aisched.testing.fakes import FakeExecutor, fake_node
from aisched.testing.postgres import PostgresServer

Open = Callable[[str], Service]
FAST = {"lease_ttl": "1s", "lease_renew": "0.1s", "lease_poll": "0.1s"}


@dataclass
class PausingExecutor(FakeExecutor):
    """Holds the loop at the start of a step (reading the nodes) once `pause` is set, until
    `resume` is: a leader stopped there as by SIGSTOP, with its API still taking requests."""

    pause: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)

    def nodes(self) -> Sequence[Node]:
        if self.pause.is_set():
            self.held.set()
            self.resume.wait(30)
            self.pause.clear()
        return super().nodes()


@pytest.fixture
def fx() -> PausingExecutor:
    return PausingExecutor([fake_node(gpus=4)])


@pytest.fixture
def instance(tmp_path: Path, pg_server: PostgresServer, fx: FakeExecutor) -> Iterator[Open]:
    """`instance(address)` starts one more instance on the shared database and data dir."""
    url = pg_server.create_database()
    opened: list[Service] = []

    def start(address: str) -> Service:
        base = {"data_dir": str(tmp_path), "cycle_interval": "0.2s", "database": url}
        svc = Service.open(load_config(None, {**base, **FAST}), executor=fx)
        opened.append(svc)
        svc.start(address=address)
        return svc

    yield start
    for svc in reversed(opened):
        svc.close()


def until(what: str, check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def leader_metrics(text: str) -> dict[str, float]:
    want = ("aisched_leader", "aisched_leader_term", "aisched_takeovers_total")
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in want
    }


def test_the_standby_reads_the_leaders_jobs_and_names_it_for_changes(instance: Open) -> None:
    a = instance("http://a.test:1")
    b = instance("http://b.test:2")
    ca, cb = client_for(a), client_for(b)
    assert ca.get("/v1/healthz").json() == {
        "ok": True,
        "role": "leader",
        "term": 1,
        "leader": "http://a.test:1",
    }
    assert cb.get("/v1/healthz").json() == {
        "ok": True,
        "role": "standby",
        "term": 1,
        "leader": "http://a.test:1",
    }
    job = ca.post("/v1/jobs", json={"command": ["sleep", "60"]}).json()
    until("the job to run", lambda: ca.get(f"/v1/jobs/{job['id']}").json()["state"] == "running")
    assert cb.get(f"/v1/jobs/{job['id']}").json()["state"] == "running"  # from the database
    refused = cb.post("/v1/jobs", json={"command": ["true"]})
    assert (refused.status_code, refused.headers["aisched-leader"]) == (421, "http://a.test:1")
    assert refused.json() == {
        "error": "this instance is a standby: the leader is http://a.test:1 (term 1); send "
        "changes there",
        "problems": [],
        "leader": "http://a.test:1",
    }
    assert cb.post(f"/v1/jobs/{job['id']}/cancel").status_code == 421
    ready = cb.get("/v1/readyz")
    assert (ready.status_code, ready.json()["ready"], ready.json()["problems"]) == (
        503,
        False,
        [refused.json()["error"]],
    )
    assert ca.get("/v1/readyz").status_code == 200
    assert leader_metrics(ca.get("/metrics").text) == {
        "aisched_leader": 1.0,
        "aisched_leader_term": 1.0,
        "aisched_takeovers_total": 0.0,
    }
    assert leader_metrics(cb.get("/metrics").text) == {
        "aisched_leader": 0.0,
        "aisched_leader_term": 1.0,
        "aisched_takeovers_total": 0.0,
    }
    assert [j["id"] for j in cb.get("/v1/jobs", params={"all": "true"}).json()["jobs"]] == [
        job["id"]
    ]


def test_the_standby_takes_over_when_the_leader_stops_and_adopts_its_task(
    instance: Open, fx: FakeExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    a = instance("http://a.test:1")
    b = instance("http://b.test:2")
    ca, cb = client_for(a), client_for(b)
    job = ca.post("/v1/jobs", json={"command": ["sleep", "60"]}).json()
    # Running once its intent is committed; launched by the leader right after.
    until("the job to run", lambda: ca.get(f"/v1/jobs/{job['id']}").json()["state"] == "running")
    until("its task to be launched", lambda: bool(fx.launched))
    launched = list(fx.launched)
    a.close()  # resigns: the standby need not wait for the lease
    until("the takeover", lambda: b.leadership.leading)
    # Its lease was given back, not let expire: the log said "had expired" of both.
    assert "took over as leader in term 2 (http://a.test:1 gave the lease back)" in [
        r.getMessage() for r in caplog.records
    ]
    assert cb.get("/v1/healthz").json() == {
        "ok": True,
        "role": "leader",
        "term": 2,
        "leader": "http://b.test:2",
    }
    until("the adoption", lambda: b.scheduler.thread is not None)
    events = [e["kind"] for e in cb.get(f"/v1/jobs/{job['id']}").json()["events"]]
    assert events[-1] == "adopted"
    assert fx.launched == launched  # adopted, not started again
    fx.exit(fx.launched[-1].key, 0)
    until(
        "the end seen by the new leader",
        lambda: cb.get(f"/v1/jobs/{job['id']}").json()["state"] == "succeeded",
    )
    assert cb.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
    assert leader_metrics(cb.get("/metrics").text) == {
        "aisched_leader": 1.0,
        "aisched_leader_term": 2.0,
        "aisched_takeovers_total": 1.0,
    }


def test_a_leader_whose_lease_was_taken_stops_at_once_and_writes_nothing(
    instance: Open,
) -> None:
    a = instance("http://a.test:1")
    ca = client_for(a)
    why: list[str] = []
    a.on_deposed = why.append
    with a.store.lease_tx() as conn:  # another instance takes the lease (a long pause of a's)
        try_acquire(conn, "intruder", "http://c.test:3", 30.0, force=True)
    until("the deposition", lambda: why)
    assert why == ["deposed: term 2 belongs to http://c.test:3 (this instance led term 1)"]
    assert ca.get("/v1/healthz").json() == {
        "ok": False,
        "role": "deposed",
        "term": 2,
        "leader": "http://c.test:3",
    }
    refused = ca.post("/v1/jobs", json={"command": ["true"]})
    assert refused.status_code == 421
    assert refused.json()["leader"] == "http://c.test:3"
    until("the loop to stop", lambda: not a.scheduler.thread or not a.scheduler.thread.is_alive())


def test_a_change_in_flight_when_the_leader_is_deposed_is_sent_to_the_new_leader(
    instance: Open, fx: PausingExecutor
) -> None:
    """A submission the gate let in, queued for a loop that then found itself deposed: it was
    not stored, and its sender is told where the leader is (421), not left waiting."""
    a = instance("http://a.test:1")
    ca = client_for(a)
    fx.pause.set()
    until("the loop to be held", fx.held.is_set)
    answers: list[Any] = []
    sender = threading.Thread(
        target=lambda: answers.append(ca.post("/v1/jobs", json={"command": ["true"]})),
        daemon=True,
    )
    sender.start()
    until("the submission to be queued", lambda: a.scheduler.commands.qsize() == 1)
    why: list[str] = []
    a.on_deposed = why.append
    with a.store.lease_tx() as conn:
        try_acquire(conn, "intruder", "http://c.test:3", 30.0, force=True)
    until("the deposition", lambda: why)
    fx.resume.set()  # the step goes on: its write of the submission is refused (term 2)
    sender.join(20)
    assert answers, "the submission was left waiting for a loop that had stopped"
    refused = answers[0]
    assert refused.status_code == 421
    assert refused.json()["leader"] == "http://c.test:3"
    assert refused.headers["aisched-leader"] == "http://c.test:3"
    assert ca.get("/v1/jobs", params={"all": "true"}).json()["jobs"] == []


def test_a_data_directory_is_shared_only_by_instances_of_one_database(
    tmp_path: Path, pg_server: PostgresServer, fx: FakeExecutor
) -> None:
    """An instance of another database beside them led too, and its job ids collided with
    theirs in one data directory (tasks, logs, checkpoints)."""
    first, other = pg_server.create_database(), pg_server.create_database()

    def open_on(url: str) -> Service:
        return Service.open(load_config(None, {"data_dir": str(tmp_path), "database": url}), fx)

    a = open_on(first)
    b = open_on(first)  # of the same database: shared
    with pytest.raises(ServiceError) as err:
        open_on(other)
    with Store(other) as store:
        theirs = store.instance_id()
    assert str(err.value) == (
        f"the data directory {tmp_path} is in use by instances of another state database "
        f"(its id {a.store.instance_id()}, this one's {theirs}): instances share a data "
        "directory only with one database; give this one a --data-dir of its own"
    )
    with pytest.raises(ServiceError) as err:  # an SQLite instance: "(pid another process)"
        Service.open(load_config(None, {"data_dir": str(tmp_path)}), fx)
    assert str(err.value) == (
        f"the data directory {tmp_path} is in use by running aisched instances of a shared "
        "database (they write no pid); stop them, or give another --data-dir"
    )
    a.close()
    # b still holds the directory: it kept its part of the lock while it looked at a's (a
    # failed upgrade of a shared flock to an exclusive one drops the shared one).
    with pytest.raises(ServiceError):
        Service.open(load_config(None, {"data_dir": str(tmp_path)}), fx)
    b.close()
    alone = open_on(other)  # once they are gone, the directory may move to another database
    alone.close()


def _open(tmp_path: Path, url: str, address: str) -> tuple[Service, list[str]]:
    """An instance on its own data directory, standing by behind a lease the test holds for a
    minute; with the lines it was deposed with."""
    with Store(url) as store, store.lease_tx() as conn:
        try_acquire(conn, "other", "http://other.test:9", 60.0, force=True)
    config = {"data_dir": str(tmp_path / "b"), "cycle_interval": "0.2s", "database": url}
    svc = Service.open(load_config(None, {**config, **FAST}), executor=FakeExecutor([fake_node()]))
    why: list[str] = []
    svc.on_deposed = why.append
    svc.start(address=address)
    assert svc.leadership.role == Role.STANDBY
    return svc, why


def _engine(url: str) -> Engine:
    return create_engine(normalize_url(url), poolclass=NullPool)


def _give_back(url: str) -> None:
    """The test's lease given back, as by a leader that stopped."""
    with _engine(url).begin() as conn:
        conn.execute(text("UPDATE leader SET expires_at = 0 WHERE holder = 'other'"))


def test_a_standby_stops_rather_than_take_over_a_database_a_newer_aisched_migrated(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    """An older standby stood by on after a newer aisched migrated the database, then took
    over and failed on the first row it could not read, telling to delete it. It reads the
    schema's version before each try for the lease: past its own, it stops, leading never."""
    url = pg_server.create_database()
    b, why = _open(tmp_path, url, "http://b.test:2")
    try:
        with _engine(url).begin() as conn:  # a newer aisched migrated it
            conn.execute(
                text("UPDATE meta SET value = :v WHERE key = 'schema'"),
                {"v": str(SCHEMA_VERSION + 1)},
            )
        _give_back(url)
        until("the refusal", lambda: why)
        assert why == [
            f"the state database was migrated to schema version {SCHEMA_VERSION + 1} by a "
            f"newer aisched (this one reads up to {SCHEMA_VERSION}), and this instance could "
            "not lead it"
        ]
        assert b.leadership.then == (
            "stopped; upgrade this instance's aisched, then start it again (docs/ha.md)"
        )
        assert b.leadership.role == Role.DEPOSED
        with _engine(url).connect() as conn:
            assert conn.execute(text("SELECT holder, term FROM leader")).one() == ("other", 1)
    finally:
        b.close()


def test_a_takeover_whose_recovery_loses_its_connection_stands_by_and_takes_over_again(
    tmp_path: Path, pg_server: PostgresServer
) -> None:
    """A connection terminated while the new leader recovered ended that instance (deposed,
    `aisched up` exit 3), and then no instance led. A failure of the connection now gives the
    lease up to lapse; the instance stands by and, once it is free, takes it and leads."""
    url = pg_server.create_database()
    b, why = _open(tmp_path, url, "http://b.test:2")
    engine = _engine(url)
    try:
        with engine.connect() as holder:
            # Recovery's first read of the jobs waits on this lock: there, its connection is
            # terminated, as by a server restarting or an administrator.
            holder.execute(text("BEGIN"))
            holder.execute(text("LOCK TABLE jobs, tasks, events IN ACCESS EXCLUSIVE MODE"))
            _give_back(url)

            def waiting() -> list[int]:
                with engine.connect() as conn:
                    return list(
                        conn.execute(
                            text(
                                "SELECT pid FROM pg_stat_activity WHERE datname = "
                                "current_database() AND wait_event_type = 'Lock'"
                            )
                        ).scalars()
                    )

            for pid in until("the recovery to wait on the lock", waiting):
                holder.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            holder.execute(text("ROLLBACK"))
        until("the new leader's loop", lambda: b.leadership.leading and b.scheduler.thread)
        assert why == []
        assert b.leadership.term == 3  # term 2 was given up, lapsed, and taken again
        cb = client_for(b)
        assert cb.post("/v1/jobs", json={"command": ["true"]}).status_code == 201
    finally:
        engine.dispose()
        b.close()

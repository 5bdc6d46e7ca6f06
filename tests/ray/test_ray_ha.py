"""High availability on a real Ray cluster: two `aisched up --ray` instances sharing a real
PostgreSQL database and a data directory (the Ray namespace of the tasks' actors follows from
its path); kill -9 of the leader while a gang runs as detached actors: the standby takes over
and adopts both actors by name, and the gang ends once, never started again."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from harness import Service, free_port, wait_for
from ray_harness import RayCluster, cancel_all
from test_ray_service import env_of, events, submit

from aisched.testing.postgres import PostgresServer

pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

LEASE = "lease_ttl: 4s\nlease_renew: 1s\nlease_poll: 0.5s\n"


def test_the_standby_adopts_the_gang_of_a_killed_leader_through_its_actors(
    tmp_path: Path, ray_cluster: RayCluster, pg_server: PostgresServer
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "ha.yaml").write_text(LEASE)
    args = ["--ray", ray_cluster.address, "--database", pg_server.create_database()]
    args += ["--config", str(home / "ha.yaml")]
    a = Service(home, free_port(), work, args)
    b = Service(home, free_port(), work, args)
    a.log, b.log = home / "a.log", home / "b.log"
    try:
        a.start(timeout_s=90)
        b.start(timeout_s=90)
        jid = submit(a, "ha-gang", replicas=2, topology={"spread": "node"})
        for r in range(2):
            env_of(a, jid, r)
        a.kill9()  # its tasks are detached actors: they keep running

        def leads() -> bool:
            try:
                return httpx.get(f"{b.url}/v1/healthz", timeout=2).json()["role"] == "leader"
            except httpx.HTTPError:
                return False

        wait_for("the standby to lead", leads, 30)
        wait_for("the adoption", lambda: b.job(jid)["events"][-1]["kind"] == "adopted", 60)
        job = b.job(jid)
        assert (job["state"], job["attempt"]) == ("running", 1)
        assert [e["kind"] for e in job["events"]].count("adopted") == 2
        (work / "release").touch()
        job = b.wait_state(jid, "succeeded", "failed", timeout_s=60)
        assert job["state"] == "succeeded", job["events"]
        assert [e["kind"] for e in job["events"]].count("started") == 1
        assert sorted(events(b)) == ["start 0 0", "start 1 0"]  # once each, never stopped
    finally:
        for svc in (b, a):
            if svc.proc is not None and svc.proc.poll() is None:
                cancel_all(svc)
                svc.stop()

"""High availability on a real Ray cluster: two `aisched up --ray` instances sharing a real
PostgreSQL database and a data directory (the Ray namespace of the tasks' actors follows from
its path); kill -9 of the leader while a gang runs as detached actors: the standby takes over
and adopts both actors by name, and the gang ends once, never started again. A leader paused
between committing a gang's launch and making it: the standby runs the gang, the old leader's
late launch starts nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from harness import Service, free_port, stopped, wait_for
from ray_harness import RayCluster, cancel_all, kill_agents, wait_until_ray_holds_none_of
from test_ray_service import env_of, events, submit

from aisched.testing.postgres import PostgresServer

pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

LEASE = "lease_ttl: 4s\nlease_renew: 1s\nlease_poll: 0.5s\n"


def pair(tmp_path: Path, ray_cluster: RayCluster, pg_server: PostgresServer) -> list[Service]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "ha.yaml").write_text(LEASE)
    args = ["--ray", ray_cluster.address, "--database", pg_server.create_database()]
    args += ["--config", str(home / "ha.yaml")]
    a = Service(home, free_port(), work, args)
    b = Service(home, free_port(), work, args)
    a.log, b.log = home / "a.log", home / "b.log"
    return [a, b]


def leads(svc: Service) -> bool:
    try:
        return httpx.get(f"{svc.url}/v1/healthz", timeout=2).json()["role"] == "leader"
    except httpx.HTTPError:
        return False


def stop_all(services: list[Service], ray_cluster: RayCluster) -> None:
    for svc in services:
        if svc.proc is not None and svc.proc.poll() is None:
            cancel_all(svc)
            svc.stop()
    kill_agents(ray_cluster, services[0].home)  # the pair's, in the shared cluster


def test_the_standby_adopts_the_gang_of_a_killed_leader_through_its_actors(
    tmp_path: Path, ray_cluster: RayCluster, pg_server: PostgresServer
) -> None:
    a, b = pair(tmp_path, ray_cluster, pg_server)
    work = a.work
    try:
        a.start(timeout_s=90)
        b.start(timeout_s=90)
        jid = submit(a, "ha-gang", replicas=2, topology={"spread": "node"})
        for r in range(2):
            env_of(a, jid, r)
        a.kill9()  # its tasks are detached actors: they keep running

        wait_for("the standby to lead", lambda: leads(b), 30)
        wait_for("the adoption", lambda: b.job(jid)["events"][-1]["kind"] == "adopted", 60)
        job = b.job(jid)
        assert (job["state"], job["attempt"]) == ("running", 1)
        assert [e["kind"] for e in job["events"]].count("adopted") == 2
        (work / "release").touch()
        job = b.wait_state(jid, "succeeded", "failed", timeout_s=60)
        assert job["state"] == "succeeded", job["events"]
        assert [e["kind"] for e in job["events"]].count("started") == 1
        assert sorted(events(b)) == ["start 0 0", "start 1 0"]  # once each, never stopped
        wait_until_ray_holds_none_of(ray_cluster, ("GPU",), 60)
    finally:
        stop_all([b, a], ray_cluster)


def test_a_leader_paused_between_committing_a_gang_launch_and_making_it_starts_nothing(
    tmp_path: Path, ray_cluster: RayCluster, pg_server: PostgresServer
) -> None:
    # A real SIGSTOP at the failpoint `pause-before-launch`: the gang's launch is committed and
    # not made; the standby takes over, gives the launch up on its nodes' agents and runs the
    # gang again. The old leader, let go on, finds its launch refused and exits deposed.
    a, b = pair(tmp_path, ray_cluster, pg_server)
    a.extra_env = {"AISCHED_FAILPOINTS": "pause-before-launch"}
    try:
        a.start(timeout_s=90)
        b.start(timeout_s=90)
        jid = submit(a, "paused", replicas=2, topology={"spread": "node"})
        assert a.proc is not None
        wait_for("the leader to pause at its launch", lambda: stopped(a.proc.pid), 60)
        wait_for("the standby to lead", lambda: leads(b), 30)
        for r in range(2):
            env_of(b, jid, r, restart=1)  # attempt 2 (restart 1), started by the new leader
        a.proc.send_signal(signal.SIGCONT)
        assert a.proc.wait(60) == 3
        (a.work / "release").touch()
        job = b.wait_state(jid, "succeeded", "failed", timeout_s=60)
        assert job["state"] == "succeeded", job["events"]
        assert sorted(events(b)) == ["start 0 1", "start 1 1"]  # attempt 1 never started
        # The reservation the old leader made for attempt 1 is no one's: the new leader's
        # sweep removes it (at its second look), so Ray holds no GPU once the gang is done.
        from aisched.executors.ray_executor import SWEEP_S

        wait_until_ray_holds_none_of(
            ray_cluster, ("GPU",), 3 * SWEEP_S + 30, "Ray to give the given-up attempt's GPUs back"
        )
    finally:
        stop_all([b, a], ray_cluster)

"""A node's agent on the real Ray cluster of this folder is an asyncio actor: the calls it has
in flight (a start waiting for its reservation, a wait per running task) are coroutines, not
threads. Idle, its process holds a few threads (a pool of 256 before, on every node for every
data directory); and one node runs more tasks at once than that pool took calls: 300 tasks,
each with its `wait` in flight, all run, and a cancel stops them all (with the pool, the
stops queued behind waits that only a stop could end)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster, connect_driver

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

MANY = 300
# Far above what the agent's own threads need (Ray's worker holds about 25), far below the
# 256 of the old pool.
IDLE_AGENT_THREADS_MAX = 64


def agent_threads(svc: Service, cluster: RayCluster, node: str) -> int:
    """How many threads the process of the agent of `node` (of `svc`'s data directory) has."""
    from aisched.executors.ray_executor import agent_name, namespace_for

    connect_driver(cluster)
    name = agent_name(cluster.nodes[node].node_id)
    namespace = namespace_for(str(svc.home.resolve()))

    def agent() -> object | None:
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError:  # not made yet: the service makes it when it first sees the node
            return None

    pid = ray.get(wait_for(f"the agent of {node}", agent, 60).ping.remote(), timeout=60)
    return len(os.listdir(f"/proc/{pid}/task"))


def test_an_idle_agent_holds_a_few_threads(ray_service: Service, ray_cluster: RayCluster) -> None:
    assert agent_threads(ray_service, ray_cluster, "a1") < IDLE_AGENT_THREADS_MAX


def test_one_node_runs_and_stops_more_tasks_at_once_than_the_old_agent_took_calls(
    ray_service: Service,
) -> None:
    svc = ray_service
    doc = {
        "name": "many",
        "grace_period": "10s",
        "topology": {"pack": "node"},  # one node's agent takes them all (2 CPUs, 2 GiB)
        "tasks": [
            {
                "name": "worker",
                "replicas": MANY,
                "command": ["sh", "-c", 'touch "started-$RANK" && exec sleep 600'],
                "resources": {"cpus": 0.005, "mem": "5M"},
            }
        ],
    }
    path = svc.work / "many.json"
    path.write_text(json.dumps(doc))
    jid = str(svc.cli_json("submit", str(path))["id"])

    def started() -> list[Path]:
        return list(svc.work.glob("started-*"))

    wait_for(f"all {MANY} tasks to start", lambda: len(started()) == MANY, 180)
    job = svc.job(jid)
    assert job["state"] == "running"
    assert len({t["node"] for t in job["tasks"]}) == 1

    svc.cli("cancel", jid)

    job = svc.wait_state(jid, "cancelled", timeout_s=120)
    assert [t["exit_kind"] for t in job["tasks"]] == ["stopped"] * MANY

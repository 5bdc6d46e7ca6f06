"""A Ray node that leaves the cluster for a while (its raylet stopped), on the real local
cluster with the real `aisched up --ray`: a gang that fits only with it waits
`lost_node_grace` for it, its reason naming it, and starts when it is back (a new raylet with
the same name and resources: a new Ray node id); past the grace, with the node still away, it
fails saying so. tests/service/test_lost_nodes.py has the same rules on a fake executor.

A node replaced between two looks of the service at Ray's node table (never seen away) is
used under its new Ray node id, not its dead one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster, ray_node_alive

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

PY = sys.executable
# Two nodes of their own, of a GPU model no other node has: a gang of two 2-GPU tasks of that
# model fits only with both.
STAYS, LEAVES, MODEL = "l1", "l2", "L4"

# Appends "start JOB RANK" to events.log, then blocks until it is stopped.
TASK = textwrap.dedent(
    """
    import os, time
    with open("events.log", "a") as f:
        f.write(f"start {os.environ['AISCHED_JOB_ID']} {os.environ['RANK']}\\n")
    while True:
        time.sleep(1)
    """
)


@pytest.fixture
def pair(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """STAYS and LEAVES added for this test (before its service starts, so they are torn down
    after it) and removed after it, once Ray has marked them dead: the next test's service
    would otherwise still see them for a few seconds (Ray's health check) and place work
    there."""
    for name in (STAYS, LEAVES):
        add(ray_cluster, name)
    try:
        yield ray_cluster
    finally:
        ids = [ray_cluster.nodes[n].node_id for n in (STAYS, LEAVES) if n in ray_cluster.nodes]
        for name in (STAYS, LEAVES):
            if name in ray_cluster.nodes:
                ray_cluster.remove(name)
        wait_for(
            "Ray to mark the test's nodes dead",
            lambda: not any(ray_node_alive(ray_cluster, i) for i in ids),
            30,
        )


def add(cluster: RayCluster, name: str) -> None:
    cluster.add(name, "rl", "z5", gpus=2, cpus=1, model=MODEL)


def node_names(svc: Service) -> set[str]:
    return {n["name"] for n in svc.cli_json("nodes")["nodes"]}


def submit_gang(svc: Service) -> str:
    (svc.work / "task.py").write_text(TASK)
    doc = {
        "name": "gang",
        "gpu_models": [MODEL],
        "tasks": [
            {
                "name": "worker",
                "replicas": 2,
                "command": [PY, "task.py"],
                "resources": {"cpus": 0.25, "gpus": 2, "mem": "128M"},
            }
        ],
    }
    path = svc.work / "gang.json"
    path.write_text(json.dumps(doc))
    return str(svc.cli_json("submit", str(path))["id"])


def started(svc: Service, job_id: str) -> list[str]:
    path = svc.work / "events.log"
    got = path.read_text().splitlines() if path.exists() else []
    return sorted(line for line in got if line.startswith(f"start {job_id} "))


def leave(svc: Service, cluster: RayCluster) -> None:
    """Stops LEAVES' raylet (and the rest of its processes) and waits for the service to see
    it gone."""
    wait_for("both nodes to be noticed", lambda: {STAYS, LEAVES} <= node_names(svc), 30)
    cluster.remove(LEAVES)
    wait_for(f"{LEAVES} to leave the node list", lambda: LEAVES not in node_names(svc), 30)


def waiting_for_leaves(svc: Service, job_id: str) -> dict[str, Any]:
    """The job once a cycle has judged it (its reason set), or failed."""

    def judged() -> dict[str, Any] | None:
        job = svc.job(job_id)
        return job if job["reason"] or job["state"] != "pending" else None

    job: dict[str, Any] = wait_for(f"job {job_id} to be judged", judged, 30)
    return job


@pytest.mark.up_config({"lost_node_grace": "5m"})
def test_a_gang_that_fits_only_with_a_node_that_left_waits_for_it_and_starts_when_it_is_back(
    pair: RayCluster, ray_service: Service
) -> None:
    svc = ray_service
    leave(svc, pair)
    jid = submit_gang(svc)  # admitted: it fits the cluster with LEAVES back

    job = waiting_for_leaves(svc, jid)
    assert (job["state"], job["reason_code"]) == ("pending", "wait-resources"), job
    assert job["reason"].startswith("does not fit this cluster"), job["reason"]
    assert job["reason"].endswith(f"now; waits up to 300 s for {LEAVES}, which left, to come back")

    add(pair, LEAVES)  # a new raylet: a new Ray node id, the same name and resources
    wait_for("both ranks to start", lambda: len(started(svc, jid)) == 2, 60)
    job = svc.wait_state(jid, "running")
    assert {t["node"] for t in job["tasks"]} == {STAYS, LEAVES}
    assert (job["attempt"], job["failures"]) == (1, 0), job["events"]


# Long enough that the test sees the gang wait before it runs out (a few CLI calls, on a
# loaded machine).
@pytest.mark.up_config({"lost_node_grace": "60s"})
def test_past_the_grace_a_gang_whose_node_stays_away_fails_saying_why(
    pair: RayCluster, ray_service: Service
) -> None:
    svc = ray_service
    leave(svc, pair)
    jid = submit_gang(svc)

    job = waiting_for_leaves(svc, jid)
    assert job["state"] == "pending", job
    assert f"waits up to 60 s for {LEAVES}, which left" in job["reason"]

    job = svc.wait_state(jid, "failed", timeout_s=120)
    assert not started(svc, jid)
    assert job["message"] == (
        "can never fit this cluster: room for 1 of 2 'worker' tasks (2 GPU, 0.25 CPU, 128 MiB "
        f"memory each); waited 60 s (lost_node_grace) for {LEAVES}, which left, to come back"
    )


def test_a_node_replaced_between_two_looks_of_the_service_is_used_under_its_new_ray_id(
    pair: RayCluster, ray_service: Service
) -> None:
    svc = ray_service
    wait_for("both nodes to be noticed", lambda: {STAYS, LEAVES} <= node_names(svc), 30)
    old = pair.nodes[LEAVES].node_id
    assert svc.proc is not None
    # The service held still while LEAVES' raylet is stopped and a new one takes its place, as
    # a replacement quicker than the service's look at Ray's node table (once a second) is:
    # the next look finds the same node (name, resources) under a new Ray node id.
    os.kill(svc.proc.pid, signal.SIGSTOP)
    try:
        pair.remove(LEAVES)
        wait_for(f"Ray to mark the old {LEAVES} dead", lambda: not ray_node_alive(pair, old), 30)
        add(pair, LEAVES)
        new = pair.nodes[LEAVES].node_id
        wait_for(f"the new {LEAVES} to join Ray", lambda: ray_node_alive(pair, new), 30)
    finally:
        os.kill(svc.proc.pid, signal.SIGCONT)

    jid = submit_gang(svc)  # on both nodes: on LEAVES only through its new Ray node id
    wait_for("both ranks to start", lambda: len(started(svc, jid)) == 2, 60)
    job = svc.wait_state(jid, "running")
    assert {t["node"] for t in job["tasks"]} == {STAYS, LEAVES}
    assert (job["attempt"], job["failures"]) == (1, 0), job["events"]

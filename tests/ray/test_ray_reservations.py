"""A gang's placement group on the real multi-node Ray cluster of this folder: it holds the
gang's GPUs in Ray's accounting for as long as the gang runs (the sweep of unclaimed groups
leaves it alone), a task that ends before its gang-mates gives its share back (the rest are
re-reserved), and a group whose tasks all ended while no scheduler watched is removed by the
restarted scheduler's sweep."""

from __future__ import annotations

import json
import sys
import time

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster, ray_gpus_in_use, wait_until_ray_holds_none_of
from test_ray_service import env_of, submit

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")


def test_a_gangs_reservation_holds_while_it_runs_and_goes_once_it_ended_unwatched(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    from aisched.executors.ray_executor import SWEEP_S

    svc = ray_service
    jid = submit(svc, "held", replicas=2, topology={"spread": "node"})
    for r in range(2):
        env_of(svc, jid, r)
    placed = {t["node"]: float(len(t["gpus"])) for t in svc.job(jid)["tasks"]}
    assert len(placed) == 2

    def held() -> dict[str, float]:
        return {n: g for n, g in ray_gpus_in_use(ray_cluster).items() if g}

    assert held() == placed
    time.sleep(2 * SWEEP_S + 1)  # two sweeps: a group of running tasks is claimed
    assert held() == placed

    svc.kill9()
    (svc.work / "release").touch()  # both tasks end while no scheduler watches
    svc.start(timeout_s=90)
    job = svc.wait_state(jid, "succeeded", "failed", timeout_s=60)
    assert job["state"] == "succeeded", job["events"]
    # Nothing claims the gang's group now: the sweep removes it, and Ray holds no GPU.
    wait_until_ray_holds_none_of(ray_cluster, ("GPU",), 3 * SWEEP_S + 30)


# Rank R waits for release-R, then exits 0.
WAIT_FOR_MY_RELEASE = (
    "import os, time\n"
    "r = os.environ['RANK']\n"
    "open(f'up-{os.environ[\"AISCHED_JOB_ID\"]}-{r}', 'w').close()\n"
    "while not os.path.exists(f'release-{r}'):\n"
    "    time.sleep(0.1)\n"
)


def test_a_task_that_ends_before_its_gang_mates_gives_its_share_back_to_ray(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    doc = {
        "name": "uneven",
        "topology": {"spread": "node"},
        "tasks": [
            {
                "name": "worker",
                "replicas": 2,
                "command": [sys.executable, "-c", WAIT_FOR_MY_RELEASE],
                "resources": {"cpus": 0.5, "gpus": 1, "mem": "256M"},
            }
        ],
    }
    (svc.work / "uneven.json").write_text(json.dumps(doc))
    jid = str(svc.cli_json("submit", "uneven.json")["id"])
    for r in range(2):
        wait_for(f"rank {r} to start", (svc.work / f"up-{jid}-{r}").exists, 60)
    nodes = {t["rank"]: t["node"] for t in svc.job(jid)["tasks"]}

    def held() -> dict[str, float]:
        return {n: g for n, g in ray_gpus_in_use(ray_cluster).items() if g}

    assert held() == {nodes[0]: 1.0, nodes[1]: 1.0}
    (svc.work / "release-1").touch()
    wait_for("rank 1's share to go back", lambda: held() == {nodes[0]: 1.0}, 60)
    assert svc.job(jid)["state"] == "running"
    (svc.work / "release-0").touch()
    assert svc.wait_state(jid, "succeeded", "failed", timeout_s=60)["state"] == "succeeded"
    wait_until_ray_holds_none_of(ray_cluster, ("GPU",), 60)

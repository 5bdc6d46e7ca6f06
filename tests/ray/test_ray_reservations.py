"""A gang's placement group on the real multi-node Ray cluster of this folder: it holds the
gang's GPUs in Ray's accounting for as long as the gang runs (the sweep of unclaimed groups
leaves it alone), and a group whose tasks all ended while no scheduler watched is removed by
the restarted scheduler's sweep."""

from __future__ import annotations

import time

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster
from test_ray_service import env_of, ray_gpus_in_use, submit

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
    wait_for("Ray to hold no GPU", lambda: held() == {}, 3 * SWEEP_S + 30)

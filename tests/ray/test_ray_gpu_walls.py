"""GPU walls on a Ray node (`ray_limits`, `gpu_walls.py`): a host task there opens the device
files of its own GPUs only, as on one machine (tests/e2e/test_gpu_walls_e2e.py). The node is
added for the test with `AISCHED_GPU_DEVICE_FILES` in its raylet's environment (as an
operator would start `ray start` on a node whose GPUs NVML does not list), naming stand-in
device files (`gpu_stand_ins`), since this machine has no GPU. Its Ray
workers run as root: the device cgroup holds for root too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_stand_ins import OPEN_PROBE, STAND_INS, seen, stand_in_files
from harness import Service
from ray_harness import RayCluster

from aisched.executors.ray_limits import GPU_FILES_ENV

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup/devices/devices.deny").exists(),
    reason="needs root and a cgroup v1 devices hierarchy",
)

# A node of its own, of a GPU model no other node has: the test's jobs run there.
NODE, MODEL = "w1", "WALL"
FAKE_GPUS = STAND_INS[:2]


@pytest.fixture
def gpu_files() -> Iterator[list[str]]:
    with stand_in_files(len(FAKE_GPUS)) as files:
        yield files


@pytest.fixture
def walled_node(ray_cluster: RayCluster, gpu_files: list[str]) -> Iterator[RayCluster]:
    """NODE, its raylet started with the stand-in files as its GPUs' (before the service
    starts), removed after the test."""
    env = {GPU_FILES_ENV: ",".join(gpu_files)}
    with ray_cluster.node_of_a_test(NODE, "rw", "z7", env, gpus=2, cpus=1, model=MODEL) as rc:
        yield rc


def probe(svc: Service, name: str, gpu_files: list[str]) -> str:
    doc = {
        "name": name,
        "gpu_models": [MODEL],
        "restart": {"policy": "never"},
        "tasks": [
            {
                "name": "main",
                "command": ["python3", "-c", OPEN_PROBE, *gpu_files],
                "resources": {"cpus": 0.25, "gpus": 1, "mem": "64M"},
            }
        ],
    }
    path = svc.work / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(svc.cli_json("submit", str(path))["id"])


def test_a_ray_host_task_opens_its_own_gpus_device_file_only(
    walled_node: RayCluster, ray_service: Service, gpu_files: list[str]
) -> None:
    for name in ("first", "second"):
        jid = probe(ray_service, name, gpu_files)
        job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=90)
        assert job["state"] == "succeeded", job["events"]
        out = seen(ray_service.cli("logs", jid).stdout)
        (gpu,) = [g for t in job["tasks"] for g in t["gpus"]]
        assert out["AISCHED_GPUS"] == str(gpu), out
        assert out["CUDA_VISIBLE_DEVICES"] == "0", out
        assert [out[n] for n, _, _ in FAKE_GPUS] == [
            "opens" if i == gpu else "EPERM" for i in range(len(FAKE_GPUS))
        ], out

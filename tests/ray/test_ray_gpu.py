"""Shared GPUs and the GPU-memory watchdog on a real multi-node Ray cluster.

A node of its own (`s1`, GPU model S1, two declared GPUs) keeps these tests' placements apart
from the other nodes'. Without real GPUs, the watchdog reads GPU memory from an injected
source: each task writes the pid and MiB it "holds" on its GPU to a file, and the reading
function (made on the node, in the task's actor, as NVML's would be) lists those files.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster, ray_gpus_in_use
from test_ray_service import env_of, submit, tasks_of

from aisched.executors.base import ExitKind, TaskExited, TaskKey, TaskLaunch
from aisched.executors.gpu_watchdog import GpuProcesses, OverAction, TaskGpuMemory

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

PY = sys.executable
SHARED = "s1"


@pytest.fixture(scope="module")
def shared_node(ray_cluster: RayCluster) -> Iterator[str]:
    ray_cluster.add(SHARED, "rs", "z4", gpus=2, cpus=2, model="S1")
    try:
        yield SHARED
    finally:
        ray_cluster.remove(SHARED)


def test_shared_gpu_tasks_see_the_gpu_the_scheduler_chose_and_ray_reserves_their_shares(
    ray_service: Service, ray_cluster: RayCluster, shared_node: str
) -> None:
    svc = ray_service
    wait_for(
        "the shared node to be noticed",
        lambda: shared_node in {n["name"] for n in svc.cli_json("nodes")["nodes"]},
        30,
    )
    half = {"cpus": 0.25, "gpus": 0.5, "mem": "128M"}
    halves = [submit(svc, f"half-{i}", gpu_models=["S1"], resources=half) for i in range(2)]
    envs = [env_of(svc, j, 0) for j in halves]
    tasks = [tasks_of(svc, j)[0] for j in halves]
    assert {t["node"] for t in tasks} == {shared_node}
    # Both on one GPU (binpacking shares), and that GPU is what each process sees.
    assert tasks[0]["gpus"] == tasks[1]["gpus"] and len(tasks[0]["gpus"]) == 1
    shared_gpu = tasks[0]["gpus"][0]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [str(shared_gpu)] * 2

    # Ray reserved half a GPU for each: one GPU in all. A whole-GPU task then takes the other
    # GPU, which Ray can give only if it put both shares on one device too.
    assert ray_gpus_in_use(ray_cluster)[shared_node] == 1.0
    whole = submit(svc, "whole", gpu_models=["S1"], resources={"cpus": 0.25, "gpus": 1})
    env = env_of(svc, whole, 0)
    (t,) = tasks_of(svc, whole)
    assert t["node"] == shared_node and t["gpus"] == [1 - shared_gpu]
    assert env["CUDA_VISIBLE_DEVICES"] == str(1 - shared_gpu)
    assert ray_gpus_in_use(ray_cluster)[shared_node] == 2.0


# Says what it "holds" on its GPU (gpu-PID.json: pid, GPU, MiB), then sleeps until stopped.
HOLDER = textwrap.dedent(
    """
    import json, os, time
    me = os.getpid()
    gpu = int(os.environ["CUDA_VISIBLE_DEVICES"])
    with open(f"gpu-{me}.tmp", "w") as f:
        json.dump({"pid": me, "gpu": gpu, "mib": int(os.environ["HOLD_MIB"])}, f)
    os.replace(f"gpu-{me}.tmp", f"gpu-{me}.json")
    time.sleep(120)
    """
)


def watchdog_reading_files(folder: str, action: OverAction) -> Any:
    """A watchdog maker for the task's node, reading GPU memory from the holders' files.
    Nested functions: Ray sends them by value, so the node needs nothing of this module."""

    def read(indices: Iterable[int]) -> GpuProcesses:
        import glob
        import json

        out: dict[int, list[tuple[int, int]]] = {}
        for path in sorted(glob.glob(os.path.join(folder, "gpu-*.json"))):
            with open(path) as f:
                held = json.load(f)
            if held["gpu"] in indices:
                out.setdefault(held["gpu"], []).append((held["pid"], held["mib"]))
        return out

    def make() -> Any:
        from aisched.executors.gpu_watchdog import GpuMemoryWatchdog, WatchdogState

        return GpuMemoryWatchdog(read, WatchdogState(True, "active: test readings"), action)

    return make


def launch(ex: Any, folder: Path, job: str, node: str, hold_mib: int) -> TaskLaunch:
    req = TaskLaunch(
        job_id=job,
        attempt=0,
        task="g-0",
        node=node,
        command=(PY, "-c", HOLDER),
        env={"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0", "HOLD_MIB": str(hold_mib)},
        workdir=str(folder),
        milli_cpu=250,
        mem_limit_mib=0,
        gpus=(0,),
        log_path=str(folder / f"{job}.log"),
        grace_period_s=2.0,
        gpu_mem_mib=1024,
        gpu_milli=500,
    )
    ex.launch(req)
    return req


@pytest.mark.parametrize("action", [OverAction.STOP, OverAction.REPORT])
def test_the_watchdog_on_the_node_stops_or_reports_a_task_above_its_gpu_memory(
    ray_cluster: RayCluster,
    shared_node: str,
    tmp_path: Path,
    action: OverAction,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aisched.executors.ray_executor import RayExecutor

    caplog.set_level(logging.WARNING, logger="aisched.executors.ray_executor")
    ray_gpus_in_use(ray_cluster)  # connects this process to the cluster, as aisched up does
    ex = RayExecutor(
        f"aisched-test-{uuid.uuid4().hex[:8]}",
        gpu_watchdog=watchdog_reading_files(str(tmp_path), action),
        gpu_check_s=0.3,
    )
    exits: dict[TaskKey, TaskExited] = {}

    def ended(key: TaskKey) -> bool:
        exits.update((e.key, e) for e in ex.poll())
        return key in exits

    try:
        wait_for("the shared node", lambda: shared_node in {n.name for n in ex.nodes()}, 30)
        big = launch(ex, tmp_path, "big", shared_node, hold_mib=3000)
        small = launch(ex, tmp_path, "small", shared_node, hold_mib=500)
        said = "uses 3000 MiB of GPU memory (declared 1024 MiB): pid "
        if action == OverAction.STOP:
            wait_for("the task above its GPU memory to be stopped", lambda: ended(big.key), 90)
            assert exits[big.key].kind == ExitKind.STOPPED
            assert (
                (tmp_path / "big.log").read_text().startswith(f"aisched: stopped: the task {said}")
            )
        else:
            wait_for(
                "the warning in the task's log",
                lambda: (
                    (tmp_path / "big.log").exists()
                    and (tmp_path / "big.log")
                    .read_text()
                    .startswith(f"aisched: warning: the task {said}")
                ),
                90,
            )

        # The executor has the readings of both, from the watchdog on their node.
        def readings() -> dict[str, tuple[int, bool]]:
            return {u.key[0]: (u.used_mib, u.over) for u in ex.gpu_memory()}

        want = (
            {"small": (500, False)}
            if action == OverAction.STOP
            else {
                "big": (3000, True),
                "small": (500, False),
            }
        )
        wait_for("the executor to fetch the readings", lambda: readings() == want, 30)
        assert (tmp_path / "small.log").read_text() == ""
        assert not ended(small.key)
        assert any(r.getMessage().startswith(f"task big/0/g-0 {said}") for r in caplog.records)
        assert f"GPU-memory watchdog on {shared_node}: active: test readings" in ex.info().notes
        assert all(isinstance(u, TaskGpuMemory) for u in ex.gpu_memory())
    finally:
        keys = [("big", 0, "g-0"), ("small", 0, "g-0")]
        for key in keys:
            ex.stop(key, 0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(ended(k) for k in keys):
            time.sleep(0.1)
        ex.close()

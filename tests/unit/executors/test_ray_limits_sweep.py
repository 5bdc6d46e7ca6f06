"""The sweep of the task cgroups a killed Ray node agent left (`ray_limits`), on this
machine's real cgroups: what a task whose lock was let go of left is killed and removed; a
task whose lock is still held (a live agent's) is left alone. tests/ray/test_ray_agent_killed.py
kills a real agent."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from aisched.executors import processes, ray_limits
from aisched.executors.cgroups import TaskBounds
from aisched.executors.gpu_walls import GpuDevices
from aisched.executors.ray_limits import TaskCgroups


@pytest.fixture
def instance() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("task cgroups and the node's state directory are root's")
    if ray_limits.node_controls("auto").mem.mechanism not in ("cgroup-v1", "cgroup-v2"):
        pytest.skip("this machine gives tasks no memory cgroup")
    name = uuid.uuid4().hex[:10]
    yield name
    shutil.rmtree(os.path.join(ray_limits.NODE_STATE, name), ignore_errors=True)


def run_in(cgroups: TaskCgroups) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], preexec_fn=cgroups.join)


def spec(instance: str, task: str) -> dict[str, object]:
    return {"instance": instance, "key": ["7", 1, task], "log_path": "-", "mem_limit_mib": 64}


def test_the_sweep_kills_and_removes_what_a_dead_owner_left_and_nothing_of_a_live_one(
    instance: str,
) -> None:
    live = ray_limits.make_task_cgroups(spec(instance, "live"), os.geteuid(), ())
    dead = ray_limits.make_task_cgroups(spec(instance, "dead"), os.geteuid(), ())
    procs = [run_in(live), run_in(dead)]
    try:
        assert dead.owner is not None
        os.close(dead.owner.fd)  # as its agent's death would: the lock goes, the rest stays
        controls = ray_limits.node_controls("auto")
        owners = os.path.dirname(dead.owner.path)

        gone = ray_limits.sweep_dead_task_cgroups(instance, controls, owners)

        assert gone == [f"{instance}.7.1.dead"]
        assert procs[1].wait(10) == -9
        assert [c for c in dead.joined if os.path.exists(c)] == []
        assert not os.path.exists(dead.owner.path)
        assert procs[0].poll() is None
        assert all(os.path.isdir(c) for c in live.joined)
    finally:
        live.remove()
        for cgroup in dead.joined:  # (a failed sweep's)
            processes.remove_cgroup(cgroup)
        for proc in procs:
            proc.kill()
            proc.wait()
        assert live.owner is not None and not os.path.exists(live.owner.path)


def test_a_task_on_a_node_whose_gpus_cannot_be_walled_is_told_why(instance: str) -> None:
    # The node lists GPU files, but its cgroups could not hold the walls (as choose_task_bounds
    # says where it cannot: no devices hierarchy, a kernel refusing the BPF filter).
    why = "GPU walls: none, a host task's GPUs are its CUDA_VISIBLE_DEVICES only (here: why)"
    controls = ray_limits.node_controls("auto")
    unwalled = ray_limits.NodeControls(
        controls.mem, TaskBounds(notes=(why,)), GpuDevices(((1, 7), (1, 8)))
    )
    made = ray_limits._make(unwalled, spec(instance, "t"), f"{instance}.7.1.t", os.geteuid(), ())
    try:
        assert (made.walled, made.gpu_note) == (False, why)
    finally:
        made.remove()
    if controls.gpus is None:  # no GPU files on this machine: nothing to say
        plain = ray_limits._make(controls, spec(instance, "u"), f"{instance}.7.1.u", 0, ())
        try:
            assert (plain.walled, plain.gpu_note) == (False, None)
        finally:
            plain.remove()


def test_a_cgroup_that_is_busy_for_a_while_is_removed_once_it_lets_go(instance: str) -> None:
    """A CI run under load left a dead agent's cgroup after its sweep: its process, killed,
    held the cgroup a while longer than its list showed, and the one rmdir, refused as busy,
    was not tried again. Here a child cgroup keeps the cgroup busy for 0.3 s."""
    base = ray_limits.node_controls("auto").mem.base
    assert base is not None
    cgroup = os.path.join(base, f"{instance}.busy")
    child = os.path.join(cgroup, "child")
    os.makedirs(child)
    let_go = threading.Timer(0.3, os.rmdir, (child,))
    let_go.start()
    try:
        processes.remove_cgroup(cgroup, drain_s=10)
        assert not os.path.exists(cgroup)
    finally:
        let_go.join()
        if os.path.isdir(cgroup):
            os.rmdir(cgroup)

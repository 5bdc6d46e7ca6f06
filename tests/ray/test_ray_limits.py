"""A host task on a Ray node is bounded there as on one machine (`ray_limits`): its memory by
a cgroup of its own (over it: an OOM kill, reported as such) and its processes and threads by
the pids limits, for a task run as a real local user too; a user's task gets its job's own
/dev/shm there (`ray_shm`). The Ray workers here run as root,
as on a shared cluster, on a machine whose cgroups the tests may write."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from harness import Service
from users import User

from aisched.executors.ray_executor import namespace_for
from aisched.executors.ray_shm import NODE_STATE

HOST_SHM = Path("/dev/shm")

# Starts threads until the kernel refuses one; prints how many it started.
THREADS = """
import threading, time
n = 0
try:
    while n < 100000:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
except RuntimeError:
    pass
print(n, flush=True)
"""


def test_a_ray_host_task_over_its_memory_is_killed_and_said_to_be(ray_service: Service) -> None:
    jid = ray_service.run(
        "--mem", "64M", "--restart", "never", "--",
        "python3", "-c", "x = bytearray(512 << 20); print('still alive')",
    )  # fmt: skip
    job = ray_service.wait_state(jid, "failed", "succeeded", timeout_s=90)
    assert job["message"] == (
        "task main-0 killed: exceeded its memory limit of 64 MiB; restart policy is never"
    )
    assert [t["exit_kind"] for t in job["tasks"]] == ["oom"]
    assert "still alive" not in ray_service.cli("logs", jid).stdout


@pytest.mark.up_config({"task_pids_limit": 32})
def test_a_users_ray_task_holds_no_more_threads_than_its_pids_limit(
    ray_service: Service, local_users: dict[str, User]
) -> None:
    alice = local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{ray_service.socket}"}
    proc = alice.aisched("run", "--json", "--restart", "never", "--", "python3", "-c", THREADS,
                         env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    jid = str(json.loads(proc.stdout)["id"])
    job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=90)
    assert job["state"] == "succeeded", job["events"]
    # The interpreter and its threads together: at most 32 tasks of the kernel.
    started = int(alice.aisched("logs", jid, env=env).stdout.strip())
    assert 0 < started < 32


def test_a_users_ray_task_has_a_dev_shm_of_its_jobs_own_gone_when_it_ends(
    ray_service: Service, local_users: dict[str, User]
) -> None:
    # As on one machine (tests/e2e/test_shm_e2e.py): the node's agent holds the tmpfs.
    alice = local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{ray_service.socket}"}
    tok = f"ais-rayshm-{uuid.uuid4().hex[:12]}"
    script = (
        f'echo kept > /dev/shm/{tok}; stat -c "%U %a" /dev/shm; '
        "df -m /dev/shm | tail -n 1 | awk '{print $2}'"
    )
    proc = alice.aisched("run", "--json", "--mem", "256M", "--", "sh", "-c", script, env=env)
    assert proc.returncode == 0, proc.stderr
    jid = str(json.loads(proc.stdout)["id"])
    job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=90)
    assert job["state"] == "succeeded", job["events"]
    try:
        out = alice.aisched("logs", jid, env=env).stdout
        assert out.splitlines() == [f"{alice.name} 700", "256"]
        assert not (HOST_SHM / tok).exists()
        ns = namespace_for(str(ray_service.home.resolve()))
        instance = hashlib.sha256(ns.encode()).hexdigest()[:10]  # as the executor names it
        # This service's (another's left on this machine is not this test's to judge).
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            assert [ln for ln in f if f" {NODE_STATE}/{instance}/" in ln] == []
        # Nor its directory on the node, lock and all: no retention clears the node's state.
        assert not (Path(NODE_STATE) / instance / jid).exists()
    finally:
        (HOST_SHM / tok).unlink(missing_ok=True)

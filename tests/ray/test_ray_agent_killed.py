"""A node's agent killed (kill -9 of its Ray worker process), on the real local cluster with
the real `aisched up --ray`: its task's main process dies with it, the scheduler sees the task
lost and runs it again, and what the task started that outlived its main process must not run
on beside the new attempt. The next agent of the node sweeps, before it makes any cgroup of
the service, the task cgroups the dead one left: it kills what is left in them and removes
them (`ray_limits`), and leaves those of a live agent of another node of the machine alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster, connect_driver
from users import User

from aisched.executors import processes
from aisched.executors.ray_executor import agent_name, namespace_for
from aisched.executors.ray_limits import NODE_STATE

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

# A node of its own, of a GPU model no other node has: every attempt of the job runs there.
NODE, MODEL = "k1", "K80"
CGROUPS = Path("/sys/fs/cgroup")
# Starts a daemon that outlives the task's main process, and logs "ATTEMPT PID" of it.
TASK = 'sleep 600 & echo "$AISCHED_RESTART_COUNT $!" >> daemons.log; exec sleep 600'
# A task of the same service on another node of this machine, whose agent lives on.
BESIDE = "echo $$ > beside.pid; exec sleep 600"
# A task whose main process is the one to kill.
LONE = "echo $$ > task.pid; exec sleep 600"


@pytest.fixture
def node(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """NODE, added for this test (before its service starts) and removed after it."""
    with ray_cluster.node_of_a_test(NODE, "rk", "z6", gpus=1, cpus=1, model=MODEL) as rc:
        yield rc


def submit(
    svc: Service, name: str, command: list[str], model: str = MODEL, retry: bool = True
) -> str:
    restart = {"policy": "on-failure", "max_retries": 1, "backoff": "1s"}
    doc = {
        "name": name,
        "gpu_models": [model],
        "restart": restart if retry else {"policy": "never"},
        "tasks": [
            {
                "name": "worker",
                "command": command,
                "resources": {"cpus": 0.25, "gpus": 1, "mem": "64M"},
            }
        ],
    }
    path = svc.work / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(svc.cli_json("submit", str(path))["id"])


def daemons(svc: Service) -> dict[int, int]:
    """Attempt (restart count) -> the pid of the daemon it started."""
    path = svc.work / "daemons.log"
    got = path.read_text().split("\n") if path.exists() else []
    return {int(a): int(p) for a, p in (ln.split() for ln in got if ln.count(" ") == 1)}


def started_at(pid: int) -> str | None:
    """The start time of live (not zombie) process `pid`, which tells it from a reuse of its
    pid; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def task_cgroups(pid: int) -> list[Path]:
    """The aisched task cgroups (v1) process `pid` is in."""
    out = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if ctrls in ("memory", "pids", "cpuset") and "/aisched/" in path:
            out.append(CGROUPS / ctrls / path.lstrip("/"))
    return out


def agent_pid(cluster: RayCluster, svc: Service) -> int:
    connect_driver(cluster)
    ns = namespace_for(str(svc.home.resolve()))
    agent = ray.get_actor(agent_name(cluster.nodes[NODE].node_id), namespace=ns)
    return int(ray.get(agent.ping.remote(), timeout=30))


def test_a_killed_agents_task_leaves_nothing_running_or_behind_once_the_node_runs_again(
    node: RayCluster, ray_service: Service
) -> None:
    svc = ray_service
    beside = submit(svc, "beside", ["sh", "-c", BESIDE], model="T4")
    pid_file = svc.work / "beside.pid"
    wait_for("the task beside to start", lambda: pid_file.exists() and pid_file.read_text(), 60)
    beside_pid = int(pid_file.read_text())
    beside_since = started_at(beside_pid)
    jid = submit(svc, "outlived", ["sh", "-c", TASK])
    first = wait_for("the first attempt's daemon", lambda: daemons(svc).get(0), 60)
    since = started_at(first)
    left = task_cgroups(first)
    try:
        # Under cgroup v1: its memory cgroup, and its pids and cpuset ones.
        assert len(left) == 3, left
        os.kill(agent_pid(node, svc), signal.SIGKILL)

        # Lost with its agent, it runs again on the node, under a new agent.
        second = wait_for("the second attempt's daemon", lambda: daemons(svc).get(1), 120)
        assert started_at(first) != since, "the first attempt's daemon runs on beside the second"
        # The sweep runs once the scheduler learns of the death, beside the retry's launch, and
        # drains a killed process's cgroup patiently (`ray_limits.SWEEP_DRAIN_S`): the second
        # attempt may start before it is done.
        wait_for("the first attempt's cgroups to go", lambda: not any(c.exists() for c in left), 60)
        assert started_at(second) is not None
        job = svc.job(jid)
        assert (job["state"], job["attempt"]) == ("running", 2), job["events"]
        # Cgroups of the service under a live agent (of another node) are not the sweep's.
        assert started_at(beside_pid) == beside_since
        assert svc.job(beside)["state"] == "running"
    finally:
        if started_at(first) == since:
            os.kill(first, signal.SIGKILL)
        for cgroup in left:
            processes.remove_cgroup(str(cgroup))


def test_a_killed_agents_leftovers_are_swept_though_nothing_runs_on_its_node_again(
    node: RayCluster, ray_service: Service
) -> None:
    # Not retried: no new task goes to the node, yet the daemon must not run on. The scheduler,
    # learning of the death, gives the node a new agent at once, and that agent sweeps.
    svc = ray_service
    jid = submit(svc, "once", ["sh", "-c", TASK], retry=False)
    first = wait_for("the attempt's daemon", lambda: daemons(svc).get(0), 60)
    since = started_at(first)
    left = task_cgroups(first)
    try:
        assert len(left) == 3, left
        os.kill(agent_pid(node, svc), signal.SIGKILL)
        job = svc.wait_state(jid, "failed", timeout_s=60)
        assert "agent died" in job["message"], job["events"]
        wait_for("the daemon to be killed", lambda: started_at(first) != since, 60)
        wait_for("its cgroups to be removed", lambda: not any(c.exists() for c in left), 30)
        assert svc.job(jid)["attempt"] == 1
    finally:
        if started_at(first) == since:
            os.kill(first, signal.SIGKILL)
        for cgroup in left:
            processes.remove_cgroup(str(cgroup))


def task_pid(svc: Service) -> int:
    pid_file = svc.work / "task.pid"
    wait_for("the task to start", lambda: pid_file.exists() and pid_file.read_text(), 60)
    return int(pid_file.read_text())


def test_a_task_killed_just_before_its_agent_died_is_lost_with_the_agent(
    node: RayCluster, ray_service: Service
) -> None:
    # Ray kills the children of an agent's worker (SIGKILL) as that worker exits (its raylet
    # died: the node is lost), and the agent may tell of the kill, or record it, before it
    # goes. That end is the node's loss, not the task's own. Forced in that order here: the
    # service is held (SIGSTOP) while the task is killed, its end is recorded and answered,
    # and then its agent is killed.
    svc = ray_service
    jid = submit(svc, "killed-first", ["sh", "-c", LONE], retry=False)
    task = task_pid(svc)
    agent = agent_pid(node, svc)
    assert svc.proc is not None
    os.kill(svc.proc.pid, signal.SIGSTOP)
    try:
        os.kill(task, signal.SIGKILL)
        wait_for("its end to be recorded", lambda: any(svc.home.rglob("*.exit.json")), 30)
        time.sleep(1.0)  # the agent's answer, sent meanwhile, waits for the service
        os.kill(agent, signal.SIGKILL)
        wait_for("the agent to be gone", lambda: started_at(agent) is None, 30)
    finally:
        os.kill(svc.proc.pid, signal.SIGCONT)
    job = svc.wait_state(jid, "failed", timeout_s=60)
    assert "agent died" in job["message"], job["events"]
    assert "killed with it" in job["message"] or "killed by signal" not in job["message"]


def test_a_task_killed_from_outside_while_its_agent_lives_fails_of_that_signal(
    ray_service: Service,
) -> None:
    svc = ray_service
    jid = submit(svc, "killed", ["sh", "-c", LONE], model="T4", retry=False)
    os.kill(task_pid(svc), signal.SIGKILL)
    job = svc.wait_state(jid, "failed", timeout_s=60)
    assert "killed by signal 9 (SIGKILL)" in job["message"], job["events"]
    assert "agent" not in job["message"], job["events"]


def shm_mounts(svc: Service, job_id: str) -> list[str]:
    """The mount points of the private /dev/shm of `job_id`'s attempts on this machine's nodes
    (`supervisor_shm.shm_spec`: NODE_STATE/<instance>/.shm/<job>.<attempt>), of `svc`'s
    instance (another service's left on this machine is not the test's to judge)."""
    ns = namespace_for(str(svc.home.resolve()))
    mine = f"{NODE_STATE}/{hashlib.sha256(ns.encode()).hexdigest()[:10]}/.shm/{job_id}."
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [p for p in (line.split()[4] for line in f) if p.startswith(mine)]


def test_a_killed_agents_jobs_dev_shm_goes_though_nothing_runs_on_its_node_again(
    node: RayCluster, ray_service: Service, local_users: dict[str, User]
) -> None:
    # Her task's /dev/shm is a tmpfs of its job's own on the node, holding what she wrote
    # there in the node's memory: with her agent dead and her job not retried, it must not
    # stay mounted until another user's task happens to come to this node.
    svc, alice = ray_service, local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{svc.socket}"}
    job_file = alice.home / "shm-once.yaml"
    job_file.write_text(
        f"gpu_models: [{MODEL}]\nrestart: {{policy: never}}\nresources: {{gpus: 1, mem: 64M}}\n"
        "command: 'head -c 1048576 /dev/zero > /dev/shm/held; echo written; exec sleep 600'\n"
    )
    proc = alice.aisched("submit", "--json", str(job_file), env=env)
    assert proc.returncode == 0, proc.stderr
    jid = str(json.loads(proc.stdout)["id"])
    wait_for("her task to write", lambda: "written" in alice.aisched("logs", jid, env=env).stdout)
    assert len(shm_mounts(svc, jid)) == 1, shm_mounts(svc, jid)
    os.kill(agent_pid(node, svc), signal.SIGKILL)
    job = svc.wait_state(jid, "failed", timeout_s=60)
    assert "agent died" in job["message"], job["events"]
    wait_for("her job's /dev/shm to be unmounted", lambda: shm_mounts(svc, jid) == [], 60)

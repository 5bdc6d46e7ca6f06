"""Faults of the Ray cluster itself, on a real local multi-node cluster, with the real
`aisched up --ray`:

- a task that ended while aisched was not running, and whose node agent is gone since (the
  agent's memory, where its result was, went with it: a Ray node or the whole cluster went
  down), is accounted for from its exit record on shared storage, with its exit code, when
  aisched starts again, and never run a second time;
- an outage of the Ray head's GCS (kill -9 of its gcs_server, on a cluster of the test's own):
  the service does not die with it, says in `/v1/readyz` that Ray is unreachable (holding new
  launches), and still records a task that ends meanwhile, through its node's agent.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Service, free_port, wait_for
from ray_harness import RayCluster, kill_agents, local_cluster

pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

PY = sys.executable
# Appends "start JOB RESTART" to events.log, blocks until `release` exists, appends "end JOB
# RESTART" and exits 0.
TASK = textwrap.dedent(
    """
    import os, time
    me = f"{os.environ['AISCHED_JOB_ID']} {os.environ['AISCHED_RESTART_COUNT']}"
    def log(line):
        with open("events.log", "a") as f:
            f.write(f"{line} {me}\\n")
    log("start")
    while not os.path.exists("release"):
        time.sleep(0.1)
    log("end")
    """
)


def submit(svc: Service, name: str) -> str:
    (svc.work / "task.py").write_text(TASK)
    doc = {
        "name": name,
        "restart": {"policy": "on-failure", "max_retries": 2, "backoff": "1s"},
        "tasks": [
            {
                "name": "worker",
                "command": [PY, "task.py"],
                "resources": {"cpus": 0.5, "mem": "128M"},
            }
        ],
    }
    path = svc.work / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(svc.cli_json("submit", str(path))["id"])


def lines(svc: Service, job_id: str, what: str = "start") -> list[str]:
    path = svc.work / "events.log"
    got = path.read_text().splitlines() if path.exists() else []
    return [line for line in got if line.split()[:2] == [what, job_id]]


def test_a_task_that_ended_unseen_and_whose_agent_is_gone_is_recorded_and_not_run_again(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    jid = submit(svc, "ended-unseen")
    wait_for("the task to start", lambda: lines(svc, jid), 60)
    svc.kill9()  # its task is held by a detached agent: it runs on
    (svc.work / "release").touch()
    wait_for("the task to end, with no scheduler watching", lambda: lines(svc, jid, "end"), 30)
    record = svc.home / "logs" / jid / "1" / "worker-0.log.exit.json"
    deadline = time.monotonic() + 10  # its end recorded just after (none without the fix)
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kill_agents(ray_cluster, svc.home) >= 1

    svc.start(timeout_s=90)
    job = svc.wait_state(jid, "succeeded", "failed", "pending", timeout_s=30)
    # Its end as it was (exit 0: the job succeeded), not "lost" and retried: run once.
    assert (job["state"], job["exit_code"]) == ("succeeded", 0), job["events"]
    assert not any("lost" in e["message"] for e in job["events"]), job["events"]
    assert lines(svc, jid) == [f"start {jid} 0"]


@pytest.fixture
def own_cluster() -> Iterator[RayCluster]:
    """A cluster of this test alone (its GCS is killed): a head and one worker node."""
    with local_cluster() as rc:
        rc.add("o1", "ro", "zo", gpus=0)
        yield rc


def readiness(svc: Service) -> dict[str, Any]:
    got: dict[str, Any] = httpx.get(f"{svc.url}/v1/readyz", timeout=5).json()
    return got


def test_the_service_outlives_an_outage_of_the_gcs_and_says_so(
    tmp_path: Path, own_cluster: RayCluster
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    svc = Service(home, free_port(), work, ["--ray", own_cluster.address])
    # Ray's driver ends its process 60 s into an outage of the GCS by default: 3 s here, so
    # that a service that does not keep it from doing so dies within the test.
    svc.extra_env = {"RAY_gcs_rpc_server_reconnect_timeout_s": "3"}
    svc.start(timeout_s=90)
    try:
        jid = submit(svc, "through-outage")
        wait_for("the task to start", lambda: lines(svc, jid), 60)
        gcs = own_cluster.cluster.head_node.all_processes["gcs_server"][0].process
        gcs.kill()  # SIGKILL
        gcs.wait(10)

        def says_unreachable() -> bool:
            r = readiness(svc)
            return not r["ready"] and any("Ray cluster is unreachable" in p for p in r["problems"])

        wait_for("readiness to say that Ray is unreachable", says_unreachable, 15)
        (svc.work / "release").touch()  # it ends while the GCS is down: still recorded
        job = svc.wait_state(jid, "succeeded", "failed", timeout_s=30)
        assert (job["state"], job["exit_code"]) == ("succeeded", 0), job["events"]
        time.sleep(5)  # past the 3 s after which Ray would have ended the process
        assert svc.proc is not None and svc.proc.poll() is None, "the service died with the GCS"
        assert says_unreachable()
    finally:
        svc.stop()

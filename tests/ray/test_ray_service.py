"""aisched on a real multi-node Ray cluster: `aisched up --ray ADDRESS` driven by the real CLI.

Tasks coordinate through files in the test's work directory (the cluster's nodes all live on
this machine, as nodes sharing a file system would), so nothing depends on timing: a task
writes what it saw, then blocks until a release file appears or it is stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Service, free_port, wait_for
from ray_harness import RayCluster, cancel_all, ray_gpus_in_use

from aisched.executors.ray_executor import sealed_above, writable_by_all
from aisched.executors.ray_task import TaskRunner

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)

PY = sys.executable
RACK_OF = {"a1": "ra", "a2": "ra", "b1": "rb", "b2": "rb"}

# Writes its environment to env-RANK-RESTART.json, appends "start ..." to events.log, blocks
# until `release` exists; on SIGTERM appends "stop RANK RESTART" and exits 0.
TASK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    rank, restart = os.environ["RANK"], os.environ["AISCHED_RESTART_COUNT"]
    def log(line):
        with open("events.log", "a") as f:
            f.write(line + "\\n")
    def term(*_):
        log(f"stop {rank} {restart}")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    keys = ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "AISCHED_TASK", "AISCHED_JOB_ID",
            "AISCHED_CHECKPOINT_DIR", "AISCHED_RESTART_COUNT")
    env = {k: os.environ.get(k) for k in keys}
    name = f"env-{os.environ['AISCHED_JOB_ID']}-{rank}-{restart}.json"
    with open(name + ".tmp", "w") as f:
        json.dump(env, f)
    os.replace(name + ".tmp", name)  # whole or absent: the test reads it as soon as it exists
    log(f"start {rank} {restart}")
    while not os.path.exists("release"):
        time.sleep(0.1)
    """
)


def job_file(svc: Service, name: str, **fields: Any) -> str:
    """A native job file running TASK, with `fields` on top of a 1-GPU, 0.5-CPU task."""
    (svc.work / "task.py").write_text(TASK)
    replicas = fields.pop("replicas", 1)
    resources = fields.pop("resources", {"cpus": 0.5, "gpus": 1, "mem": "256M"})
    doc = {
        "name": name,
        "grace_period": "10s",
        "tasks": [
            {
                "name": "worker",
                "replicas": replicas,
                "command": [PY, "task.py"],
                "resources": resources,
            }
        ],
        **fields,
    }
    path = svc.work / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def submit(svc: Service, name: str, **fields: Any) -> str:
    return str(svc.cli_json("submit", job_file(svc, name, **fields))["id"])


def env_of(svc: Service, job_id: str, rank: int, restart: int = 0) -> dict[str, str]:
    path = svc.work / f"env-{job_id}-{rank}-{restart}.json"
    wait_for(f"job {job_id} rank {rank} (restart {restart}) to start", path.exists, 60)
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def events(svc: Service) -> list[str]:
    path = svc.work / "events.log"
    return path.read_text().splitlines() if path.exists() else []


def tasks_of(svc: Service, job_id: str) -> list[dict[str, Any]]:
    return sorted(svc.job(job_id)["tasks"], key=lambda t: t["rank"])


def test_a_packed_gang_lands_in_one_rack_with_its_gpus_ranks_and_ray_reservations(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    # One GPU of rack `ra` taken first: a 4-GPU gang packed by rack then fits only in `rb`.
    blocker = submit(svc, "blocker", gpu_models=["T4"])
    env_of(svc, blocker, 0)
    blocked_rack = RACK_OF[tasks_of(svc, blocker)[0]["node"]]

    gang = submit(svc, "gang", replicas=4, topology={"pack": "rack"})
    envs = [env_of(svc, gang, r) for r in range(4)]
    tasks = tasks_of(svc, gang)

    racks = {RACK_OF[t["node"]] for t in tasks}
    assert len(racks) == 1 and racks != {blocked_rack}
    address = ray_cluster.nodes[tasks[0]["node"]].node_ip_address
    for rank, (env, t) in enumerate(zip(envs, tasks, strict=True)):
        on_node = [x["rank"] for x in tasks if x["node"] == t["node"]]
        assert env == {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, t["gpus"])),
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(on_node.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(on_node)),
            "NODE_RANK": env["NODE_RANK"],
            "MASTER_ADDR": address,
            "MASTER_PORT": envs[0]["MASTER_PORT"],
            "AISCHED_TASK": f"worker-{rank}",
            "AISCHED_JOB_ID": gang,
            "AISCHED_CHECKPOINT_DIR": str(svc.home / "checkpoints" / gang),
            "AISCHED_RESTART_COUNT": "0",
        }
    # The GPUs of one node are distinct; Ray reserved exactly what aisched placed, per node.
    for node in {t["node"] for t in tasks}:
        gpus = [g for t in tasks if t["node"] == node for g in t["gpus"]]
        assert len(gpus) == len(set(gpus))
    placed: dict[str, float] = {}
    for t in [*tasks, *tasks_of(svc, blocker)]:
        placed[t["node"]] = placed.get(t["node"], 0) + len(t["gpus"])
    in_use = ray_gpus_in_use(ray_cluster)
    assert {n: g for n, g in in_use.items() if g} == placed


# Without backfill's reservations, the reason a waiting gang gives is the placement's own.
@pytest.mark.up_args("--policy", "priority")
def test_a_gang_too_big_for_any_rack_waits_with_that_reason_and_starts_when_one_has_room(
    ray_service: Service,
) -> None:
    svc = ray_service
    # Bigger than any rack can ever be: refused at once, saying so.
    refused = svc.cli(
        "submit", job_file(svc, "never", replicas=5, topology={"pack": "rack"}), check=False
    )
    assert refused.returncode == 2
    assert "no rack has room for all 5 tasks" in refused.stderr
    # One GPU taken in each rack: a 4-GPU gang packed by rack fits in neither, for now.
    blockers = submit(svc, "blockers", replicas=2, topology={"spread": "rack"})
    for r in range(2):
        env_of(svc, blockers, r)
    jid = submit(svc, "gang", replicas=4, topology={"pack": "rack"})

    def waiting() -> dict[str, Any] | None:
        job = svc.job(jid)
        return job if job.get("reason") and "rack" in job["reason"] else None

    job = wait_for("the gang to say why it waits", waiting, 60)
    assert job["state"] == "pending" and not job["tasks"]

    svc.cli("cancel", blockers)

    envs = [env_of(svc, jid, r) for r in range(4)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert len({RACK_OF[t["node"]] for t in tasks_of(svc, jid)}) == 1


def test_a_higher_priority_job_preempts_a_gang_spread_over_nodes(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    low = submit(svc, "low", replicas=8, priority=0)  # every GPU of the four nodes
    for r in range(8):
        env_of(svc, low, r)
    assert len({t["node"] for t in tasks_of(svc, low)}) == 4

    high = submit(svc, "high", replicas=2, priority=100, topology={"pack": "node"})
    envs = [env_of(svc, high, r) for r in range(2)]

    assert {e["RANK"] for e in envs} == {"0", "1"}
    assert sorted(line for line in events(svc) if line.startswith("stop")) == sorted(
        f"stop {r} 0" for r in range(8)
    )
    job = svc.job(low)
    assert job["state"] == "pending" and job["preemptions"] == 1
    assert svc.job(high)["state"] == "running"


def test_cancel_stops_every_task_on_every_node(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    jid = submit(svc, "spread", replicas=4, topology={"spread": "node"})
    for r in range(4):
        env_of(svc, jid, r)
    assert len({t["node"] for t in tasks_of(svc, jid)}) == 4

    svc.cli("cancel", jid)

    job = svc.wait_state(jid, "cancelled", timeout_s=60)
    assert sorted(line for line in events(svc) if line.startswith("stop")) == [
        f"stop {r} 0" for r in range(4)
    ]
    assert {t["exit_kind"] for t in job["tasks"]} == {"stopped"}
    wait_for("Ray to give every GPU back", lambda: not any(ray_gpus_in_use(ray_cluster).values()))


def test_losing_a_node_fails_the_attempt_and_restarts_the_job_on_healthy_nodes(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    # Three nodes of their own (GPU model K80, rack rk), one GPU each: noticed as they join.
    for name in ("k1", "k2", "k3"):
        ray_cluster.add(name, "rk", "z3", gpus=1, cpus=1, model="K80")
    try:
        wait_for(
            "the new nodes to be noticed",
            lambda: {"k1", "k2", "k3"} <= {n["name"] for n in svc.cli_json("nodes")["nodes"]},
            30,
        )
        jid = submit(
            svc,
            "survivor",
            replicas=2,
            gpu_models=["K80"],
            restart={"policy": "on-failure", "max_retries": 2, "backoff": "1s"},
        )
        first = [env_of(svc, jid, r) for r in range(2)]
        lost = tasks_of(svc, jid)[0]["node"]

        ray_cluster.remove(lost)

        second = [env_of(svc, jid, r, restart=1) for r in range(2)]
        job = svc.wait_state(jid, "running")
        assert job["attempt"] == 2 and job["failures"] == 1
        assert lost not in {t["node"] for t in tasks_of(svc, jid)}
        assert {e["AISCHED_CHECKPOINT_DIR"] for e in first + second} == {
            str(svc.home / "checkpoints" / jid)
        }
        # Which Ray says first, the agent's death or the node's, is a race of Ray's own (its
        # health check marks a node dead seconds after its processes are gone): either is the
        # attempt's cause, in words that name it.
        assert any(
            "left the cluster" in e["message"] or "Ray agent died" in e["message"]
            for e in job["events"]
        ), job["events"]
        wait_for(
            "the lost node to leave the node list",
            lambda: lost not in {n["name"] for n in svc.cli_json("nodes")["nodes"]},
            30,
        )
    finally:
        cancel_all(svc)
        for name in ("k1", "k2", "k3"):
            if name in ray_cluster.nodes:
                ray_cluster.remove(name)


def test_an_unreachable_ray_address_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [PY, "-m", "aisched", "up", "--data-dir", str(tmp_path), "--ray", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stderr.startswith("error: cannot reach the Ray cluster at 127.0.0.1:9"), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("answers", ["nothing", "HTTP/1.1"])
def test_an_address_that_is_no_ray_gcs_is_a_clear_error(tmp_path: Path, answers: str) -> None:
    """Something that takes the connection but is no GCS (a stopped GCS, another program on
    the port) hung `aisched up --ray` without a word: ray.init waits for a GCS for as long as
    an outage may last."""
    import http.server
    import subprocess
    import threading

    if answers == "nothing":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        port, close = server.getsockname()[1], server.close
    else:
        http_server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        threading.Thread(target=http_server.serve_forever, daemon=True).start()
        port, close = http_server.server_port, http_server.shutdown
    try:
        proc = subprocess.run(
            [PY, "-m", "aisched", "up", "--data-dir", str(tmp_path), "--socket", "",
             "--port", str(free_port()), "--ray", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        close()
    want = {
        "nothing": f"error: the Ray cluster at 127.0.0.1:{port} does not answer within 5 s",
        "HTTP/1.1": f"error: 127.0.0.1:{port} answers, but not as a Ray head's GCS",
    }[answers]
    assert (proc.returncode, proc.stderr.startswith(want)) == (2, True), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


# A short start timeout makes the test quick; on a loaded machine Ray may also be slower than
# that to start the workers of tasks that do have room, so retries are many and quick.
@pytest.mark.up_config({"ray_start_timeout": "5s", "max_backoff": "2s"})
def test_a_gang_whose_task_ray_cannot_start_is_rolled_back_whole_and_retried(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    # Work aisched does not know of holds one GPU of every node in Ray's own accounting: an
    # 8-GPU gang placed by aisched cannot have all its tasks started by Ray.
    ray_gpus_in_use(ray_cluster)  # connects the test's driver
    # An actor class the Ray workers can import; created, it only holds its reservation.
    holder = ray.remote(num_gpus=1, num_cpus=0)(TaskRunner)
    strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    foreign = [
        holder.options(scheduling_strategy=strategy(node.node_id, soft=False)).remote({})
        for node in ray_cluster.nodes.values()
    ]
    ray.get([h.status.remote() for h in foreign])
    try:
        jid = submit(
            svc,
            "gang",
            replicas=8,
            restart={"policy": "on-failure", "max_retries": 30, "backoff": "1s"},
        )

        def rolled_back() -> dict[str, Any] | None:
            job = svc.job(jid)
            return job if job["failures"] >= 1 and job["state"] == "pending" else None

        job = wait_for("the gang to be rolled back", rolled_back, 60)
        lost = [e["message"] for e in job["events"] if "could not start" in e["message"]]
        assert lost and all("did not start it" in m for m in lost)
        started = {line.split()[1] for line in events(svc) if line.startswith("start")}
        stopped = {line.split()[1] for line in events(svc) if line.startswith("stop")}
        assert started == stopped  # every task that had started was stopped again
        wait_for(
            "Ray to hold only the foreign GPUs",
            lambda: sum(ray_gpus_in_use(ray_cluster).values()) == len(foreign),
        )
    finally:
        for h in foreign:
            ray.kill(h)

    # With the foreign work gone, a retry starts every task.
    def all_started() -> bool:
        return any(
            all((svc.work / f"env-{jid}-{rank}-{restart}.json").exists() for rank in range(8))
            for restart in range(1, 31)
        )

    wait_for("a retry to start every task", all_started, 120)
    assert svc.job(jid)["state"] == "running"


def test_a_restarted_aisched_adopts_the_gang_still_running_on_ray(ray_service: Service) -> None:
    svc = ray_service
    jid = submit(svc, "adopted", replicas=2, topology={"spread": "node"})
    for r in range(2):
        env_of(svc, jid, r)

    svc.kill9()  # the tasks are detached Ray actors: they keep running
    svc.start(timeout_s=90)

    job = svc.job(jid)
    assert (job["state"], job["attempt"]) == ("running", 1)
    assert [e["kind"] for e in job["events"]].count("adopted") == 2
    (svc.work / "release").touch()
    job = svc.wait_state(jid, "succeeded", "failed", timeout_s=60)
    assert job["state"] == "succeeded", job["events"]
    assert [line for line in events(svc) if line.startswith("stop")] == []


def test_output_exit_codes_and_bad_commands_are_reported_as_on_one_machine(
    ray_service: Service,
) -> None:
    svc = ray_service
    script = "echo to-stdout; echo to-stderr >&2; exit 3"
    failing = svc.run("--cpus", "0.5", "--restart", "never", "--", "sh", "-c", script)
    missing = svc.run("--cpus", "0.5", "--restart", "never", "--", "no-such-command-here")

    job = svc.wait_state(failing, "failed", timeout_s=60)
    assert job["exit_code"] == 3 and "exited with code 3" in job["message"]
    logs = svc.cli("logs", failing).stdout
    assert "to-stdout" in logs and "to-stderr" in logs
    job = svc.wait_state(missing, "failed", timeout_s=60)
    assert job["exit_code"] == 127 and "command not found: no-such-command-here" in job["message"]
    # As on one machine, not found is for good (the restart policy aside): not retried.
    assert job["message"].endswith("; not retried"), job["message"]


REPLICA = Path(__file__).parents[2] / "examples" / "services" / "http_replica.py"


def test_a_service_on_ray_serves_from_its_nodes_addresses_where_the_autoscaler_probes(
    ray_service: Service,
) -> None:
    svc = ray_service
    doc = {
        "name": "web",
        "kind": "service",
        "command": [PY, str(REPLICA)],
        "resources": {"cpus": 0.25, "mem": "128M"},
        "service": {"min_replicas": 2, "max_replicas": 2, "readiness_path": "/healthz"},
    }
    path = svc.work / "web.json"
    path.write_text(json.dumps(doc))
    sid = str(svc.cli_json("submit", str(path))["id"])

    def ready() -> dict[str, Any] | None:
        st: dict[str, Any] = svc.job(sid)["service"]
        return st if st["ready"] == 2 else None

    st = wait_for("two ready replicas", ready, 90)
    assert len(st["endpoints"]) == 2
    for endpoint in st["endpoints"]:  # each one answers where the autoscaler found it
        with httpx.Client(trust_env=False) as client:
            assert client.get(f"http://{endpoint}/hello", timeout=10).text == "ok"


def test_ray_files_every_local_user_may_change_are_named_at_start(ray_service: Service) -> None:
    # Ray makes its temporary directory (/tmp/ray unless told --temp-dir) 0777 without the
    # sticky bit: any local user may replace root's workers' sockets there. Said nowhere.
    temp = "/tmp/ray"
    assert writable_by_all(temp)  # as Ray made it for this cluster
    assert (
        f"Ray's files at {temp} may be changed by every local user (mode 777): start Ray with "
        "--temp-dir inside a directory of root's alone on every node (docs/ray.md)"
    ) in ray_service.log.read_text()


def test_a_directory_writable_by_all_is_told_from_a_shared_or_a_private_one(
    tmp_path: Path,
) -> None:
    for mode, open_to_all in ((0o777, True), (0o1777, False), (0o755, False), (0o700, False)):
        d = tmp_path / f"{mode:o}"
        d.mkdir()
        d.chmod(mode)
        assert writable_by_all(str(d)) is open_to_all, oct(mode)
    assert not writable_by_all(str(tmp_path / "missing"))


def test_ray_files_inside_a_directory_closed_to_others_are_out_of_their_reach() -> None:
    """docs/ray.md has Ray's 0777 temporary directory put inside a directory of root's alone
    (0700): no other user can enter it, so the start-up warning must not name it, as it did.
    A directory closed to others but inside one that others may change is no seal: its owner
    could rename it away."""
    top = tempfile.mkdtemp(dir="/tmp")  # /tmp: reachable by every local user
    try:
        os.chmod(top, 0o755)
        for closed_mode, seals in ((0o700, True), (0o710, False), (0o701, False)):
            closed = os.path.join(top, f"closed-{closed_mode:o}")
            os.mkdir(closed, closed_mode)
            os.chmod(closed, closed_mode)
            ray_temp = os.path.join(closed, "tmp")
            os.mkdir(ray_temp)
            os.chmod(ray_temp, 0o777)
            assert writable_by_all(ray_temp)
            assert sealed_above(ray_temp) is seals, oct(closed_mode)
        open_temp = os.path.join(top, "open")
        os.mkdir(open_temp)
        os.chmod(open_temp, 0o777)
        assert not sealed_above(open_temp)  # / , /tmp and top let everyone through
        os.chmod(top, 0o777)  # anyone may now rename closed-700 and put theirs there
        assert not sealed_above(os.path.join(top, "closed-700", "tmp"))
    finally:
        shutil.rmtree(top)


def test_sigterm_stops_aisched_on_ray_in_order(ray_service: Service) -> None:
    """`ray.init` put its own SIGTERM handler in place of aisched's: a SIGTERM printed Ray's
    stack dump and exited 15, where `systemctl stop` expects the orderly stop (exit 0)."""
    assert ray_service.proc is not None
    ray_service.proc.send_signal(signal.SIGTERM)
    assert ray_service.proc.wait(60) == 0, ray_service.log.read_text()[-2000:]
    log = ray_service.log.read_text()
    assert "aisched: SIGTERM: stopping" in log and "*** SIGTERM received" not in log

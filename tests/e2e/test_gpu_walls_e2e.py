"""GPU walls: a real `aisched up` as root runs real local users' host tasks, each in a cgroup v1
`devices` cgroup that denies the device files of the GPUs it was not given, so a task that
sets CUDA_VISIBLE_DEVICES again still opens its own GPUs only.

Before this, CUDA_VISIBLE_DEVICES was the only fence: every task could open every
`/dev/nvidiaN` (the driver makes them 0666), other users' jobs' GPUs included.

This machine has no GPU, so the service is told which files are its 4 declared GPUs
(`node.gpu_device_files`): real character devices made here with the numbers of /dev/zero,
/dev/full, /dev/random and /dev/urandom. The kernel's device cgroup checks the numbers, as it
would NVIDIA's (major 195).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_stand_ins import OPEN_PROBE, STAND_INS, stand_in_files
from gpu_stand_ins import seen as stand_in_seen
from harness import Service, free_port, local_service, wait_for
from users import User

from aisched.executors.cgroups import cgroup_name
from aisched.executors.instance import instance_tag

V1_DEVICES = Path("/sys/fs/cgroup/devices")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (V1_DEVICES / "devices.deny").exists(),
    reason="needs root and a cgroup v1 devices hierarchy",
)

FAKE_GPUS = STAND_INS  # the service's 4 declared GPUs

# What a task sees (`OPEN_PROBE`), and whether it can get out of its devices cgroup (write a
# rule that allows all, or join the parent); then it waits for the file $GO, if given.
PROBE = (
    OPEN_PROBE
    + r"""
line = next(ln for ln in open("/proc/self/cgroup") if ":devices:" in ln)
mine = "/sys/fs/cgroup/devices" + line.strip().split(":", 2)[2]
for target, value in ((mine + "/devices.allow", "a"),
                      (os.path.dirname(mine) + "/cgroup.procs", str(os.getpid()))):
    try:
        with open(target, "w") as f:
            f.write(value)
        print("escaped through", target)
    except OSError as e:
        print("held", errno.errorcode[e.errno])
go = os.environ.get("GO")
while go and not os.path.exists(go):
    __import__("time").sleep(0.1)
"""
)


@pytest.fixture
def gpu_files() -> Iterator[list[str]]:
    with stand_in_files(len(FAKE_GPUS)) as files:
        yield files


@pytest.fixture
def service(tmp_path: Path, gpu_files: list[str]) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    config = f"node: {{gpu_device_files: {json.dumps(gpu_files)}}}\n"
    with local_service(tmp_path, config=config) as svc:
        yield svc


def run_as(svc: Service, user: User, *args: str) -> str:
    proc = user.aisched("run", "--json", *args, env={"AISCHED_SERVER": f"unix:{svc.socket}"})
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["id"])


def probe(svc: Service, user: User, gpus: int, gpu_files: list[str], go: Path | None) -> str:
    env = ["--env", f"GO={go}"] if go is not None else []
    return run_as(
        svc, user, "--gpus", str(gpus), "--mem", "64M", *env, "--",
        "python3", "-u", "-c", PROBE, *gpu_files,
    )  # fmt: skip


def seen(svc: Service, job_id: str) -> dict[str, str]:
    return stand_in_seen(svc.cli("logs", job_id).stdout)


def devices_cgroups(svc: Service, job_id: str) -> list[Path]:
    """The devices cgroup of the job's task (first attempt), named as the service names it."""
    name = cgroup_name(instance_tag((svc.home / "tasks").resolve()), job_id, 1, "main-0")
    return [p for p in V1_DEVICES.rglob(name) if p.is_dir()]


@pytest.mark.usefixtures("local_users")
def test_each_task_opens_its_own_gpus_only_and_cannot_leave_its_wall(
    service: Service, local_users: dict[str, User], gpu_files: list[str]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    go_a, go_b = alice.home / ".gpu-walls-go", bob.home / ".gpu-walls-go"
    for go in (go_a, go_b):
        go.unlink(missing_ok=True)
    two = probe(service, alice, 2, gpu_files, go_a)
    one = probe(service, bob, 1, gpu_files, go_b)
    try:
        for jid in (two, one):
            wait_for(f"{jid} to print", lambda jid=jid: "held" in seen(service, jid))
        holders = {}
        for jid, count in ((two, 2), (one, 1)):
            out = seen(service, jid)
            mine = [int(g) for g in out["AISCHED_GPUS"].split(",")]
            assert len(mine) == count, out
            # CUDA numbers the GPUs a task can open from 0, as in a container.
            assert out["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(count)))
            for i, (name, _, _) in enumerate(FAKE_GPUS):
                assert out[name] == ("opens" if i in mine else "EPERM"), (jid, out)
            # The task's user can neither widen its rules nor leave for the parent cgroup.
            assert out["held"] == "EACCES" and out["held-2"] == "EACCES", out
            assert not any(k == "escaped" for k in out), out
            assert devices_cgroups(service, jid), "no devices cgroup for the job"
            holders[jid] = mine
        # Three different GPUs: the two jobs ran side by side on GPUs of their own.
        assert len(set(holders[two]) | set(holders[one])) == 3
    finally:
        go_a.touch()
        go_b.touch()
    for jid in (two, one):
        service.wait_state(jid, "succeeded")
        wait_for("its devices cgroup to go", lambda jid=jid: devices_cgroups(service, jid) == [])


def test_a_task_without_gpus_opens_none_and_root_is_walled_too(
    service: Service, gpu_files: list[str]
) -> None:
    # The service's own user (root here): the device cgroup holds for root as for anyone.
    jid = service.run("--", sys.executable, "-c", PROBE, *gpu_files)
    service.wait_state(jid, "succeeded")
    out = seen(service, jid)
    assert [out[name] for name, _, _ in FAKE_GPUS] == ["EPERM"] * 4, out
    assert out["CUDA_VISIBLE_DEVICES"] == "" and out["AISCHED_GPUS"] == "", out
    # The start-up lines say the walls are up, and where.
    assert "GPU walls: devices cgroups (v1) under" in service.log.read_text()


def _up(tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "aisched", "up", "--port", str(free_port()), "--data-dir",
         str(home), "--socket", "", "--gpus", "2", "--config", str(home / "config.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


def test_gpu_device_files_that_are_not_the_gpus_stop_the_start_with_what_is_wrong(
    tmp_path: Path, gpu_files: list[str]
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    for files, want in [
        ([gpu_files[0]], "node.gpu_device_files: 1 files for 2 GPUs"),
        ([gpu_files[0], str(plain)], f"node.gpu_device_files[1]: {plain} is not a character"),
        ([gpu_files[0], str(tmp_path / "gone")], f"node.gpu_device_files[1]: {tmp_path}/gone:"),
        ([gpu_files[0], gpu_files[0]], "two GPUs have the same device file"),
        (["dev/nvidia0", "dev/nvidia1"], "node.gpu_device_files: [0]: 'dev/nvidia0' is not an"),
    ]:
        proc = _up(tmp_path, f"node: {{gpu_device_files: {json.dumps(files)}}}\n")
        assert proc.returncode != 0, files
        assert want in proc.stderr, (files, proc.stderr)


def test_a_walled_task_stays_walled_across_a_kill_9_of_the_service(
    service: Service, gpu_files: list[str], tmp_path: Path
) -> None:
    # The task probes only once told to, after the service was killed and started again.
    go = tmp_path / "go"
    script = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\n" + PROBE
    jid = service.run("--gpus", "1", "--", sys.executable, "-u", "-c", script, *gpu_files)
    service.wait_state(jid, "running")
    wait_for("its devices cgroup", lambda: devices_cgroups(service, jid))
    service.kill9()
    service.start()
    go.touch()
    service.wait_state(jid, "succeeded")
    out = seen(service, jid)
    mine = int(out["AISCHED_GPUS"])
    assert [out[name] for name, _, _ in FAKE_GPUS] == [
        "opens" if i == mine else "EPERM" for i in range(len(FAKE_GPUS))
    ], out
    # Adopted by the new service, and its devices cgroup removed once it ended.
    wait_for("its devices cgroup to go", lambda: devices_cgroups(service, jid) == [])

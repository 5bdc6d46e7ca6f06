"""A container job of a real local user runs as that user (uid, groups, home, its checkpoint
directory its own), and may not mount a host path that user cannot read.

Needs the run-as-user machinery and its test helpers (`users.py`: real accounts made with
useradd, the CLI run through setpriv); skipped with the reason where they are absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from container_image import build_test_image, missing_tools
from harness import Service, local_service, wait_for

from aisched.executors.instance import instance_tag

users = pytest.importorskip("users", reason="needs tests/e2e/users.py (run-as-user helpers)")

pytestmark = [
    pytest.mark.skipif(
        (why := missing_tools()) is not None or os.geteuid() != 0,
        reason=why or "the container tests run rootful podman (CI runs as root)",
    ),
    pytest.mark.usefixtures("local_users"),
]

STAT = "import os, sys; st = os.stat(sys.argv[1]); print(st.st_uid, oct(st.st_mode & 0o777))"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes
    with local_service(tmp_path) as svc:
        yield svc


def as_user(svc: Service, user: Any, *args: str) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = user.aisched(
        *args, env={"AISCHED_SERVER": f"unix:{svc.socket}"}
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_users_container_runs_as_the_user(service: Service, local_users: Any) -> None:
    image = build_test_image()
    alice = local_users["alice"]
    script = (
        'id -u; id -G; echo "$HOME $USER"; touch "$AISCHED_CHECKPOINT_DIR/saved"; '
        f'python3 -c "{STAT}" "$AISCHED_CHECKPOINT_DIR"'
    )
    proc = as_user(service, alice, "run", "--json", "--image", image, "--", "sh", "-c", script)
    jid = str(json.loads(proc.stdout)["id"])
    service.wait_state(jid, "succeeded", timeout_s=60)
    team = subprocess.run(["getent", "group", users.GROUP], capture_output=True, text=True)
    team_gid = int(team.stdout.split(":")[2])
    out = as_user(service, alice, "logs", jid).stdout.splitlines()
    assert out[0] == str(alice.uid)
    assert sorted(int(g) for g in out[1].split()) == sorted({alice.gid, team_gid})
    assert out[2:] == [f"{alice.home} {alice.name}", f"{alice.uid} 0o700"]
    assert (Path(service.job(jid)["checkpoint_dir"]) / "saved").owner() == alice.name


def failed_mount(service: Service, user: Any, volumes: str) -> tuple[str, dict[str, Any]]:
    """Submit, as `user`, a container job with these `volumes` (YAML flow list) that should
    fail to start; its id and its row once failed."""
    (user.home / "mounts.yaml").write_text(
        f"image: {build_test_image()}\ncommand: 'true'\nrestart: {{policy: never}}\n"
        f"volumes: {volumes}\n"
    )
    proc = as_user(service, user, "submit", "--json", str(user.home / "mounts.yaml"))
    jid = str(json.loads(proc.stdout)["id"])
    job = service.wait_state(jid, "failed", timeout_s=60)
    kinds = [e["kind"] for e in job["events"]]
    assert "started" not in kinds and "placed" in kinds  # refused: its task never ran
    return jid, job


def test_a_users_job_may_not_mount_what_the_user_cannot_read(
    service: Service, local_users: Any
) -> None:
    alice = local_users["alice"]
    secret = Path(tempfile.mkdtemp())  # root's, 0700
    try:
        jid, job = failed_mount(service, alice, f"[{{host_path: {secret}, path: /s}}]")
        assert job["message"] == (
            f"task main-0 could not start: task {jid}/1/main-0: volumes.0: user {alice.name} "
            f"may not read {secret}, so its job may not mount it; not retried"
        )
    finally:
        secret.rmdir()


def test_a_users_volume_inside_another_may_not_make_root_create_files_there(
    service: Service, local_users: Any
) -> None:
    # Root's engine makes a missing mount point inside a mounted host directory before the
    # container starts: a volume at /r/planted inside a directory alice may only read would
    # leave root's empty `planted` there (the way to an empty /etc/nologin).
    alice = local_users["alice"]
    readable = Path(tempfile.mkdtemp())
    readable.chmod(0o755)
    try:
        volumes = (
            f"[{{host_path: {readable}, path: /r}}, {{host_path: {alice.home}, path: /r/planted}}]"
        )
        jid, job = failed_mount(service, alice, volumes)
        assert job["message"] == (
            f"task main-0 could not start: task {jid}/1/main-0: volumes.1: /r/planted is "
            f"inside volumes.0 (/r from {readable}), so the engine would create "
            f"{readable}/planted as root, and user {alice.name} may not write {readable}: "
            f"mount it elsewhere, or make {readable}/planted first; not retried"
        )
        assert list(readable.iterdir()) == []
    finally:
        shutil.rmtree(readable)


def test_a_link_in_a_users_mount_does_not_lead_a_nested_mount_into_another(
    service: Service, local_users: Any
) -> None:
    # ~/A/lnk -> /tmp/X (alice's, so checked alone it looks like hers), and a second volume
    # mounts root's directory at /tmp/X: inside the container /a/lnk/planted is in root's one.
    alice = local_users["alice"]
    readable, x = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    readable.chmod(0o755)
    mine = alice.home / "A"
    shutil.rmtree(mine, ignore_errors=True)
    try:
        for d in (x, mine, alice.home / "src"):
            d.mkdir(exist_ok=True)
            os.chown(d, alice.uid, alice.gid)
        (mine / "lnk").symlink_to(x)
        os.lchown(mine / "lnk", alice.uid, alice.gid)
        volumes = (
            f"[{{host_path: {mine}, path: /a}}, {{host_path: {readable}, path: {x}}}, "
            f"{{host_path: {alice.home / 'src'}, path: /a/lnk/planted}}]"
        )
        _, job = failed_mount(service, alice, volumes)
        assert "through " in job["message"] and "a symbolic link" in job["message"], job
        assert list(readable.iterdir()) == []
    finally:
        for d in (readable, x, mine):
            shutil.rmtree(d, ignore_errors=True)


def test_a_users_first_container_leaves_its_home_its_own(
    service: Service, local_users: Any
) -> None:
    # The checkpoint directory's missing parents (~/.aisched/checkpoints) are made by the user,
    # not by the service as root: else the user's later plain jobs could not make theirs there.
    image = build_test_image()
    alice = local_users["alice"]
    subprocess.run(["rm", "-rf", "--", str(alice.home / ".aisched")], check=True)
    proc = as_user(service, alice, "run", "--json", "--image", image, "--", "true")
    jid = str(json.loads(proc.stdout)["id"])
    service.wait_state(jid, "succeeded", timeout_s=60)
    made = Path(service.job(jid)["checkpoint_dir"])
    for d in [made, *made.parents]:
        if d == alice.home:
            break
        assert d.owner() == alice.name, d
    assert made.stat().st_mode & 0o777 == 0o700
    proc = as_user(
        service, alice, "run", "--json", "--", "sh", "-c", 'touch "$AISCHED_CHECKPOINT_DIR/x"'
    )
    plain = str(json.loads(proc.stdout)["id"])
    service.wait_state(plain, "succeeded", timeout_s=30)


def test_a_checkpoint_directory_the_user_made_a_link_is_refused(
    service: Service, local_users: Any
) -> None:
    # The engine mounts the checkpoint directory read-write as root: a link alice placed where
    # her next job's would be made must not hand that job a directory she may not read.
    image = build_test_image()
    alice = local_users["alice"]
    proc = as_user(service, alice, "run", "--json", "--image", image, "--", "true")
    first = str(json.loads(proc.stdout)["id"])
    service.wait_state(first, "succeeded", timeout_s=60)
    nxt = str(int(first) + 1)
    ckpt = Path(service.job(first)["checkpoint_dir"].removesuffix(f"-{first}") + f"-{nxt}")
    secret = Path(tempfile.mkdtemp())  # root's, 0700
    try:
        (secret / "root-only").touch()
        ckpt.symlink_to(secret)
        os.lchown(ckpt, alice.uid, alice.gid)
        (alice.home / "ckpt.yaml").write_text(
            f"image: {image}\ncommand: 'ls $AISCHED_CHECKPOINT_DIR'\nrestart: {{policy: never}}\n"
        )
        proc = as_user(service, alice, "submit", "--json", str(alice.home / "ckpt.yaml"))
        jid = str(json.loads(proc.stdout)["id"])
        job = service.wait_state(jid, "failed", timeout_s=60)
        assert (jid, job["checkpoint_dir"]) == (nxt, str(ckpt))
        assert job["message"] == (
            f"task main-0 checkpoint directory {ckpt} is a symbolic link, "
            "which the engine would follow with root's rights: refused; remove it; restart "
            "policy is never"
        )
        assert "root-only" not in as_user(service, alice, "logs", jid).stdout
    finally:
        ckpt.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", "--", str(secret)], check=True)


# Forks until refused (at most 60, short of the container's own pids limit of 64), says how
# many it got, and keeps them while the test reads its user's pids cgroup.
FORKS = """
import os, time
kids = []
try:
    for _ in range(60):
        pid = os.fork()
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print("fork refused after", len(kids), flush=True)
else:
    print("forked", len(kids), flush=True)
time.sleep(120)
"""
USER_PIDS = 37  # an odd bound: its user cgroup is this service's alone (`user_cgroup`)


def _pids_cgroup(pid: int) -> str:
    """The v1 pids cgroup of process `pid`, as a directory."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return os.path.join("/sys/fs/cgroup/pids", path.lstrip("/"))
    raise AssertionError(f"process {pid} has no v1 pids cgroup")


def _procs_below(cgroup: str) -> set[int]:
    return {
        int(p) for d, _, _ in os.walk(cgroup) for p in Path(d, "cgroup.procs").read_text().split()
    }


@pytest.mark.skipif(
    not os.path.isdir("/sys/fs/cgroup/pids"), reason="needs a cgroup v1 pids hierarchy"
)
def test_a_users_container_processes_count_in_the_users_pids_cgroup(
    tmp_path: Path, local_users: Any
) -> None:
    image = build_test_image()
    alice = local_users["alice"]
    tmp_path.chmod(0o755)  # the users' jobs run in their homes
    config = f"container_pids_limit: 64\nuser_pids_limit: {USER_PIDS}\n"
    with local_service(tmp_path, config) as svc:
        proc = as_user(svc, alice, "run", "--json", "--image", image, "--", "python3", "-c", FORKS)
        jid = str(json.loads(proc.stdout)["id"])
        svc.wait_state(jid, "running", timeout_s=60)
        out = wait_for("the task's fork count", lambda: svc.cli("logs", jid).stdout.strip())
        instance = instance_tag((svc.home / "tasks").resolve())
        names = subprocess.run(
            ["podman", "ps", "--filter", f"label=io.aisched.job={jid}",
             "--filter", f"label=io.aisched.instance={instance}", "--format", "{{.ID}}"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert len(names) == 1
        init = int(
            subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Pid}}", names[0]],
                capture_output=True,
                text=True,
                check=True,
            ).stdout  # fmt: skip
        )
        # The container's cgroup is under the user's, which is under aisched's: the user's
        # bound and the one of all tasks count its processes.
        user = os.path.dirname(_pids_cgroup(init))
        assert os.path.basename(user) == f"user-{alice.uid}.max-{USER_PIDS}"
        assert os.path.basename(os.path.dirname(user)) == "aisched"
        assert Path(user, "pids.max").read_text().strip() == str(USER_PIDS)
        inside = _procs_below(_pids_cgroup(init))
        assert init in inside and len(inside) > 20
        assert inside <= _procs_below(user)
        assert int(Path(user, "pids.current").read_text()) >= len(inside)
        # So the user's bound stops the forks, not the container's 64.
        words = out.split()
        assert words[:3] == ["fork", "refused", "after"]
        assert int(words[3]) < USER_PIDS
        svc.cli("cancel", jid)
        svc.wait_state(jid, "cancelled", timeout_s=60)

"""A job's /dev/shm: a real `aisched up` as root runs real local users' host tasks, each job
attempt with a private tmpfs over /dev/shm that its tasks on the node share, that no other job
sees, that is bounded, and that is unmounted and removed once its last task has ended, also
after a kill -9 of the service or of a task's supervisor.

Before this, a task's files in /dev/shm stayed in the host's tmpfs after it ended, so a user
could fill it (half the machine's memory) for every other user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, cancel_all, free_port, local_service, wait_for
from users import User

pytestmark = pytest.mark.usefixtures("local_users")

HOST_SHM = Path("/dev/shm")


@pytest.fixture
def tok() -> Iterator[str]:
    """A name for the files a test's tasks write, unique on this machine; whatever reached the
    host's /dev/shm under it is removed after the test."""
    name = f"ais-shm-{uuid.uuid4().hex[:12]}"
    yield name
    for leftover in HOST_SHM.glob(f"{name}*"):
        leftover.unlink(missing_ok=True)


def start(tmp_path: Path, config: str | None = None) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    with local_service(tmp_path, config=config) as svc:
        yield svc


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from start(tmp_path)


WAIT_FOR_GO = 'while [ ! -e "$GO" ]; do sleep 0.1; done'


def run_as(svc: Service, user: User, *args: str) -> str:
    proc = user.aisched("run", "--json", *args, env={"AISCHED_SERVER": f"unix:{svc.socket}"})
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["id"])


def logs(svc: Service, job_id: str) -> str:
    return svc.cli("logs", job_id).stdout


def mounts_under(path: Path) -> list[str]:
    """The mount points below `path` in this (the host's) mount namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        targets = [line.split()[4] for line in f]
    return [t for t in targets if t.startswith(f"{path}/")]


def mounted_anywhere(dev: int, svc: Service, users: list[User]) -> list[str]:
    """The processes (this one, and those of `users`) in whose mount namespace the filesystem
    `dev` is mounted as a job's /dev/shm: at /dev/shm, or under the service's tmpfs folder.

    Only there: once the kernel frees a tmpfs, its device number goes to the next filesystem
    mounted anywhere on the machine (another test's, on the other pytest worker), which the
    host's namespace and every slave of it (a job's) then show at that mount's own path."""
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    ours = str(svc.home / "tasks" / ".shm") + "/"
    uids = {u.uid for u in users}
    holders = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.name != str(os.getpid()) and proc.stat().st_uid not in uids:
                continue
            lines = (proc / "mountinfo").read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        for fields in (line.split() for line in lines):
            if fields[2] == wanted and (fields[4] == "/dev/shm" or fields[4].startswith(ours)):
                holders.append(proc.name)
                break
    return holders


def nothing_left(svc: Service, tok: str) -> None:
    """No file of the test in the host's /dev/shm, no tmpfs mounted for a job, and no
    directory left where one was."""
    assert sorted(p.name for p in HOST_SHM.glob(f"{tok}*")) == []
    assert mounts_under(svc.home) == []
    shm_root = svc.home / "tasks" / ".shm"
    assert not shm_root.exists() or list(shm_root.iterdir()) == []


def test_a_tasks_dev_shm_is_its_jobs_own_and_goes_when_the_job_ends(
    service: Service, local_users: dict[str, User], tok: str
) -> None:
    alice = local_users["alice"]
    jid = run_as(
        service, alice, "--mem", "256M", "--env", f"TOK={tok}", "--",
        "sh", "-c", 'echo kept > "/dev/shm/$TOK"; stat -c "%U %a" /dev/shm; '
        "df -m /dev/shm | tail -n 1 | awk '{print $2}'",
    )  # fmt: skip
    service.wait_state(jid, "succeeded")
    # Owned by the job's user, and as big as the memory the job asked for here.
    assert logs(service, jid).splitlines() == [f"{alice.name} 700", "256"]
    nothing_left(service, tok)


def test_the_tasks_of_one_job_share_dev_shm_and_another_job_does_not_see_it(
    service: Service, local_users: dict[str, User], tok: str
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    go, go_bob = alice.home / f".{tok}-go", bob.home / f".{tok}-go"
    # Each of the two tasks writes its file, waits for the other's (through /dev/shm alone),
    # then holds on until the test says go.
    script = (
        'me=$AISCHED_TASK_INDEX; other=$((1 - me)); echo "$me" > "/dev/shm/$TOK-$me"; '
        'i=0; while [ ! -e "/dev/shm/$TOK-$other" ]; do i=$((i+1)); '
        '[ $i -gt 600 ] && { echo "no file of task $other"; exit 1; }; sleep 0.1; done; '
        'echo "task $me sees task $other"; '
        f"{WAIT_FOR_GO}"
    )
    gang = run_as(
        service, alice, "--replicas", "2", "--mem", "64M", "--env", f"TOK={tok}",
        "--env", f"GO={go}", "--", "sh", "-c", script,
    )  # fmt: skip
    try:
        wait_for(
            "both tasks to see each other's file",
            lambda: logs(service, gang).count(" sees task ") == 2,
        )
        # Another job of the same user, and one of another user, see none of it.
        for user in (alice, bob):
            other = run_as(service, user, "--", "sh", "-c", "ls -A /dev/shm; echo end")
            service.wait_state(other, "succeeded")
            assert logs(service, other).splitlines() == ["end"]
        # The tasks' shares added up: 64 MiB each.
        (shm_dir,) = (service.home / "tasks" / ".shm").glob(f"{gang}.*")
        size = os.statvfs(shm_dir)
        assert size.f_blocks * size.f_frsize == 128 << 20
        tmpfs = os.stat(shm_dir).st_dev
        assert mounted_anywhere(tmpfs, service, [alice, bob])
        # A job that starts now and outlives the gang must not keep the gang's tmpfs alive.
        later = run_as(
            service, bob, "--env", f"GO={go_bob}", "--", "sh", "-c", f"echo on; {WAIT_FOR_GO}"
        )
        wait_for("the later job to run", lambda: logs(service, later) == "on\n")
        assert sorted(p.name for p in HOST_SHM.glob(f"{tok}*")) == []
    finally:
        go.touch()
    service.wait_state(gang, "succeeded")
    go.unlink()
    # No mount namespace holds the gang's tmpfs any more, not even the later job's (which got
    # a copy of every mount when it started): the kernel has freed it.
    assert mounted_anywhere(tmpfs, service, [alice, bob]) == []
    go_bob.touch()
    service.wait_state(later, "succeeded")
    go_bob.unlink()
    nothing_left(service, tok)


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Service]:
    yield from start(tmp_path, "limits:\n  shm_max_size: 16M\n")


def test_writing_past_the_bound_of_dev_shm_fails_with_enospc(
    capped: Service, local_users: dict[str, User], tok: str
) -> None:
    jid = run_as(
        capped, local_users["alice"], "--mem", "256M", "--env", f"TOK={tok}", "--",
        "sh", "-c", 'head -c 32M /dev/zero > "/dev/shm/$TOK" || echo "write failed"; '
        "df -m /dev/shm | tail -n 1 | awk '{print $2}'",
    )  # fmt: skip
    capped.wait_state(jid, "succeeded")
    out = logs(capped, jid)
    assert "No space left on device" in out and "write failed" in out, out
    assert out.splitlines()[-1] == "16", out
    nothing_left(capped, tok)


def holding_task(svc: Service, user: User, tok: str, go: Path) -> str:
    """A job of `user` (never retried) whose task writes a file to /dev/shm, says so, and holds
    on until `go` exists."""
    jid = run_as(
        svc, user, "--mem", "64M", "--max-retries", "0", "--env", f"TOK={tok}",
        "--env", f"GO={go}", "--", "sh", "-c",
        f'echo held > "/dev/shm/$TOK"; echo written; {WAIT_FOR_GO}',
    )  # fmt: skip
    wait_for("the task to write its file", lambda: "written" in logs(svc, jid))
    return jid


def test_a_kill_9_of_the_service_leaves_nothing_once_the_task_ends(
    service: Service, local_users: dict[str, User], tok: str
) -> None:
    alice = local_users["alice"]
    go = alice.home / f".{tok}-go"
    jid = holding_task(service, alice, tok, go)
    assert len(mounts_under(service.home)) == 1
    service.kill9()
    service.start()
    go.touch()
    try:
        service.wait_state(jid, "succeeded")
    finally:
        go.unlink()
    nothing_left(service, tok)


def test_a_kill_9_of_the_supervisor_and_the_service_leaves_nothing_after_a_restart(
    service: Service, local_users: dict[str, User], tok: str
) -> None:
    alice = local_users["alice"]
    go = alice.home / f".{tok}-go"  # never made: the task holds on until it is killed
    jid = holding_task(service, alice, tok, go)
    (lock,) = (service.home / "tasks" / jid).glob("*/*/supervisor.lock")
    service.kill9()
    os.kill(int(lock.read_text().split()[0]), signal.SIGKILL)
    # The task runs on, in the job's tmpfs, until the restarted service finds it orphaned,
    # kills it and removes the tmpfs.
    assert len(mounts_under(service.home)) == 1
    service.start()
    service.wait_state(jid, "failed")
    nothing_left(service, tok)
    orphans = subprocess.run(["pgrep", "-f", str(go)], capture_output=True, text=True)
    assert orphans.stdout == ""


def test_without_cap_sys_admin_tasks_run_with_the_hosts_dev_shm_and_say_so(
    tmp_path: Path, local_users: dict[str, User], tok: str
) -> None:
    # Root without CAP_SYS_ADMIN (as in a container that is not privileged) may not mount.
    tmp_path.chmod(0o755)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    svc = Service(home, free_port(), work, ["--cpus", "4", "--mem", "8G"])
    svc.launcher = ["setpriv", "--bounding-set", "-sys_admin", "--"]
    svc.start()
    try:
        jid = run_as(
            svc, local_users["alice"], "--mem", "64M", "--env", f"TOK={tok}", "--",
            "sh", "-c", 'echo hi > "/dev/shm/$TOK" && rm "/dev/shm/$TOK" && echo done',
        )  # fmt: skip
        svc.wait_state(jid, "succeeded")
        out = logs(svc, jid)
    finally:
        cancel_all(svc)
        svc.stop()
    notice = "/dev/shm is the host's, shared by every task (no private one): unshare: "
    assert out.splitlines() == [f"aisched: {notice}Operation not permitted", "done"]
    startup = [line.strip() for line in svc.log.read_text().splitlines()]
    assert f"{notice}Operation not permitted" in startup

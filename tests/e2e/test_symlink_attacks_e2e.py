"""A local user attacking what root's `aisched up` does with the paths that user controls: a
link or a hard link put where root creates, changes or opens a file, at the instant root acts
(a failpoint pauses the service there, so the race is won every time).

What it shows: root never follows such a link, so no file of root's (or of another user's)
is opened to, written for or given to the attacker; what it would have followed is refused,
in one line. Covered: the service's Unix socket in a directory a user may write (an admin's
`--socket` in a shared place), and a Ray node's copy of the data directory that a user may
write (its task runner, as root, writes and chowns the task's log there).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, free_port, stopped, wait_for
from users import User

from aisched.executors.ray_task import TaskRunner

pytestmark = pytest.mark.usefixtures("local_users")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file of root's that no other user may read."""
    tmp_path.chmod(0o755)
    path = tmp_path / "secret"
    path.write_text("root's alone\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory of root's that every local user may enter (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="ais-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def paused(tmp_path: Path, local_users: dict[str, User]) -> Iterator[Service]:
    """`aisched up` as root with its Unix socket in a directory of alice's (an admin's
    `--socket` in a shared place), paused right after binding the socket."""
    home = tmp_path / "home"
    home.mkdir()
    svc = Service(home, free_port(), tmp_path, ["--gpus", "0", "--cpus", "1", "--mem", "1G"])
    shared = Path(tempfile.mkdtemp(prefix="ais-"))
    alice = local_users["alice"]
    os.chown(shared, alice.uid, alice.gid)
    shared.chmod(0o755)
    svc.socket = shared / "aisched.sock"
    svc.extra_env = {"AISCHED_FAILPOINTS": "pause-after-socket-bind"}
    out = open(svc.log, "ab")  # noqa: SIM115 - the child owns it
    svc.proc = subprocess.Popen(
        [sys.executable, "-m", "aisched", "up", "--port", str(svc.port), "--data-dir",
         str(home), "--socket", str(svc.socket), *svc.args],
        stdout=out, stderr=subprocess.STDOUT, env={**svc.env(), **svc.extra_env},
        start_new_session=True,
    )  # fmt: skip
    out.close()
    try:
        pid = svc.proc.pid
        wait_for("the service to pause after its bind", lambda: stopped(pid), timeout_s=60)
        yield svc
    finally:
        svc.proc.send_signal(signal.SIGCONT)
        svc.stop()
        shutil.rmtree(shared, ignore_errors=True)


def _swap_for_link(user: User, name: Path, target: Path) -> None:
    """As `user`: `name` replaced at once (a rename over it) by a symbolic link to `target`."""
    script = (
        f"import os; os.symlink({str(target)!r}, {str(name)!r} + '.new'); "
        f"os.rename({str(name)!r} + '.new', {str(name)!r})"
    )
    done = subprocess.run(
        user.cmd(user.python, "-c", script), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr


def test_a_link_swapped_in_for_the_socket_does_not_open_roots_file_to_all(
    paused: Service, secret: Path, local_users: dict[str, User]
) -> None:
    alice = local_users["alice"]
    _swap_for_link(alice, paused.socket, secret)
    proc = paused.proc
    assert proc is not None
    proc.send_signal(signal.SIGCONT)
    wait_for(
        "the service to exit, or to change root's file",
        lambda: proc.poll() is not None or stat.S_IMODE(secret.stat().st_mode) != 0o600,
    )
    # Root's file as it was (a chmod by path made it 0666); the socket refused, in one line.
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert paused.wait_exit(30) != 0
    assert "it was replaced while it was being made" in paused.log.read_text()
    peek = subprocess.run(alice.cmd("cat", str(secret)), capture_output=True, text=True)
    assert peek.returncode != 0 and "root's alone" not in peek.stdout


def test_a_socket_left_where_the_admin_put_it_is_served_to_every_user(
    paused: Service, local_users: dict[str, User]
) -> None:
    # Nobody swapped it: the service goes on, and every local user may connect.
    assert paused.proc is not None
    paused.proc.send_signal(signal.SIGCONT)
    wait_for("the socket to be open to all", lambda: _mode(paused.socket) == 0o666)
    bob = local_users["bob"]
    env = {"AISCHED_SERVER": f"unix:{paused.socket}"}
    wait_for("bob's CLI to reach it", lambda: bob.aisched("jobs", env=env).returncode == 0)


def _mode(path: Path) -> int | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISSOCK(st.st_mode) else None


def test_a_link_in_a_ray_nodes_log_directory_that_a_user_may_write_is_not_followed(
    reachable: Path, secret: Path, local_users: dict[str, User]
) -> None:
    # A node's copy of the data directory that alice may write (made hers by mistake): before,
    # root appended the task's output to what her links led to and gave it to her (chown).
    alice = local_users["alice"]
    logs = reachable / "logs"
    logs.mkdir()
    os.chown(logs, alice.uid, alice.gid)
    log = logs / "t-0.log"
    _swap_for_link(alice, log, secret)
    # The exit record's temporary file too (the runner runs in this process here).
    _swap_for_link(alice, Path(f"{log}.exit.json.tmp{os.getpid()}"), secret)
    runner = TaskRunner(
        {
            "command": ["sh", "-c", "echo written-by-the-task"],
            "env": {"PATH": "/usr/bin:/bin"},
            "workdir": None,
            "log_path": str(log),
            "key": ["7", 1, "t-0"],
            "user": alice.name,
        }
    )
    runner.start()
    ended = runner.wait()
    # Root's file as it was: not written, not given to alice; the start refused, in one line.
    st = secret.stat()
    assert (secret.read_text(), st.st_uid, stat.S_IMODE(st.st_mode)) == ("root's alone\n", 0, 0o600)
    assert (ended["kind"], ended["exit_code"]) == ("exited", 126)
    assert ended["message"] == (
        f"cannot open the log {log}: {logs} is not root's alone on this node (another user "
        "could put a link where root writes): refused"
    )

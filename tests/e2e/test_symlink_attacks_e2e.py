"""A local user attacking what root's `aisched up` does with the paths that user controls: a
link or a hard link put where root creates, changes or opens a file, at the instant root acts
(a failpoint pauses the service there, so the race is won every time).

What it shows: root never follows such a link, so no file of root's (or of another user's)
is opened to the attacker; what it would have followed is refused, in one line.
"""

from __future__ import annotations

import os
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

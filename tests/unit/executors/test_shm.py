"""A job attempt's private /dev/shm as the supervisors keep it (real tmpfs mounts, as root):
sized by the shares of the tasks that hold it, kept while one of them has a live supervisor,
unmounted and removed after the last, and swept when every holder's supervisor was killed.
A live supervisor is one that holds its task directory's lock; here the test holds it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aisched.executors import supervisor as sup
from aisched.executors import supervisor_shm, task_files


def _can_mount() -> bool:
    probe = [sys.executable, "-I", "-S", sup.__file__, "--probe-shm"]
    return os.geteuid() == 0 and subprocess.run(probe, capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(
    not _can_mount(), reason="needs root and a kernel that lets it mount (supervisor_shm.probe_shm)"
)


class Attempt:
    """The task directories of one job attempt under a state directory, and their locks."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.dir = state / "7" / "1"
        self.locks: dict[str, int] = {}

    def shm(self, size_mib: int, max_mib: int = 0) -> dict[str, Any]:
        root = self.state / supervisor_shm.SHM_ROOT
        return {"root": str(root), "dir": str(root / "7.1"), "attempt_dir": str(self.dir),
                "size_mib": size_mib, "max_mib": max_mib, "uid": 65534, "gid": 65534}  # fmt: skip

    def start(self, task: str) -> str:
        """A task directory whose supervisor lives (its lock held) until `die`."""
        task_dir = self.dir / task
        task_dir.mkdir(parents=True)
        fd = os.open(task_dir / task_files.LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.locks[task] = fd
        return str(task_dir)

    def die(self, task: str) -> None:
        os.close(self.locks.pop(task))

    @property
    def mount(self) -> Path:
        return self.state / supervisor_shm.SHM_ROOT / "7.1"

    def size_mib(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_blocks * st.f_frsize >> 20

    def mounted(self) -> bool:
        return self.mount.exists() and os.path.ismount(self.mount)


@pytest.fixture
def attempt(tmp_path: Path) -> Iterator[Attempt]:
    a = Attempt(tmp_path)
    yield a
    for task in list(a.locks):
        a.die(task)
    supervisor_shm.sweep_shm(str(tmp_path))  # never leave a mount behind, whatever failed


def test_each_task_that_joins_adds_its_share_up_to_the_cap(attempt: Attempt) -> None:
    first, second, third = (attempt.start(t) for t in ("a-0", "a-1", "a-2"))
    supervisor_shm.join_shm(attempt.shm(16), first)
    assert attempt.mounted() and attempt.size_mib() == 16
    owner = attempt.mount.stat()
    assert (owner.st_uid, owner.st_gid, owner.st_mode & 0o777) == (65534, 65534, 0o700)
    supervisor_shm.join_shm(attempt.shm(8), second)
    assert attempt.size_mib() == 24
    supervisor_shm.join_shm(attempt.shm(16, max_mib=32), third)
    assert attempt.size_mib() == 32


def test_a_task_joining_after_others_left_sizes_it_by_those_that_hold_it(
    attempt: Attempt,
) -> None:
    # A service's replicas come and go: the tmpfs follows the ones there, never grows for ever.
    first, second = attempt.start("a-0"), attempt.start("a-1")
    supervisor_shm.join_shm(attempt.shm(16), first)
    supervisor_shm.join_shm(attempt.shm(16), second)
    assert supervisor_shm.release_shm(attempt.shm(16), second) is False  # a-0 still holds it
    third = attempt.start("a-2")
    supervisor_shm.join_shm(attempt.shm(4), third)
    assert attempt.size_mib() == 20


def test_the_last_holder_to_leave_unmounts_and_removes_it(attempt: Attempt) -> None:
    first, second = attempt.start("a-0"), attempt.start("a-1")
    path = supervisor_shm.join_shm(attempt.shm(16), first)
    supervisor_shm.join_shm(attempt.shm(16), second)
    (Path(path) / "kept").write_bytes(b"x" * 4096)
    assert supervisor_shm.release_shm(attempt.shm(16), first) is False
    assert attempt.mounted() and (Path(path) / "kept").exists()
    assert supervisor_shm.release_shm(attempt.shm(16), second) is True
    assert not attempt.mount.exists()
    # Unmounted, not emptied: nothing was deleted through the mount.
    assert list((attempt.state / supervisor_shm.SHM_ROOT).iterdir()) == []


def test_a_tmpfs_whose_holders_were_all_killed_is_swept(attempt: Attempt) -> None:
    first, second = attempt.start("a-0"), attempt.start("a-1")
    supervisor_shm.join_shm(attempt.shm(16), first)
    supervisor_shm.join_shm(attempt.shm(16), second)
    attempt.die("a-0")  # killed: its mark stays, its lock does not
    assert supervisor_shm.sweep_shm(str(attempt.state)) == []  # a-1 still holds it
    assert attempt.mounted()
    attempt.die("a-1")
    assert supervisor_shm.sweep_shm(str(attempt.state)) == [str(attempt.mount)]
    assert not attempt.mount.exists()


def test_the_last_holder_on_a_ray_node_removes_the_attempts_lock_too(attempt: Attempt) -> None:
    # A Ray node's state directory has no retention: the attempt's lock must not outlive it.
    first, second = attempt.start("a-0"), attempt.start("a-1")
    supervisor_shm.join_shm(attempt.shm(16), first)
    supervisor_shm.join_shm(attempt.shm(16), second)
    lock = attempt.dir / supervisor_shm.SHM_LOCK
    assert supervisor_shm.release_shm(attempt.shm(16), first, drop_lock=True) is False
    assert lock.exists()  # a-1 still holds the tmpfs
    assert supervisor_shm.release_shm(attempt.shm(16), second, drop_lock=True) is True
    assert not lock.exists() and not attempt.mounted()


def _waiting_on(inode: int) -> bool:
    """Whether some flock waits on the file of `inode` (a blocked lock: "->" in /proc/locks)."""
    with open("/proc/locks", encoding="ascii") as f:
        return any(ln.split()[1] == "->" and ln.split()[6].endswith(f":{inode}") for ln in f)


def test_a_lock_removed_while_another_waited_on_it_is_taken_afresh(attempt: Attempt) -> None:
    # The waiter got the removed file's lock; it must hold the file at the path instead, or a
    # third taker opening the path would not be kept out.
    attempt.dir.mkdir(parents=True)
    path = attempt.dir / supervisor_shm.SHM_LOCK
    holder = supervisor_shm._ShmLock(str(attempt.dir))
    waiter = supervisor_shm._ShmLock(str(attempt.dir))
    taken = threading.Event()

    def take() -> None:
        waiter.__enter__()
        taken.set()

    with holder:
        inode = os.fstat(holder.fd).st_ino
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not _waiting_on(inode):
            assert time.monotonic() < deadline, "the waiter never blocked on the lock"
            time.sleep(0.01)
        holder.remove()
    assert taken.wait(10)
    try:
        held, at_path = os.fstat(waiter.fd), os.stat(path)
        assert (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
    finally:
        waiter.__exit__()

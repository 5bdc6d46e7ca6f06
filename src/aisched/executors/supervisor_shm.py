"""A job attempt's private /dev/shm (host tasks run as a user).

One tmpfs per job attempt on this node, mounted in the host's namespace at
`<state>/.shm/<job>.<attempt>` (the state directory is root's, 0700: nobody else reaches it),
sized by the memory its tasks here asked for and owned by the job's user. Each task of the
attempt enters a mount namespace of its own (a slave of the host's: nothing it mounts leaks
back) with that tmpfs bound over /dev/shm, so its ranks share it and other jobs never see
it. The last task's supervisor to end unmounts it (detached: the kernel frees its pages once
the last namespace that holds it is gone) and removes its directory. A task holds it from
its join to its release (`SHM_HELD` in its directory) while its supervisor lives (holds its
lock): a supervisor killed in between leaves the tmpfs to the executor, which removes every
one that no task holds. Never rmtree'd: that would go through the mount into the task's
files. `launch["shm"]`: `root`, `dir`, `attempt_dir`, `size_mib` (this task's share),
`max_mib` (0: no cap), `uid`, `gid`.

It must import only the standard library and the supervisor's stdlib-only modules, never
`supervisor` itself, and stay side-effect free at import (see `supervisor.py`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys

from aisched.executors.mounts import (
    CLONE_NEWNS,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOSUID,
    MS_REC,
    MS_REMOUNT,
    MS_SLAVE,
    syscall,
)
from aisched.executors.processes import MIB
from aisched.executors.task_files import (
    LOCK,
    lock_at_path,
    note,
    read_json,
    try_flock,
    write_json_atomic,
)

# Without importing typing (start-up time counts): mypy treats this name as always true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SHM_ROOT = ".shm"  # in the executor's state directory; no job id or task name starts with "."
SHM_LOCK = ".shm.lock"  # in the attempt's directory: serialises mounting, growing, unmounting
SHM_HELD = "shm.held"  # in a task's directory from its joining to its release
# How a task's log (and the service's start-up log) begins to say it has the host's /dev/shm.
SHM_SHARED = "/dev/shm is the host's, shared by every task (no private one)"


def half_memory_mib() -> int:
    """tmpfs's default size, and so the host's /dev/shm's: half of the machine's memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 // MIB


def shm_spec(
    state_dir: str, job: str, attempt: str, mem_mib: int, max_mib: int, uid: int, gid: int
) -> dict[str, Any]:
    """A user's task's `launch["shm"]` under the executor's `state_dir`: its share is the
    memory it asked for (none asked: tmpfs's default, as the host's /dev/shm), at most
    `max_mib` (0: no cap)."""
    size = mem_mib or half_memory_mib()
    root = os.path.join(state_dir, SHM_ROOT)
    return {
        "root": root,
        "dir": os.path.join(root, f"{job}.{attempt}"),
        "attempt_dir": os.path.join(state_dir, job, attempt),
        "size_mib": min(size, max_mib) if max_mib else size,
        "max_mib": max_mib,
        "uid": uid,
        "gid": gid,
    }


def shm_unavailable() -> str | None:
    """Why tasks here cannot have a private /dev/shm (`probe_shm`, run in a child of its own
    so that its mount namespace ends with it), or None."""
    import subprocess  # only a root executor pays for it, once

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")
    try:
        probe = subprocess.run(
            [sys.executable, "-I", "-S", script, "--probe-shm"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its probe failed: {exc}"
    if probe.returncode != 0:
        return probe.stdout.strip() or probe.stderr.strip() or f"exit {probe.returncode}"
    return None


def _tmpfs_mib(path: str) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize // MIB


def join_shm(shm: dict[str, Any], task_dir: str) -> str:
    """Mounts the attempt's tmpfs, or joins it, and marks the task a holder (its share in
    its `SHM_HELD`). The size is the shares of the tasks that hold it (each one's memory),
    at most `max_mib`: a service whose replicas come and go does not grow it for ever.
    Returns its path; raises OSError."""
    path, mine, cap = str(shm["dir"]), int(shm["size_mib"]), int(shm.get("max_mib") or 0)
    attempt = str(shm["attempt_dir"])
    with _ShmLock(attempt):
        os.makedirs(str(shm["root"]), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        if not os.path.ismount(path):
            owner = f"mode=0700,uid={int(shm['uid'])},gid={int(shm['gid'])}"
            syscall("mount", "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
                    f"size={mine}m,{owner}")  # fmt: skip
        elif os.stat(path).st_uid != int(shm["uid"]):
            raise OSError(errno.EPERM, f"{path} belongs to another user")
        else:
            total = mine + sum(_shm_holders(attempt, skip=task_dir).values())
            want, have = min(total, cap) if cap else total, _tmpfs_mib(path)
            if want != have:
                try:
                    syscall("mount", None, path, None, MS_REMOUNT | MS_NOSUID | MS_NODEV,
                            f"size={want}m")  # fmt: skip
                except OSError:
                    if want > have:
                        raise
                    # Smaller than what its files hold now: it stays as it is.
        write_json_atomic(os.path.join(task_dir, SHM_HELD), {"size_mib": mine})
    return path


def _shm_holders(attempt_dir: str, skip: str | None = None) -> dict[str, int]:
    """The tasks of the attempt that hold its tmpfs (marked, with a live supervisor) and the
    share of each, in MiB; the task in `skip` left out."""
    held: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(attempt_dir):
            task_dir = os.path.join(attempt_dir, name)
            if name.startswith(".") or task_dir == skip:
                continue
            mark = read_json(os.path.join(task_dir, SHM_HELD))
            if mark is not None and _supervisor_holds(task_dir):
                held[task_dir] = int(mark.get("size_mib") or 0)
    return held


def enter_shm(path: str, root: str) -> None:
    """In the task's child, as root: a mount namespace of its own with `path` over /dev/shm.
    Its copies of the other attempts' tmpfs mounts are detached, so they cannot keep an ended
    job's memory alive. Raises OSError (the child then runs with the host's /dev/shm)."""
    syscall("unshare", CLONE_NEWNS)
    # A slave: the host's unmounts still reach this copy; nothing mounted here goes back.
    syscall("mount", None, "/", None, MS_REC | MS_SLAVE, None)
    syscall("mount", path, "/dev/shm", None, MS_BIND, None)
    for target in sorted(_mounts_under(root), reverse=True):
        with contextlib.suppress(OSError):
            syscall("umount2", target, MNT_DETACH)


def _mounts_under(root: str) -> list[str]:
    prefix = root.rstrip("/") + "/"
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            target = _unescape(line.split()[4])
            if target.startswith(prefix):
                out.append(target)
    return out


def _unescape(field: str) -> str:
    """A mountinfo field as a path: the kernel writes space, tab, newline and backslash as
    a backslash and three octal digits."""
    head, *rest = field.split("\\")
    return head + "".join(chr(int(part[:3], 8)) + part[3:] for part in rest)


def release_shm(shm: dict[str, Any], task_dir: str | None = None, drop_lock: bool = False) -> bool:
    """The task in `task_dir` (if any) no longer holds the attempt's tmpfs; unmounts and
    removes it unless another task still does: marked a holder, with a live supervisor (a
    mark without one is a supervisor's that was killed). True when it is gone (or never was).
    `drop_lock`: once it is gone, the attempt's `SHM_LOCK` goes too, so the attempt's
    directory can be removed (a Ray node's, which no retention clears)."""
    attempt = str(shm["attempt_dir"])
    with _ShmLock(attempt) as lock:
        if task_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(task_dir, SHM_HELD))
        if _shm_holders(attempt):
            return False
        gone = _unmount(str(shm["dir"]))
        if gone and drop_lock:
            lock.remove()
        return gone


def _unmount(path: str) -> bool:
    """Every mount at `path` detached, then the empty directory removed (never rmtree)."""
    while os.path.ismount(path):
        try:
            syscall("umount2", path, MNT_DETACH)
        except OSError as exc:
            note(f"cannot unmount {path}: {exc}")
            return False
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        note(f"cannot remove {path}: {exc.strerror or exc}")
        return False
    return True


def sweep_shm(state_dir: str) -> list[str]:
    """What `release_shm` would remove for each attempt's tmpfs under `state_dir`, done: those
    a killed supervisor (or service) left. Returns the paths removed."""
    root = os.path.join(state_dir, SHM_ROOT)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    gone = []
    for name in names:
        job, _, attempt = name.rpartition(".")
        attempt_dir = os.path.join(state_dir, job, attempt)
        path = os.path.join(root, name)
        shm = {"attempt_dir": attempt_dir, "dir": path}
        try:
            removed = release_shm(shm) if os.path.isdir(attempt_dir) else _unmount(path)
        except OSError as exc:  # the next sweep tries again
            note(f"cannot remove {path}: {exc.strerror or exc}")
            continue
        if removed:
            gone.append(path)
    return gone


def _supervisor_holds(task_dir: str) -> bool:
    try:
        fd = os.open(os.path.join(task_dir, LOCK), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        return not try_flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # releases a lock we got


class _ShmLock:
    """The attempt's `SHM_LOCK`, held exclusively. Its holder may remove it (`remove`), so a
    taker that waited checks, once it holds it, that its file is still the one at the path:
    a lock on a removed file would exclude no one who opens the path afresh."""

    def __init__(self, attempt_dir: str) -> None:
        self.path = os.path.join(attempt_dir, SHM_LOCK)
        self.fd = -1

    def __enter__(self) -> _ShmLock:
        self.fd = lock_at_path(self.path)
        return self

    def remove(self) -> None:
        """Removes the file while holding it (those waiting on it then try the path again)."""
        os.unlink(self.path)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def probe_shm() -> int:
    """`supervisor.py --probe-shm`: whether this kernel and container let a task have a
    private /dev/shm (CAP_SYS_ADMIN, mount namespaces, tmpfs). Everything happens in a mount
    namespace of its own that ends with this process. 0, or 1 and the reason on stdout."""
    try:
        if not os.path.isdir("/dev/shm"):
            raise OSError(errno.ENOENT, "this node has no /dev/shm")
        syscall("unshare", CLONE_NEWNS)
        syscall("mount", None, "/", None, MS_REC | MS_SLAVE, None)
        syscall("mount", "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
        syscall("mount", None, "/dev/shm", None, MS_REMOUNT | MS_NOSUID | MS_NODEV,
                "size=2m")  # fmt: skip
        syscall("mount", "/dev/shm", "/dev/shm", None, MS_BIND, None)
        syscall("umount2", "/dev/shm", MNT_DETACH)
    except OSError as exc:
        print(exc.strerror or exc, flush=True)
        return 1
    return 0

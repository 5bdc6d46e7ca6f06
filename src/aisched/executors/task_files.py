"""A task directory's files: what the executor and a task's supervisor tell each other.

Files of a task directory (each JSON file is written whole: temp file, then rename):

- `launch.json`   the request (written by the executor before the supervisor starts)
- `supervisor.lock` locked by the supervisor for its whole life; holds "PID STARTTIME"
- `started.json`  supervisor and child pids and start times (after a successful exec)
- `stop.json`     the grace period of a stop (written by the executor before its SIGTERM)
- `exit.json`     how the task ended: kind exited|stopped|oom, exit code, message, time
- `shm.held`      the task holds its job attempt's private /dev/shm (see `supervisor_shm.py`)
- `abandoned`     the executor gave the task up before a supervisor took it: never start it
- `supervisor.log` the supervisor's own stdout/stderr (tracebacks, if it ever fails)

Also here: reading and writing those files whole, the lock's protocol (`read_lock_owner`,
`try_flock`, `lock_at_path`, `supervisor_alive_or_abandon`), and `ExecFailed`, a task that
could not start: the code and message of its `exit.json`.

It must import only the standard library and stay side-effect free at import: the supervisor
imports it (see `supervisor.py`), running with `-I -S`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys

# Without importing typing (start-up time counts): mypy treats this name as always true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LAUNCH = "launch.json"
STARTED = "started.json"
STOP = "stop.json"
EXIT = "exit.json"
LOCK = "supervisor.lock"
ABANDONED = "abandoned"
LOG = "supervisor.log"


def write_json_atomic(path: str, obj: object) -> None:
    """Readers see the old file, no file, or the whole new one: never a partial write."""
    tmp = f"{path}.tmp{os.getpid()}"
    # 0600: a task's files hold its command and environment, which are its owner's alone.
    with open(
        os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8"
    ) as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (FileNotFoundError, ValueError):  # a torn file cannot happen; a foreign one can
        return None
    return data if isinstance(data, dict) else None


class ExecFailed(Exception):
    """A task that could not start, or a container that could not be created or prepared
    (ray_task drives containers too). `kind` "unrunnable": the task can never start as asked
    (its image is missing)."""

    def __init__(self, code: int, message: str, kind: str = "exited") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind


def read_lock_owner(task_dir: str) -> tuple[int, int] | None:
    """(pid, start time) a supervisor wrote into its lock file, if any."""
    try:
        with open(os.path.join(task_dir, LOCK), encoding="ascii") as f:
            pid, start = f.read().split()
        return int(pid), int(start)
    except (OSError, ValueError):
        return None


def try_flock(fd: int, mode: int) -> bool:
    """flock(2) `mode` (LOCK_SH or LOCK_EX) on `fd` without waiting: True when taken (it lasts
    until `fd` is closed), False when another holds a conflicting lock; other errors raise."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def lock_at_path(path: str, flags: int = 0) -> int:
    """An fd of the file at `path` (made if missing, opened with `flags` besides) holding its
    exclusive flock, waited for. Its holder may remove the file, so once the lock is held the
    file is checked to be still the one at the path, else it tries again: a lock on a removed
    file would exclude no one who opens the path afresh. Raises OSError."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed while we waited: take the one there now


def _same_file(fd: int, path: str) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def supervisor_alive_or_abandon(task_dir: str) -> bool:
    """True while a supervisor lives in `task_dir`. Otherwise marks the task `abandoned` while
    holding the lock and returns False: a supervisor still starting will then see the mark
    and exit without running the task, so the caller may treat it as gone for good."""
    fd = os.open(os.path.join(task_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not try_flock(fd, fcntl.LOCK_EX):
            return True
        with open(os.path.join(task_dir, ABANDONED), "w", encoding="ascii"):
            pass
        return False
    finally:
        os.close(fd)  # releases the lock


def note(line: str) -> None:
    """A line for the supervisor's own log (its stderr), which is on the disk that may be full:
    failing to write it must not stop the supervisor from recording its task's end."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def not_roots_alone(path: str) -> str | None:
    """The first directory a lookup of `path` goes through that another user could change,
    or None: one not root's, or one others may write without the sticky bit (each directory
    on the way, and on the way to each link's target). Root makes, opens and hands to the
    task's user its files there by name (its log, exit record, env file): such a user could
    put a link in their place and have root write through it, and give the user the file it
    leads to. Checked for a root service's data directory (`service/datadir.py`) and for a
    Ray node's copy of it (`ray_task`)."""
    seen: set[str] = set()
    names = [p for p in os.path.abspath(path).split("/") if p]
    for k in range(len(names) + 1):
        real = os.path.realpath("/" + "/".join(names[:k]))
        while real not in seen:
            seen.add(real)
            try:
                st = os.lstat(real)
            except FileNotFoundError:
                return None  # not made yet: the first to make it is root
            open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
            if st.st_uid != 0 or open_to_others:
                return real
            real = os.path.dirname(real)
    return None

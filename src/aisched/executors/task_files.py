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
`try_flock`, `lock_at_path`, `supervisor_alive_or_abandon`), `ExecFailed`, a task that
could not start: the code and message of its `exit.json`, and what a task's files must be
before it may use them: becoming its user (`become`, `as_user`), a checkpoint directory of
the user's own (`own_dir`, `own_checkpoint_dir`), directories no other user may change
(`not_roots_alone`, `not_theirs_alone`).

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
    from collections.abc import Callable
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


# The exit code of a task whose program exec could not find (as a shell's `command not
# found`). Such a task ends unrunnable, not retried: started again unchanged on the same
# nodes, it is not found again (docs/service.md, Retries).
NOT_FOUND = 127


class ExecFailed(Exception):
    """A task that could not start, or a container that could not be created or prepared
    (ray_task drives containers too). `kind` "unrunnable": the task can never start as asked
    (its image or its program is missing)."""

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
    """The first place a lookup of `path` goes through that another user could change, or
    None: a directory not root's, or one others may write without the sticky bit (each
    directory on the way, and on the way to each link's target), or a link of another user's
    in a directory others may write (sticky: its owner may still replace it). Root makes,
    opens and hands to the task's user its files there by name (its log, exit record, env
    file): such a user could put a link in their place and have root write through it, and
    give the user the file it leads to. Checked for a root service's data directory
    (`service/datadir.py`) and for a Ray node's copy of it (`ray_task`)."""
    return _open_to_others(path, frozenset((0,)))


def not_theirs_alone(path: str, uid: int) -> str | None:
    """`not_roots_alone` where the directories may be `uid`'s as well as root's: the first
    one a user other than `uid` (and root) could change, or None."""
    return _open_to_others(path, frozenset((0, uid)))


def _open_to_others(path: str, owners: frozenset[int], seen: set[str] | None = None) -> str | None:
    seen = set() if seen is None else seen
    names = [p for p in os.path.abspath(path).split("/") if p]
    for k in range(len(names) + 1):
        here = "/" + "/".join(names[:k])
        try:
            if os.path.islink(here) and here not in seen:
                seen.add(here)
                # The directories on its way are checked below (by realpath); the link itself
                # is its owner's to replace where others may write its directory (sticky).
                shared = os.stat(os.path.realpath(os.path.dirname(here))).st_mode & 0o022
                if os.lstat(here).st_uid not in owners and shared:
                    return here
                # The way to its target, as written: links there are met in turn.
                target = os.path.join(os.path.dirname(here), os.readlink(here))
                if (other := _open_to_others(target, owners, seen)) is not None:
                    return other
        except FileNotFoundError:
            return None
        real = os.path.realpath(here)
        while real not in seen:
            seen.add(real)
            try:
                st = os.lstat(real)
            except FileNotFoundError:
                return None  # not made yet: the first to make it is root
            open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
            if st.st_uid not in owners or open_to_others:
                return real
            real = os.path.dirname(real)
    return None


def own_dir(path: str, uid: int, link: str = "is a symbolic link") -> None:
    """Raises ExecFailed unless `path` is a directory of `uid` itself, not a link (`link`
    says why a link is refused). A link or another's directory where the task's checkpoints
    go would give them to whoever placed it, or give the task what its user may not open."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ExecFailed(126, f"checkpoint directory {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        why = link
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != uid:
        why = f"belongs to uid {st.st_uid}, not to the task's user (uid {uid})"
    else:
        return
    raise ExecFailed(126, f"checkpoint directory {path} {why}: refused; remove it")


def own_checkpoint_dir(path: str, uid: int) -> None:
    """Raises ExecFailed unless the checkpoint directory `path` is `uid`'s own (`own_dir`)
    and no directory a lookup of it goes through could be changed by a user other than `uid`
    and root (`not_theirs_alone`): such a user could rename the directory away and put one
    of theirs (or a link to one) in its place at any time after this check, and read or
    change the task's checkpoints there. Called by a host task's process once it is the
    user, so every name is looked up with the user's rights alone."""
    own_dir(path, uid)
    way = not_theirs_alone(os.path.dirname(os.path.abspath(path)), uid)
    if way is None:
        return
    st = os.lstat(way)
    if st.st_uid not in (0, uid):
        why = f"belongs to uid {st.st_uid}"
    else:
        why = f"may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    raise ExecFailed(
        126,
        f"checkpoint directory {path}: {way} {why}, so another user could swap the directory"
        f" for one of theirs: refused; the task's user (uid {uid}) and root alone must own"
        " and write each directory on its way",
    )


def become(user: dict[str, Any]) -> None:
    """Drop to the task's user for good: groups first (they need root), then gid, then uid;
    then check that root cannot be regained."""
    uid, gid = int(user["uid"]), int(user["gid"])
    os.setgroups([int(g) for g in user.get("groups") or [gid]])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.geteuid() != uid or os.getegid() != gid:
        raise OSError(errno.EPERM, f"could not become uid {uid}")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError(errno.EPERM, "root could be regained after dropping privileges")


def as_user(user: dict[str, Any], check: Callable[[], str]) -> str:
    """What `check` returns, run in a child process that has become `user` (`become`) and
    does nothing else: what it looks up through paths the user controls, it looks up with
    the user's rights alone, so no answer (nor error) tells the user more than it could see
    itself. The child is never exec'd, so it stays undumpable: the user cannot trace it to
    change the answer. Raises ExecFailed with the child's ExecFailed, or with why it failed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code, out = 0, ""
        try:
            os.close(r)
            become(user)
            os.umask(0o022)
            out = check()
        except ExecFailed as exc:
            code, out = exc.code, exc.message
        except BaseException as exc:  # noqa: BLE001 - every failure is the child's answer
            code, out = 126, str(exc.strerror if isinstance(exc, OSError) else exc)
        try:
            os.write(w, out.encode("utf-8", "surrogateescape")[:60_000])
        finally:
            os._exit(code)
    os.close(w)
    try:
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    out = b"".join(chunks).decode("utf-8", "surrogateescape")
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise ExecFailed(code if code > 0 else 126, out or f"a check as uid {user['uid']} failed")
    return out

"""Pinned mounts: a user's host paths, opened and judged as the user, for root's engine to mount.

Root's engine mounts a host path when it sets the container up, long after the path was
checked (an image pull may lie between), through whatever links are on the path by then: a
user who owns a directory on the way could put a link in its place and have root mount what
no check saw. So each host path of a user's container is opened here, one component at a
time without following a link, judged by the user's rights on what was opened, and that very
file bind-mounted (through /proc/self/fd) at a place of root's own, which is what the engine
is given. Podman's mounts are in the container once it is initialised, so its pins are undone
then; docker makes its mounts at the start, so docker's last until the task ends. A pin left
by a supervisor that died is undone by the next container's supervisor on the node.

It must import only the standard library and the supervisor's stdlib-only modules, never
`supervisor` itself, and stay side-effect free at import (see `supervisor.py`).
"""

from __future__ import annotations

import contextlib
import os
import stat

from aisched.executors.mounts import (
    MNT_DETACH,
    MS_BIND,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    syscall,
)
from aisched.executors.processes import is_alive, start_time, user_bits
from aisched.executors.task_files import ExecFailed
from aisched.model.numerals import is_decimal

PIN_ROOT = "/run/aisched-pins"


def _open_as(path: str, uid: int, groups: frozenset[int], top: str = "/", shown: str = "/") -> int:
    """An O_PATH descriptor of `path` (absolute and resolved when it was checked), each name
    looked up in a directory the user may search, none of them followed if it is a link now.
    `top`: the directory of root's own to look `path` up in instead of /, which messages call
    `shown`. Raises ExecFailed with the reason."""
    fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    names, seen, path = [p for p in path.split("/") if p], shown, os.path.join(shown, path)
    try:
        for name in names:
            if name in (".", ".."):
                raise ExecFailed(126, f"{path}: holds '.' or '..': refused")
            if not user_bits(os.fstat(fd), uid, groups) & 0o1:
                raise ExecFailed(126, f"{path}: uid {uid} may not search {seen}: refused")
            nxt = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd, seen = nxt, os.path.join(seen, name)
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise ExecFailed(
                    126, f"{path}: {seen} is a symbolic link now, not what was checked: refused"
                )
        return fd
    except OSError as exc:
        os.close(fd)
        raise ExecFailed(126, f"{path}: {exc.strerror or exc}") from None
    except ExecFailed:
        os.close(fd)
        raise


def _mount(source: str | None, target: str, flags: int) -> None:
    syscall("mount", source, target, None, flags, None)


def _unpin(dest: str) -> None:
    """Undoes one pin: detached (a process still in it keeps it), then its mount point goes."""
    with contextlib.suppress(OSError):  # not mounted (a pin left half made)
        syscall("umount2", dest, MNT_DETACH)
    with contextlib.suppress(OSError):
        if os.path.isdir(dest) and not os.path.islink(dest):
            os.rmdir(dest)  # never a recursive removal: it could run through a mount
        else:
            os.unlink(dest)


def _pin_root() -> str:
    """PIN_ROOT, made root's and private; a directory left there by a supervisor no longer
    alive has its pins undone."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(PIN_ROOT, 0o700)
    st = os.lstat(PIN_ROOT)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        raise ExecFailed(126, f"{PIN_ROOT} is not a directory of root's alone: refused")
    sweep_pins()
    return PIN_ROOT


def sweep_pins() -> None:
    """Undoes the pins of supervisors no longer alive (killed between pinning and letting go:
    they hold their users' directories, and the ones on the way to a nested mount cannot be
    renamed meanwhile). Called by each container's supervisor, and by the executor when it
    finds a container task's supervisor gone."""
    try:
        names = os.listdir(PIN_ROOT)
    except OSError:
        return
    for name in names:
        pid, _, rest = name.partition("-")
        start = rest.partition("-")[0]
        if is_decimal(pid) and is_decimal(start) and not is_alive(int(pid), int(start)):
            held = os.path.join(PIN_ROOT, name)
            with contextlib.suppress(OSError):
                for pin in os.listdir(held):
                    _unpin(os.path.join(held, pin))
            with contextlib.suppress(OSError):
                os.rmdir(held)


class Pins:
    """The host paths pinned for one container (see the section's header)."""

    def __init__(self, name: str, uid: int, groups: frozenset[int]) -> None:
        self.name = name
        self.uid = uid
        self.groups = groups
        self.dir: str | None = None
        self.made: list[str] = []
        self.locked: set[tuple[str, str]] = set()  # (pin, directory in it): see lock_way

    def pin(self, path: str, own: bool) -> tuple[str, bool]:
        """Where the engine finds `path` as it is now, and whether the user may write it there.
        `own`: it must be a directory of the user's own (a checkpoint directory). Raises
        ExecFailed with the reason."""
        fd = _open_as(path, self.uid, self.groups)
        try:
            st = os.fstat(fd)
            is_dir = stat.S_ISDIR(st.st_mode)
            bits = user_bits(st, self.uid, self.groups)
            if bits & (0o5 if is_dir else 0o4) != (0o5 if is_dir else 0o4):
                raise ExecFailed(126, f"{path}: uid {self.uid} may not read it: refused")
            if own and not (is_dir and st.st_uid == self.uid):
                raise ExecFailed(126, f"{path}: not a directory of uid {self.uid}: refused")
            dest = os.path.join(self.held(), str(len(self.made)))
            if is_dir:
                os.mkdir(dest, 0o700)
            else:
                os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            self.made.append(dest)
            # Private: nothing mounted or unmounted here reaches the container's copy later.
            _mount(f"/proc/self/fd/{fd}", dest, MS_BIND | MS_REC)
            _mount(None, dest, MS_PRIVATE | MS_REC)
        except OSError as exc:
            why = exc.strerror or exc
            raise ExecFailed(126, f"cannot pin {path} for the engine: {why}") from None
        finally:
            os.close(fd)
        return dest, bits & (0o3 if is_dir else 0o2) == (0o3 if is_dir else 0o2)

    def nest(self, inner: str, outer: str, rel: str, shown: str, read_only: bool) -> None:
        """Mounts the pin `inner` on `rel` inside the pin `outer` (which holds the host path
        `shown`): on the very directory or file found there, a name at a time from `outer`,
        none followed if it is a link, each directory one the user may search. The engine is
        then given `outer` alone (its mounts are recursive): given both, it would look `rel`
        up itself, as root, through whatever link the user has put there by then, and make
        the mount point wherever that leads. Raises ExecFailed with the reason."""
        where = os.path.join(shown, rel)
        if read_only:
            self.make_read_only(inner, where)
        try:
            self.lock_way(outer, os.path.dirname(rel), shown)
            fd = _open_as(rel, self.uid, self.groups, top=outer, shown=shown)
        except OSError as exc:
            raise ExecFailed(126, f"cannot pin {where} for the engine: {exc.strerror}") from None
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode) != os.path.isdir(inner):
                kind = "directory" if os.path.isdir(inner) else "file"
                raise ExecFailed(126, f"{where}: not a {kind} to mount a {kind} on: refused")
            # Not private on its own: a bind under the private `outer` is private already.
            _mount(inner, f"/proc/self/fd/{fd}", MS_BIND | MS_REC)
        except OSError as exc:
            raise ExecFailed(126, f"cannot pin {where} for the engine: {exc.strerror}") from None
        finally:
            os.close(fd)

    def make_read_only(self, dest: str, shown: str) -> None:
        """The pin `dest` (of `shown`) made read-only itself, what is mounted in it not."""
        try:
            _mount(None, dest, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError as exc:
            raise ExecFailed(126, f"cannot pin {shown} for the engine: {exc.strerror}") from None

    def lock_way(self, outer: str, rel: str, shown: str) -> None:
        """Each directory on the way to `rel` inside the pin `outer` bound onto itself there:
        a mount point cannot be renamed or removed (EBUSY) by a process of this mount
        namespace, so the runtime, which walks a working directory inside `outer` as root
        and makes what is missing, finds them where the nested mounts were put. (A user in
        another mount namespace is not held back: such a rename detaches them.)"""
        parts = [p for p in rel.split("/") if p]
        for k in range(1, len(parts) + 1):
            way = "/".join(parts[:k])
            if (outer, way) in self.locked:
                continue  # bound again, it would hide what is mounted below the first
            fd = _open_as(way, self.uid, self.groups, top=outer, shown=shown)
            try:
                _mount(f"/proc/self/fd/{fd}", f"/proc/self/fd/{fd}", MS_BIND)
            finally:
                os.close(fd)
            self.locked.add((outer, way))

    def held(self) -> str:
        if self.dir is None:
            me = os.getpid()
            self.dir = os.path.join(_pin_root(), f"{me}-{start_time(me)}-{self.name}")
            os.mkdir(self.dir, 0o700)
        return self.dir

    def release(self) -> None:
        for dest in reversed(self.made):
            _unpin(dest)  # and what is nested or locked in it, detached with it
        self.made = []
        self.locked = set()
        if self.dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)
            self.dir = None

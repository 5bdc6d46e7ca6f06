"""The data directory's checks at start: each problem is one line saying what is wrong and
what to do, raised before anything is written there.

- a link to nothing (an unmounted volume), a file in its place, or a path that cannot be made;
- foreign: another user's directory, or one full of files that are not aisched's (a home
  directory given by mistake) - aisched would scatter its state among them;
- exposed: under a directory another user may change (`not_roots_alone` for a root service,
  `not_theirs_alone` for an ordinary user's: directories of theirs or root's alone);
- not writable (a read-only filesystem, missing permissions), or one of its files not
  writable: the file itself is named (`unwritable_file`: another user's, immutable);
- full: less free space than `limits.disk_min_free`, or fewer free inodes than
  `limits.disk_min_free_inodes`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
from pathlib import Path
from typing import IO

from aisched.executors.task_files import not_roots_alone, not_theirs_alone
from aisched.model.resources import describe_bytes
from aisched.service.identity import user_name

# What an aisched data directory holds; any one of them marks a directory as aisched's.
MARKERS = ("lock", "state.db")
# What a user may keep in a new data directory before the first start (a config, a log).
_HARMLESS_SUFFIXES = (".yaml", ".yml", ".log", ".json", ".txt")


class DataDirError(RuntimeError):
    """The data directory cannot be used; the message is one line."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def prepare(home: Path) -> None:
    """Create the data directory if needed and refuse one that cannot be aisched's."""
    if home.is_symlink() and not home.exists():
        raise DataDirError(
            f"the data directory {home} is a link to {os.readlink(home)}, which does not exist "
            "(is its filesystem mounted?); mount it, or give another --data-dir"
        )
    if home.exists() and not home.is_dir():
        raise DataDirError(
            f"the data directory {home} is not a directory; give a directory as --data-dir"
        )
    if home.exists():
        _ours(home)
    uid = os.geteuid()
    # Root opens, writes and hands to users files under it by name (its tasks' logs); any
    # service keeps its jobs' checkpoints and logs there, for no other user to read or replace.
    if (other := exposed_place(home)) is not None:
        if os.path.islink(other):
            what = (
                f"a link of {_user(os.lstat(other).st_uid)}, who may point it elsewhere (others "
                "may write where it is)"
            )
        else:
            owners = "root's" if uid == 0 else "yours or root's"
            what = f"a directory another user may change (not {owners}, or others may write it)"
        place = f"is {what}" if other == str(home) else f"goes through {other}, {what}"
        harm = (
            "have the service write as root where they choose; give a --data-dir under "
            "directories of root's alone"
            if uid == 0
            else "read or replace the jobs' checkpoints and logs; give a --data-dir under "
            "directories of yours (or root's) alone"
        )
        raise DataDirError(f"the data directory {home} {place}: they could {harm}")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataDirError(
            f"cannot create the data directory {home}: {e.strerror or e}; create it, or give "
            "another --data-dir"
        ) from None
    _ours(home)
    names = os.listdir(home)
    if names and not any(m in names for m in MARKERS):
        strange = sorted(
            n
            for n in names
            if not n.startswith(".")
            and not (n.endswith(_HARMLESS_SUFFIXES) and (home / n).is_file())
        )
        if strange:
            raise DataDirError(
                f"the data directory {home} is not aisched's: it holds other files "
                f"({', '.join(strange[:3])}{', ...' if len(strange) > 3 else ''}); give an "
                "empty or new directory as --data-dir"
            )


def exposed_place(path: Path) -> str | None:
    """The first place on the way to `path` that a user other than this process's (and root)
    could change or repoint, or None (`not_roots_alone`, `not_theirs_alone`)."""
    uid = os.geteuid()
    return not_roots_alone(str(path)) if uid == 0 else not_theirs_alone(str(path), uid)


def _ours(home: Path) -> None:
    owner = home.stat().st_uid
    if owner != os.geteuid():
        raise DataDirError(
            f"the data directory {home} belongs to {_user(owner)}, not to {_user(os.geteuid())}"
            f"; run aisched up as its owner, or give another --data-dir"
        )


def not_writable(home: Path, exc: OSError) -> DataDirError:
    """What keeps aisched from writing in `home`; the entry `exc` is about, when it is one
    inside of the wrong kind (a file where aisched keeps a directory, or the other way round)."""
    if exc.errno == errno.ENOSPC:
        return full(home, 0, 0)
    inside = exc.filename is not None and Path(os.fsdecode(exc.filename)) != home
    if inside and exc.errno in (errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
        where = Path(os.fsdecode(exc.filename))
        there, wanted = ("a directory", "a file") if where.is_dir() else ("a file", "a directory")
        return DataDirError(
            f"{where} is {there}, where aisched keeps {wanted} of its own; move it out of the "
            "data directory, or give another --data-dir"
        )
    return DataDirError(
        f"the data directory {home} is not writable ({exc.strerror or exc}); give a writable "
        "--data-dir, or remount or fix its permissions"
    )


def unwritable_file(path: Path, exc: OSError, what: str) -> DataDirError:
    """Why `path` (`what`: "the state database", ...), a file aisched writes, refused to be
    opened for writing (`exc`), naming that file: the directory around it may be writable."""
    try:
        st: os.stat_result | None = path.stat()
    except OSError:
        st = None
    me = os.geteuid()
    said = f"{what} {path} cannot be written ({exc.strerror or exc})"
    if exc.errno == errno.EROFS:
        return DataDirError(
            f"{said}: a read-only filesystem; remount it, or give another --data-dir"
        )
    if st is not None and st.st_uid != me and me != 0:
        return DataDirError(
            f"{said}: it belongs to {_user(st.st_uid)}, not to {_user(me)} who runs aisched; "
            f"give it back (as root: chown {user_name(me)} {path}), or run aisched up as its owner"
        )
    if exc.errno == errno.EPERM:
        # Its owner (or root) may not write it: only a file attribute refuses them.
        return DataDirError(
            f"{said}: it is marked immutable or append-only (lsattr {path} shows i or a); "
            f"clear that as root (chattr -i -a {path})"
        )
    return DataDirError(f"{said}; fix its permissions (chmod u+rw {path})")


def full(home: Path, free_bytes: int, min_free_bytes: int) -> DataDirError:
    if not min_free_bytes:  # a write failed for lack of space, whatever the limit
        return DataDirError(f"the data directory {home} has no space left; free some space")
    have = f"only {describe_bytes(free_bytes)} free" if free_bytes else "no space left"
    return DataDirError(
        f"the data directory {home} has {have}, below the {describe_bytes(min_free_bytes)} that "
        "aisched keeps free (limits.disk_min_free); free some space, or lower the limit"
    )


def check_space(home: Path, min_free_bytes: int, min_free_inodes: int = 0) -> None:
    st = os.statvfs(home)
    free = st.f_bavail * st.f_frsize
    if free < min_free_bytes:
        raise full(home, free, min_free_bytes)
    if st.f_files and st.f_favail < min_free_inodes:  # f_files 0: inodes are not counted
        raise DataDirError(
            f"the data directory {home} has only {st.f_favail} free inodes, below the "
            f"{min_free_inodes} that aisched keeps free (limits.disk_min_free_inodes); delete "
            "some files, or lower the limit"
        )


def claim_for_database(home: Path, database: str) -> IO[bytes]:
    """Refuse to share `home` with instances of another database. Instances of one PostgreSQL
    database share a data directory, and the lease keeps them from scheduling at once; an
    instance of another database beside them would lead too, with job ids of its own colliding
    with theirs in one `tasks`, `logs` and `checkpoints`. Each instance holds its database's
    lock file (`database-ID.lock`, `ID` its `Store.instance_id`) shared for its life, taken
    before it looks at the others': one of another database that some process holds means its
    instances run. Returns the held file, to keep open."""
    mine = open(home / f"database-{database}.lock", "a+b")  # noqa: SIM115 - held for its life
    try:
        fcntl.flock(mine.fileno(), fcntl.LOCK_SH)  # others only test it, for a moment
        for other in sorted(home.glob("database-*.lock")):
            if other.name == os.path.basename(mine.name):
                continue
            with open(other, "rb") as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    theirs = other.name.removeprefix("database-").removesuffix(".lock")
                    raise DataDirError(
                        f"the data directory {home} is in use by instances of another state "
                        f"database (its id {theirs}, this one's {database}): instances share a "
                        "data directory only with one database; give this one a --data-dir of "
                        "its own"
                    ) from None
    except OSError as e:
        mine.close()
        raise not_writable(home, e) from None
    except DataDirError:
        mine.close()
        raise
    return mine

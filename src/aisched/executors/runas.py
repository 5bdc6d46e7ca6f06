"""Which account a task runs as, and the environment that goes with it.

Jobs run as the user who submitted them, as Slurm's do. An executor running as root starts a
task of user U with U's uid, gid and supplementary groups (the supervisor's child drops
privileges before exec) and with U's HOME, USER, LOGNAME and SHELL. An executor that is not
root runs every task as itself; the API admits only its own user's jobs then.

What a user could open (`user_lookup`, `user_can`) stands in for opening it as that user: it
is judged from the file system and the user database alone, never by forking, and follows
each symbolic link as the kernel does, so a link cannot lead the service's (root's) eyes past
a directory the user may not search.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aisched.executors.base import LaunchRefused
from aisched.executors.processes import user_bits

# A task of another user does not inherit the service's PATH (root's may name directories the
# user cannot read, or tools root installed for itself): it gets the usual one, unless the
# job set its own.
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def account(user: str | None, uid: int | None = None) -> dict[str, Any] | None:
    """The account a task of `user` must switch to (name, uid, gid, groups, home, shell), or
    None when it runs as this process (this process is not root, or the user is root).

    `uid` is the uid that submitted the job (None: not known). The name is looked up at each
    launch, and a name deleted and given to another account names someone else: the task runs
    as `uid` or not at all. Both refusals are for good (`LaunchRefused`: the job fails without
    its retries), since no retry mends them; an account made again with the same uid is the
    same account, and runs it."""
    if user is None or os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise LaunchRefused(
            f"user {user!r} has no account on this machine, so the task cannot run as it"
        ) from None
    if uid is not None and pw.pw_uid != uid:
        raise LaunchRefused(
            f"user {user!r} is uid {pw.pw_uid} on this machine, not uid {uid}, which submitted "
            "the job: the name now belongs to another account, so the task does not run as it"
        )
    if pw.pw_uid == 0:
        return None
    return {
        "name": pw.pw_name,
        "uid": pw.pw_uid,
        "gid": pw.pw_gid,
        "groups": sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))),
        "home": pw.pw_dir,
        "shell": pw.pw_shell or "/bin/sh",
    }


def account_env(
    env: Mapping[str, str], acct: Mapping[str, Any], in_image: bool = False
) -> dict[str, str]:
    """`env` as the task of `acct` gets it: its own HOME, USER, LOGNAME and SHELL, and the usual
    PATH in place of the service's own (a PATH the job set itself is kept). `in_image`: a
    container's, whose image keeps its own SHELL and PATH."""
    out = dict(env)
    out.update(HOME=str(acct["home"]), USER=str(acct["name"]), LOGNAME=str(acct["name"]))
    if in_image:
        return out
    out["SHELL"] = str(acct["shell"])
    if out.get("PATH") in (None, os.environ.get("PATH")):
        out["PATH"] = USER_PATH
    return out


# Linux gives up resolving a path after this many symbolic links (ELOOP).
_MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a user finds at a path: `found` is what the path resolves to (None when it does
    not resolve for the user); `hidden` says that the user cannot tell whether it exists (a
    directory on the way is one it may not search), as opposed to a path it can see is not
    there."""

    found: os.stat_result | None
    hidden: bool = False


_MISSING = Lookup(None)
_HIDDEN = Lookup(None, hidden=True)


def _resolve(path: str, uid: int, groups: frozenset[int]) -> Lookup:
    """`path` resolved as the kernel resolves it for `uid`: component by component from /,
    each symbolic link's text put in place of its name, every directory a name is looked up
    in searchable (".." included), a name that is not the last a directory."""
    todo = deque(p for p in path.split("/") if p)
    must_be_dir = path.endswith("/")
    cur, cur_st = "/", os.stat("/")
    links = 0
    while todo:
        name = todo.popleft()
        if uid != 0 and not user_bits(cur_st, uid, groups) & 0o1:
            return _HIDDEN
        if name == ".":
            continue
        if name == "..":
            # `cur` holds no links, so its lexical parent is its real one.
            cur = os.path.dirname(cur)
            cur_st = os.stat(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return _MISSING
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return _MISSING
            text = os.readlink(nxt)
            if text.startswith("/"):
                cur, cur_st = "/", os.stat("/")
            must_be_dir = must_be_dir or (not todo and text.endswith("/"))
            todo.extendleft(reversed([p for p in text.split("/") if p]))
            continue
        if (todo or must_be_dir) and not stat.S_ISDIR(st.st_mode):
            return _MISSING  # ENOTDIR, which the user sees as well
        cur, cur_st = nxt, st
    return Lookup(cur_st)


def user_lookup(user: str, path: str) -> Lookup:
    """What the local user `user` finds at `path` (relative to this process's working
    directory), judged from the file system and the user database alone: `path` is resolved
    as the kernel would for the user's uid and groups (every directory on the way, the
    targets of its symbolic links included, searchable; see `_resolve`). Root finds what
    exists; an unknown user finds nothing and cannot tell why (hidden).

    A path whose symbolic links lead elsewhere than their text says (/proc's "magic" links,
    such as /proc/PID/root into another process's mount namespace, which the kernel lets the
    user follow only into processes it may trace) is hidden: what was resolved must be what the
    path opens. Not read: POSIX ACLs (an entry that grants the user more than the mode bits
    is not seen, and one that denies it what the mode's group or other bits allow is not
    honoured), Linux security modules, and fs.protected_symlinks."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return _HIDDEN
    groups = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
    full = os.path.join(os.getcwd(), path)
    try:
        found = _resolve(full, pw.pw_uid, groups)
        if found.found is not None and not os.path.samestat(found.found, os.stat(full)):
            return _HIDDEN
    except OSError:
        # What else stops a walk (a name too long, a file system gone, a race with a
        # rename) the user cannot rely on either.
        return _HIDDEN
    return found


def user_can(user: str, path: str, want: int) -> bool:
    """Whether the local user `user` could reach `path` with its own uid and groups (see
    `user_lookup`: every directory on the way searchable, symbolic links followed as the
    kernel follows them) and has the `want` permission bits (0o4 read, 0o2 write, 0o1
    execute or search) on what it leads to. Unknown users may do nothing; root may do all.
    POSIX ACLs are ignored (see `user_lookup`)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return False
    if pw.pw_uid == 0:
        return True
    found = user_lookup(user, path).found
    if found is None:
        return False
    groups = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return user_bits(found, pw.pw_uid, groups) & want == want


def ordinary_account(user: str) -> bool:
    """Whether `user` names a local account other than root (whose view of the files differs
    from the service's)."""
    try:
        return pwd.getpwnam(user).pw_uid != 0
    except KeyError:
        return False

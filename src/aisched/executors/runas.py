"""Which account a task runs as, and the environment that goes with it.

Jobs run as the user who submitted them, as Slurm's do. An executor running as root starts a
task of user U with U's uid, gid and supplementary groups (the supervisor's child drops
privileges before exec) and with U's HOME, USER, LOGNAME and SHELL. An executor that is not
root runs every task as itself; the API admits only its own user's jobs then.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from typing import Any

from aisched.executors.base import LaunchError

# A task of another user does not inherit the service's PATH (root's may name directories the
# user cannot read, or tools root installed for itself): it gets the usual one, unless the
# job set its own.
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def account(user: str | None) -> dict[str, Any] | None:
    """The account a task of `user` must switch to (name, uid, gid, groups, home, shell), or
    None when it runs as this process (this process is not root, or the user is root)."""
    if user is None or os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise LaunchError(
            f"user {user!r} has no account on this machine, so the task cannot run as it"
        ) from None
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


def account_env(env: Mapping[str, str], acct: Mapping[str, Any]) -> dict[str, str]:
    """`env` as the task of `acct` gets it: its own HOME, USER, LOGNAME and SHELL, and the usual
    PATH in place of the service's own (a PATH the job set itself is kept)."""
    out = dict(env)
    out.update(
        HOME=str(acct["home"]),
        USER=str(acct["name"]),
        LOGNAME=str(acct["name"]),
        SHELL=str(acct["shell"]),
    )
    if out.get("PATH") in (None, os.environ.get("PATH")):
        out["PATH"] = USER_PATH
    return out


def user_can(user: str, path: str, want: int) -> bool:
    """Whether the local user `user` could reach `path` with its own uid and groups (every
    directory on the way searchable) and has the `want` permission bits (0o4 read, 0o2 write,
    0o1 execute or search) on the path itself. Unknown users may do nothing; root may do all."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return False
    if pw.pw_uid == 0:
        return True
    groups = set(os.getgrouplist(user, pw.pw_gid))
    parts = os.path.abspath(path).split("/")
    for i in range(1, len(parts) + 1):
        p = "/".join(parts[:i]) or "/"
        try:
            st = os.stat(p)
        except OSError:
            return False
        need = want if i == len(parts) else 0o1
        if st.st_uid == pw.pw_uid:
            bits = (st.st_mode >> 6) & 0o7
        elif st.st_gid in groups:
            bits = (st.st_mode >> 3) & 0o7
        else:
            bits = st.st_mode & 0o7
        if bits & need != need:
            return False
    return True


def ordinary_account(user: str) -> bool:
    """Whether `user` names a local account other than root (whose view of the files differs
    from the service's)."""
    try:
        return pwd.getpwnam(user).pw_uid != 0
    except KeyError:
        return False

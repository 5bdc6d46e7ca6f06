"""Who is calling: identities from the kernel (a Unix socket's peer credentials) or a token.

A `Caller` is made in exactly two places: `from_peer` (SO_PEERCRED on the local socket: the
kernel's word, not the client's) and `from_token` (a bearer token an admin created). Nothing a
client sends in a header or a body ever names the caller. Admins are root, the service's own
user, and the users and groups the configuration names.

Standard library only (pwd, grp, socket); the API's dependency in `service/auth.py` uses it.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    user: str
    uid: int | None  # None for a token whose user has no local account
    groups: tuple[int, ...]  # primary group first
    admin: bool
    via: str  # "socket" or "token"


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Admins:
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def include(self, user: str, uid: int | None, gids: tuple[int, ...]) -> bool:
        if uid == 0 or uid == os.geteuid() or user in self.users:
            return True
        return bool(self.groups) and any(group_name(g) in self.groups for g in gids)


# Linux's SO_PEERGROUPS (4.13+): the peer's supplementary groups, as the kernel saw them at
# connect(). Python does not name it.
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)


def peer_credentials(sock: socket.socket) -> PeerCred:
    """The connecting process's pid, uid, gid and groups, from the kernel (Linux)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    groups: tuple[int, ...]
    try:
        buf = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * 1024)
        groups = struct.unpack(f"{len(buf) // 4}I", buf)
    except OSError:  # an older kernel: the group database says what the user's groups are
        groups = tuple(_grouplist(uid, gid))
    return PeerCred(pid, uid, gid, (gid, *(g for g in groups if g != gid)))


def from_peer(cred: PeerCred, admins: Admins) -> Caller:
    name = user_name(cred.uid)
    return Caller(
        user=name,
        uid=cred.uid,
        groups=cred.groups,
        admin=admins.include(name, cred.uid, cred.groups),
        via="socket",
    )


def from_token(user: str, admin: bool, admins: Admins) -> Caller:
    """A token's caller: its user's local account where there is one (a cluster's users need
    not have accounts on the scheduler's machine; their jobs then cannot run as them here)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return Caller(user=user, uid=None, groups=(), admin=admin, via="token")
    gids = (pw.pw_gid, *(g for g in os.getgrouplist(user, pw.pw_gid) if g != pw.pw_gid))
    return Caller(
        user=user,
        uid=pw.pw_uid,
        groups=gids,
        admin=admin or admins.include(user, pw.pw_uid, gids),
        via="token",
    )


def same_account(user: str, uid: int | None, owner: str, owner_uid: int | None) -> bool:
    """Whether what was recorded for `owner` (a job, a token), with the uid `owner_uid` that
    name had then, is the account `user` (uid `uid`)'s. A name is not an account: once an
    account is deleted and its name given to another (another uid), the old account's jobs
    and tokens are nobody's but the admins'. A caller of unknown uid (a token of a name with
    no account here) is never that uid. Records kept before uids were (`owner_uid` None) go
    by name, as they always did."""
    return user == owner and (owner_uid is None or uid == owner_uid)


def account_gone(user: str, uid: int | None) -> str | None:
    """Why the account that submitted a job as `user`, uid `uid`, is not on this machine now
    (the name names no account, or another uid: it was deleted, perhaps its name given to
    another), or None while it is (for a job stored without its uid: while the name has an
    account)."""
    now = local_uid(user)
    if now is None:
        was = "" if uid is None else f" (it was uid {uid})"
        return f"user {user!r} has no account on this machine now{was}"
    if uid is not None and now != uid:
        return f"user {user!r} is uid {now} on this machine now, not uid {uid}, another account"
    return None


def local_uid(user: str) -> int | None:
    """The uid of the account `user` names on this machine, or None where it names none."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def user_name(uid: int) -> str:
    """The account name of `uid`, or `uid:N` for a uid the user database does not know."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid:{gid}"


def _grouplist(uid: int, gid: int) -> list[int]:
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


def service_user() -> str:
    """The account the service runs as."""
    return user_name(os.geteuid())

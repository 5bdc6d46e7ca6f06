"""Who listens on a TCP port of this machine: the uids that own its listening sockets, read
from the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`), which every process may
read. The autoscaler asks before it takes a replica's port as the replica's: a port is free
between the service choosing it and the replica binding it, and after a replica dies, so
another local user could bind it first and answer its probes and scrapes."""

from __future__ import annotations

import ipaddress
import pwd
import socket

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the kernel's TCP_LISTEN, as the tables write states


def listening_uids(port: int, tables: tuple[str, ...] = TABLES) -> set[int] | None:
    """The uids of the sockets listening on `port` (empty: none listens), or None when no
    table can be read (not Linux)."""
    found: set[int] = set()
    read_any = False
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
            if len(fields) > 7 and fields[3] == LISTEN and _port(fields[1]) == port:
                found.add(int(fields[7]))
    return found if read_any else None


def peer_uid(sock: socket.socket, tables: tuple[str, ...] = TABLES) -> int | None:
    """The uid that owns the other end of a connected TCP socket to this machine: the socket
    the kernel made for it on the listening side (which has its listener's owner), or None
    when it is not in this machine's tables (another network namespace, another machine)."""
    mine, theirs = sock.getsockname()[1], sock.getpeername()[1]
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and (_port(fields[1]), _port(fields[2])) == (theirs, mine):
                return int(fields[7])
    return None


def _port(address: str) -> int:
    """The port of a table's `HEXADDR:HEXPORT`."""
    return int(address.rpartition(":")[2], 16)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def uid_of(user: str, default: int) -> int:
    """The uid a job of `user` runs as: the account's, else `default` (the service's own,
    which runs the jobs of names that are no local account)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return default

"""Whose process accepts a TCP connection on this machine: the uid that owns the socket the
kernel made for it, read from the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`),
which every process may read. The autoscaler asks before it takes a replica's port as the
replica's: a port is free between the service choosing it and the replica binding it, and
after a replica dies, so another local user could bind it first and answer its probes and
scrapes."""

from __future__ import annotations

import ipaddress
import pwd
import socket

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the kernel's TCP_LISTEN, as the tables write states


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def accepting_uid(host: str, port: int, timeout_s: float) -> int | None:
    """The uid of the process that accepts a TCP connection to `host:port` on this machine
    (`peer_uid` of a connection made and closed at once), or None when nothing accepts it or
    the tables do not say. Asked of the connection itself, not of the listeners: a listener on
    another address of the port (`::1`, `127.0.0.2`) takes no connection to this one, so it
    must not count."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            return peer_uid(sock)
    except OSError:
        return None


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


def uid_of(user: str, default: int) -> int:
    """The uid a job of `user` runs as: the account's, else `default` (the service's own,
    which runs the jobs of names that are no local account)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return default

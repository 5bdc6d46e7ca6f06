"""`listeners.ClientOwners`: the kernel names the user owning the client socket of a loopback
TCP connection, asked by the connection's exact addresses and ports over NETLINK_SOCK_DIAG.
Real sockets: this process's, and ones another local user (nobody) connects."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from aisched.service.listeners import ClientOwners, peer_uid

Address = tuple[str, int]

# Run as another user: connect to HOST:PORT, print the connection's local port, hold it until
# stdin closes.
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print(c.getsockname()[1], flush=True)
sys.stdin.read()
"""

# (where the service listens, where the client connects, the client's address as shown)
LOOPBACKS = [
    ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
    ("::1", "::1", "::1"),
    ("::", "127.0.0.1", "::ffff:127.0.0.1"),  # an IPv4 client of a dual-stack listener
]


@contextmanager
def listening(host: str) -> Iterator[socket.socket]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as listener:
        if host == "::":
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
        listener.bind((host, 0))
        listener.listen()
        yield listener


def addresses(accepted: socket.socket) -> tuple[Address, Address]:
    """The accepted connection's own address and its client's, as the service sees them."""
    local, client = accepted.getsockname(), accepted.getpeername()
    return (local[0], local[1]), (client[0], client[1])


@pytest.mark.parametrize(("listen", "connect", "shown"), LOOPBACKS)
def test_a_client_socket_of_this_process_is_its_users(
    listen: str, connect: str, shown: str
) -> None:
    owners = ClientOwners()
    with listening(listen) as listener:
        client = socket.create_connection((connect, listener.getsockname()[1]))
        accepted, _ = listener.accept()
        with client, accepted:
            local, peer = addresses(accepted)
            assert peer[0] == shown
            assert owners.uid(local, peer) == os.geteuid()
            # Another port of the same addresses is no socket of anyone's.
            assert owners.uid(local, (peer[0], peer[1] ^ 1)) is None
        # Closed, the client's socket is gone (the listener's is never taken for it).
        assert owners.uid(local, peer) is None


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser"
)
@pytest.mark.parametrize(("listen", "connect", "shown"), LOOPBACKS)
def test_a_client_socket_of_another_user_is_theirs(listen: str, connect: str, shown: str) -> None:
    owners = ClientOwners()
    with listening(listen) as listener:
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", CLIENT, connect, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            client_port = int(proc.stdout.readline())
            accepted, _ = listener.accept()
            with accepted:
                local, peer = addresses(accepted)
                assert peer == (shown, client_port)
                assert owners.uid(local, peer) == pwd.getpwnam("nobody").pw_uid
        finally:
            proc.stdin.close()
            proc.wait(10)


def test_only_loopback_connections_are_asked_about() -> None:
    owners = ClientOwners()
    with listening("127.0.0.1") as listener:
        local = ("127.0.0.1", listener.getsockname()[1])
        assert owners.uid(local, ("192.0.2.7", 40000)) is None
        assert owners.uid(local, ("::1", 40000)) is None  # families that differ: no socket
        assert owners.uid(("::1", local[1]), ("not an address", 40000)) is None


# Run as another user: listen on HOST, print the port, accept one connection, hold it until
# stdin closes.
SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
sys.stdin.read()
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser"
)
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_process_accepting_a_connection_is_named_by_the_kernel_not_a_table_scan(
    host: str,
) -> None:
    # The autoscaler's check of a replica's port (`peer_uid`) asks the kernel for exactly
    # the accepting socket: with no table to scan, it still names the listener's user.
    proc = subprocess.Popen(
        ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", SERVER, host],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port = int(proc.stdout.readline())
        with socket.create_connection((host, port)) as conn:
            assert peer_uid(conn, tables=()) == pwd.getpwnam("nobody").pw_uid
    finally:
        proc.stdin.close()
        proc.wait(10)


# Run as another user: listen on HOST with TCP_DEFER_ACCEPT (a connection stays a request,
# unaccepted, until its first data), print the port, hold it until stdin closes.
DEFERRING_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser"
)
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_connection_not_yet_accepted_is_its_listeners_not_roots(host: str) -> None:
    # The kernel answers uid 0 for a connection kept as a request (no socket yet): it was
    # taken for root's, so the CLI sent its token to another user's listener that deferred
    # accepting. The tables name the request's listener.
    proc = subprocess.Popen(
        ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", DEFERRING_SERVER, host],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port = int(proc.stdout.readline())
        with socket.create_connection((host, port)) as conn:
            assert peer_uid(conn) == pwd.getpwnam("nobody").pw_uid
    finally:
        proc.stdin.close()
        proc.wait(10)

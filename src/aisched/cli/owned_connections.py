"""The CLI's connections to a server on this machine: each one is used only if root or the
user runs the process at its other end, checked on that connection itself before a byte is
written to it (before TLS too), so nothing (no token, no job, no `--env` value) reaches a
server another local user runs. Any local user may listen on a free loopback port, the default
one too while the system service is down, or take a socket's name in /tmp that its owner's
service left.

The owner is the kernel's answer for the connection: SO_PEERCRED on a Unix socket; over TCP,
the owner of the socket the kernel made for it on the listening side (`listeners.peer_uid`).
Where the kernel names no owner (the other side closed or reset it already, or is in another
network namespace), the connection is refused too: an unknown owner is never taken for an
allowed one. Checking a connection made for the purpose, then sending on another, let a
listener that reset the first (so that no owner was found) be sent the request on the second.

A connection to another machine is not checked: a remote server is trusted by its TLS
certificate, and no local user can listen there.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable

import httpcore
import httpx

from aisched.cli.errors import EXIT_FAILURE, NotSent
from aisched.service.identity import peer_credentials, user_name
from aisched.service.listeners import is_this_machines, peer_uid

# httpcore's SOCKET_OPTION: setsockopt's arguments
SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


class OwnerCheckedTransport(httpx.HTTPTransport):
    """httpx's transport, its connections made by `OwnerCheckingBackend`. httpx names no
    network backend: its `__init__` is replaced, making the one pool it would (its only
    state), with the backend. No SSL context unless `url` is https: making one reads the CA
    store (some 60 ms), for a plain connection or a Unix socket in vain."""

    def __init__(self, url: str, uds: str | None = None) -> None:
        limits = httpx.Limits()  # httpx's defaults
        https = url.startswith("https://")
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context() if https else None,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            uds=uds,
            network_backend=OwnerCheckingBackend(url),
        )


class OwnerCheckingBackend(httpcore.NetworkBackend):
    """httpcore's own backend, whose new connections to this machine are closed, and the
    request refused (`NotSent`), unless root or this user serves them. `url` is the server
    as the user named it, for the message."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        sock = _socket(stream)
        try:
            # The address connected to, not the name: a name may resolve elsewhere next time.
            peer = str(sock.getpeername()[0]) if sock is not None else None
        except OSError as e:  # reset already: a connection that failed, and nothing was sent
            stream.close()
            raise httpcore.ConnectError(str(e)) from None
        if peer is None or is_this_machines(peer):
            self._check(stream, sock, peer_uid)
        return stream

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_unix_socket(path, timeout, socket_options)
        self._check(stream, _socket(stream), lambda sock: peer_credentials(sock).uid)
        return stream

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)

    def _check(
        self,
        stream: httpcore.NetworkStream,
        sock: socket.socket | None,
        server_uid: Callable[[socket.socket], int | None],
    ) -> None:
        """Return if root or this user serves `stream`; else close it and raise."""
        try:
            uid = server_uid(sock) if sock is not None else None
        except OSError:
            uid = None
        if uid is not None and uid in (0, os.geteuid()):
            return
        stream.close()
        if uid is None:
            raise NotSent(
                f"{self.url}: cannot tell whose process serves it (the kernel names no owner "
                "for the connection: it was closed at once, or is served from another network "
                "namespace): nothing (no token, no job) is sent to it (--server or "
                "AISCHED_SERVER choose another)",
                EXIT_FAILURE,
            )
        raise NotSent(
            f"{self.url} is served by a process of {user_name(uid)}, not by root's aisched or "
            "yours: nothing (no token, no job) is sent to it (--server or AISCHED_SERVER "
            "choose another)",
            EXIT_FAILURE,
        )


def _socket(stream: httpcore.NetworkStream) -> socket.socket | None:
    sock = stream.get_extra_info("socket")
    return sock if isinstance(sock, socket.socket) else None

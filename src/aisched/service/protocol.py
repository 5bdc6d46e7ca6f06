"""The HTTP protocol the service's servers speak: uvicorn's httptools protocol, plus three
things it lacks for a shared machine.

1. On a Unix-socket connection, the peer's credentials (SO_PEERCRED, read once when the
   connection is made) go into every request's ASGI scope under `PEER_SCOPE_KEY`. That is the
   only way an identity enters the app from the socket; TCP connections never carry one.
2. A connection must send a request's whole header within `HEADER_TIMEOUT_S`, so a client that
   connects and trickles (or sends nothing) cannot hold a connection open for ever.
3. One peer (a local user, by the kernel's uid: on the socket from SO_PEERCRED, on loopback
   TCP from the owner of the client's socket, `listeners.ClientOwners`; else an address on TCP)
   holds at most `ConnectionCaps.per_peer` connections at once; one more is answered 429 and
   closed as soon as it is made. The same key (`CLIENT_SCOPE_KEY`) names the rate budget of
   the connection's requests without a valid token (`service/auth.py`): by address alone,
   every local user would share 127.0.0.1's. The server's own bound (uvicorn's
   `limit_concurrency`, then the process's descriptors) is shared by everyone, and connections
   cost nothing to open again when the header timeout closes them: without a bound of their
   own, one user holding thousands of idle connections would have every other user's request
   refused. Admins are not bound (on the socket, where their groups are known).
4. A request's head (its request line and headers) is read up to `MAX_HEAD_BYTES`; one that
   has not ended by then is answered 431 and its connection closed. httptools keeps a head
   whole until it ends, with no bound of its own, and before any token is asked for: 64
   connections each sending a 16 MB header took the service from 129 MB to 1.1 GB. (A body
   is bounded by the routes that read it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aisched.service.identity import Admins, PeerCred, peer_credentials, user_name
from aisched.service.listeners import ClientOwners

PEER_SCOPE_KEY = "aisched.peer"
CLIENT_SCOPE_KEY = "aisched.client"  # whom the connection counts against: `peer_key`
HEADER_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 64 * 1024  # as servers bound it: nginx 8-32 KiB, uvicorn's h11 16 KiB
CONNECTIONS_PER_PEER = 128


class ConnectionCaps:
    """How many connections each peer holds open, and the most one may hold. Shared by the
    servers of one process (the event loop's thread only: no lock)."""

    def __init__(self, per_peer: int, admins: Admins) -> None:
        self.per_peer = per_peer
        self.admins = admins
        self._held: Counter[str] = Counter()

    def admit(self, key: str, peer: PeerCred | None) -> bool:
        """Count one more connection of `key`, or refuse it (False) past the cap. Whether the
        peer is an admin is asked only then: group look-ups may be slow."""
        if self._held[key] >= self.per_peer and not (
            peer is not None and self.admins.include(user_name(peer.uid), peer.uid, peer.groups)
        ):
            return False
        self._held[key] += 1
        return True

    def release(self, key: str) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]

    def refusal(self, key: str) -> bytes:
        """The whole HTTP answer to a connection of `key` past the cap."""
        body = json.dumps(
            {
                "error": f"too many connections: {describe_key(key)} holds {self.per_peer} "
                "open connections to this service, the most one may "
                "(limits.connections_per_peer); close some and try again",
                "problems": [],
            }
        ).encode()
        head = (
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
            f"retry-after: 1\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


class ServiceProtocol(HttpToolsProtocol):
    caps: ConnectionCaps | None = None  # set on a subclass by `service.serve.make_servers`
    owners: ClientOwners | None = None  # likewise
    _peer: PeerCred | None = None
    _client_key: str = ""
    _cap_key: str | None = None
    _header_timer: asyncio.TimerHandle | None = None
    # What the head being read may still take; None while a body is read (between a head's
    # end and its message's).
    _head_left: int | None = MAX_HEAD_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_left = MAX_HEAD_BYTES
        sock: Any = transport.get_extra_info("socket")
        self._peer = None
        self._cap_key = None
        if sock is not None and sock.family == socket.AF_UNIX:
            try:
                self._peer = peer_credentials(sock)
            except OSError:
                transport.close()  # no credentials, no service: never guess who it is
                return
        self._client_key = key = peer_key(self._peer, self.client, self.server, self.owners)
        if self.caps is not None:
            if not self.caps.admit(key, self._peer):
                # At once: held open, it would count against everyone. What the client sent
                # is read first: a socket closed with unread data is reset, and the client
                # would lose the answer.
                _discard_pending(sock)
                transport.write(self.caps.refusal(key))
                transport.close()
                return
            self._cap_key = key
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._peer is not None:
            self.scope[PEER_SCOPE_KEY] = self._peer  # type: ignore[literal-required]
        self.scope[CLIENT_SCOPE_KEY] = self._client_key  # type: ignore[literal-required]
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        """Give the parser what a head may still take, and more only once the head ended:
        a head that has not ended within `MAX_HEAD_BYTES` is refused. (What follows a body's
        end in the same read is given whole, counted against no head: at most one read.)"""
        if self._head_left is None or len(data) <= self._head_left:
            if self._head_left is not None:
                self._head_left -= len(data)
            super().data_received(data)
            return
        part, rest = data[: self._head_left], data[self._head_left :]
        self._head_left = 0
        if part:
            super().data_received(part)
        if self.transport.is_closing():
            return  # refused by the parser already (a malformed request)
        if self._head_ended():
            self.data_received(rest)
        else:
            self._refuse_head()

    def _head_ended(self) -> bool:
        return self._head_left is None

    def _refuse_head(self) -> None:
        body = json.dumps(
            {
                "error": f"request head too large: its request line and headers are over "
                f"{MAX_HEAD_BYTES // 1024} KiB, the most this service reads before they end",
                "problems": [],
            }
        ).encode()
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\n"
            "content-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        self._cancel_header_timer()
        # What the client sent is read first: a socket closed with unread data is reset, and
        # the client would lose the answer.
        _discard_pending(self.transport.get_extra_info("socket"))
        self.transport.write(head.encode() + body)
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._head_left = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_left = MAX_HEAD_BYTES  # the next request's

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self.caps is not None and self._cap_key is not None:
            self.caps.release(self._cap_key)
            self._cap_key = None
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        with contextlib.suppress(Exception):
            self.transport.close()


def peer_key(
    peer: PeerCred | None,
    client: tuple[str, int] | None,
    server: tuple[str, int | None] | None,
    owners: ClientOwners | None,
) -> str:
    """Whom a connection is counted against: the local user (the kernel's uid; no name look-up
    for every connection) on the socket and on loopback TCP where the kernel says who owns the
    client's socket, else the address on TCP (a token is not known before the request's
    headers)."""
    if peer is not None:
        return f"uid {peer.uid}"
    if client is None:
        return "address unknown"
    uid = None
    if owners is not None and server is not None and server[1] is not None:
        uid = owners.uid((server[0], server[1]), client)
    return f"uid {uid}" if uid is not None else f"address {client[0]}"


def describe_key(key: str) -> str:
    """`peer_key`'s key as a refusal names it: a uid as its user."""
    kind, _, value = key.partition(" ")
    return f"user {user_name(int(value))}" if kind == "uid" else key


def _discard_pending(sock: Any) -> None:
    """Read and drop what has arrived on the (non-blocking) socket `sock` so far, up to 1 MiB
    (a request's whole header and more): a client that goes on sending must not hold the
    event loop here."""
    if sock is None:
        return
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more
        for _ in range(16):
            if not os.read(sock.fileno(), 1 << 16):
                return

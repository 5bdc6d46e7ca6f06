"""The HTTP protocol the service's servers speak: uvicorn's httptools protocol, plus two things
it lacks for a shared machine.

1. On a Unix-socket connection, the peer's credentials (SO_PEERCRED, read once when the
   connection is made) go into every request's ASGI scope under `PEER_SCOPE_KEY`. That is the
   only way an identity enters the app from the socket; TCP connections never carry one.
2. A connection must send a request's whole header within `HEADER_TIMEOUT_S`, so a client that
   connects and trickles (or sends nothing) cannot hold a connection open for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aisched.service.identity import PeerCred, peer_credentials

PEER_SCOPE_KEY = "aisched.peer"
HEADER_TIMEOUT_S = 10.0


class ServiceProtocol(HttpToolsProtocol):
    _peer: PeerCred | None = None
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock: Any = transport.get_extra_info("socket")
        self._peer = None
        if sock is not None and sock.family == socket.AF_UNIX:
            try:
                self._peer = peer_credentials(sock)
            except OSError:
                transport.close()  # no credentials, no service: never guess who it is
                return
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._peer is not None:
            self.scope[PEER_SCOPE_KEY] = self._peer  # type: ignore[literal-required]
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
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

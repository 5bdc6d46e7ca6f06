"""A TCP listener on the loopback answers only to loopback host names (DNS rebinding).

A page of another site can point a DNS name of its own at 127.0.0.1, then have the visitor's
browser send requests to that name: to the browser it is that site's own origin, so the page
reads the answers (readiness names the data directory; the dashboard's login form is a form
like any other). The request still says which name it was sent to, in its Host header, and a
service that listens on the loopback alone is reached under no other name than the loopback's:
`localhost`, 127.x.y.z or [::1], with any port. Any other Host is answered 400 before the app
sees the request. A listener on other addresses is reached under whatever names point at the
machine, which the service cannot know: its Host headers are left alone (it needs TLS, or an
explicit --insecure, and tokens there).

`loopback_hosts_only(app)` wraps the app of one listener (`serve.make_servers`); the Unix
socket's requests never pass through it (their Host is whatever the client wrote).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from aisched.service.limits import problem_response
from aisched.service.listeners import is_loopback


def host_name(header: str) -> str:
    """The name or address of a Host header, without its port or an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name, _, _port = header.partition(":")
    return name.removesuffix(".")


def is_loopback_host(header: str) -> bool:
    return is_loopback(host_name(header))


class LoopbackHostsOnly:
    """ASGI middleware: refuse (400, a Problem document) a request whose Host is not a loopback
    name or address; a request without a Host header (HTTP/1.0, not a browser's) goes on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if host is not None and not is_loopback_host(host):
                await _refuse(send, host)
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, host: str) -> None:
    await problem_response(
        send,
        400,
        f"this service listens on the loopback only and answers only to localhost, 127.0.0.1 "
        f"or [::1], not to host {host[:200]!r} (a name another site points at this machine: "
        "DNS rebinding)",
    )

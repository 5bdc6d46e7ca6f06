"""A TCP listener on the loopback answers only to loopback host names (DNS rebinding).

A page of another site can point a DNS name of its own at 127.0.0.1, then have the visitor's
browser send requests to that name: to the browser it is that site's own origin, so the page
reads the answers (readiness names the data directory; the dashboard's login form is a form
like any other). The request still says which name it was sent to, in its Host header, and a
service that listens on the loopback alone is reached under no other name than the loopback's:
`localhost`, 127.x.y.z or [::1], with any port, and the machine's own host name where it
resolves to the loopback here (a browser opened on http://HOSTNAME:PORT). Another site cannot
send that last one from a page of its own: its page's requests name its own domain, and the
machine's name is resolved by the machine's configuration (/etc/hosts, nss-myhostname), not
by that site's DNS. A name resolved to any other address is refused like any name. Any other
Host is answered 400 before the app sees the request. A listener on other addresses is
reached under whatever names point at the machine, which the service cannot know: its Host
headers are left alone (it needs TLS, or an explicit --insecure, and tokens there).

`LoopbackHostsOnly(app, own_names)` wraps the app of one listener (`serve.make_servers`, which
resolves `own_loopback_names()` once, at start); the Unix socket's requests never pass through
it (their Host is whatever the client wrote).
"""

from __future__ import annotations

import socket

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


def is_loopback_host(header: str, own_names: frozenset[str] = frozenset()) -> bool:
    name = host_name(header)
    return is_loopback(name) or name in own_names


def own_loopback_names(hostname: str | None = None) -> frozenset[str]:
    """The machine's own host name (`hostname`, by default the kernel's), lower case, when
    every address it resolves to here is a loopback one; else none. Resolved once, at start:
    a name the machine's resolver sends elsewhere is refused like any other."""
    name = (socket.gethostname() if hostname is None else hostname).lower().removesuffix(".")
    if not name or is_loopback(name):
        return frozenset()
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return frozenset()
    addresses = {str(sockaddr[0]).split("%")[0] for *_, sockaddr in found}
    if addresses and all(is_loopback(a) for a in addresses):
        return frozenset({name})
    return frozenset()


class LoopbackHostsOnly:
    """ASGI middleware: refuse (400, a Problem document) a request whose Host is not a loopback
    name or address nor one of `own_names` (`own_loopback_names`); a request without a Host
    header (HTTP/1.0, not a browser's) goes on."""

    def __init__(self, app: ASGIApp, own_names: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.own_names = own_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host")
            if host is not None and not is_loopback_host(host, self.own_names):
                await _refuse(send, host, self.own_names)
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, host: str, own_names: frozenset[str]) -> None:
    names = "".join(f" (or {name})" for name in sorted(own_names))
    await problem_response(
        send,
        400,
        f"this service listens on the loopback only and answers only to localhost, 127.0.0.1 "
        f"or [::1]{names}, not to host {host[:200]!r} (a name another site points at this "
        "machine: DNS rebinding)",
    )

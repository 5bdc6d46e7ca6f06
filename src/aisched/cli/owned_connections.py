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

A proxy from the environment (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, less what NO_PROXY names)
is used where httpx would use it (`environment_proxy`), never for a server named by an address
of this machine or `localhost`: the connection to such a server must be the CLI's own, to be
checked. The connection to a proxy on this machine is checked as a server's is: a forwarding
proxy reads the request, token included, and any proxy is sent its own credentials.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable

import httpcore
import httpx

# httpx's own reading of the proxy variables and of NO_PROXY, so that the CLI goes through a
# proxy exactly where any httpx client would; httpx applies them itself only to the
# transports it makes.
from httpx._utils import URLPattern, get_environment_proxies

from aisched.cli.errors import EXIT_FAILURE, CLIError, NotSent
from aisched.service.identity import peer_credentials, user_name
from aisched.service.listeners import is_loopback, is_this_machines, peer_uid

# httpcore's SOCKET_OPTION: setsockopt's arguments
SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


# The variable each of httpx's proxy keys comes from, for messages.
PROXY_VARIABLES = {"http://": "HTTP_PROXY", "https://": "HTTPS_PROXY", "all://": "ALL_PROXY"}


class EnvironmentProxy:
    """The proxy the environment names for a server: `proxy` (its URL without credentials,
    which `proxy.raw_auth` keeps) from the variable `variable`."""

    def __init__(self, proxy: httpx.Proxy, variable: str) -> None:
        self.proxy = proxy
        self.variable = variable

    def __str__(self) -> str:
        return f"the proxy {self.proxy.url} ({self.variable})"


def environment_proxy(url: str) -> EnvironmentProxy | None:
    """The proxy httpx would take from the environment for the server at `url`, or None to
    connect to it directly: always for a server named by `localhost` or an address of this
    machine, whose owner is checked on the CLI's own connection. Only HTTP(S) proxies: a SOCKS
    one needs a package the CLI does not install."""
    target = httpx.URL(url)
    if is_loopback(target.host) or is_this_machines(target.host):
        return None
    for key, proxy_url in sorted(
        get_environment_proxies().items(), key=lambda item: URLPattern(item[0])
    ):
        if not URLPattern(key).matches(target):
            continue
        if proxy_url is None:  # NO_PROXY names it
            return None
        variable = PROXY_VARIABLES.get(key, "a proxy variable")
        try:
            proxy = httpx.Proxy(proxy_url)
        except ValueError as e:
            raise CLIError(f"{variable} {proxy_url!r}: not a proxy's URL ({e})") from None
        if proxy.url.scheme not in ("http", "https"):
            raise CLIError(
                f"{variable} names a {proxy.url.scheme} proxy, {proxy.url}: the CLI goes "
                f"through HTTP(S) proxies only; NO_PROXY={target.host} connects directly"
            )
        return EnvironmentProxy(proxy, variable)
    return None


class OwnerCheckedTransport(httpx.HTTPTransport):
    """httpx's transport, its connections made by `OwnerCheckingBackend`, through `proxy`
    when one is given. httpx names no network backend: its `__init__` is replaced, making the
    one pool it would (its only state), with the backend. No SSL context unless `url` is
    https: making one reads the CA store (some 60 ms), for a plain connection or a Unix socket
    in vain."""

    def __init__(
        self, url: str, uds: str | None = None, proxy: EnvironmentProxy | None = None
    ) -> None:
        limits = httpx.Limits()  # httpx's defaults
        ssl_context = httpx.create_ssl_context() if url.startswith("https://") else None
        backend = OwnerCheckingBackend(url, proxy)
        if proxy is None:
            self._pool: httpcore.ConnectionPool = httpcore.ConnectionPool(
                ssl_context=ssl_context,
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry,
                uds=uds,
                network_backend=backend,
            )
            return
        # As httpx makes it for a proxy (CONNECT for https, forwarding for http).
        via = proxy.proxy
        self._pool = httpcore.HTTPProxy(
            proxy_url=httpcore.URL(
                scheme=via.url.raw_scheme,
                host=via.url.raw_host,
                port=via.url.port,
                target=via.url.raw_path,
            ),
            proxy_auth=via.raw_auth,
            proxy_headers=via.headers.raw,
            ssl_context=ssl_context,
            proxy_ssl_context=via.ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )


class OwnerCheckingBackend(httpcore.NetworkBackend):
    """httpcore's own backend, whose new connections to this machine are closed, and the
    request refused (`NotSent`), unless root or this user serves them. `url` is the server
    as the user named it, for the message; `proxy` the proxy every connection goes to, if
    any."""

    def __init__(self, url: str, proxy: EnvironmentProxy | None = None) -> None:
        self.url = url
        self.proxy = proxy
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
        if self.proxy is not None:  # every connection goes to the proxy
            whose = (
                "whose process it is cannot be told"
                if uid is None
                else (f"it is run by a process of {user_name(uid)}, not by root or you")
            )
            raise NotSent(
                f"{self.url}: {self.proxy} is on this machine and {whose}: nothing (no "
                f"token, no job) is sent through it (NO_PROXY={httpx.URL(self.url).host} "
                "connects to the server directly)",
                EXIT_FAILURE,
            )
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

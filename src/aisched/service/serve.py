"""Serving the API: a TCP port (tokens; TLS off loopback) and a Unix socket (identity from the
kernel), both with the same app, in one event loop.

`listen_unix` makes the socket writable by every local user: anyone may connect, and what they
may do follows from who the kernel says they are. `run_servers` runs until asked to stop
(`stop_servers`, from `service.shutdown.Stopper` on a signal); uvicorn's own signal capture is
off (with two servers it would re-raise the signal into the default handler, and it waits for
open connections without a bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from aisched.service import failpoints
from aisched.service.hosts import LoopbackHostsOnly, own_loopback_names
from aisched.service.identity import peer_credentials, user_name
from aisched.service.listeners import ClientOwners, is_loopback
from aisched.service.protocol import CONNECTIONS_PER_PEER, ConnectionCaps, ServiceProtocol


class ListenError(Exception):
    """Cannot serve where asked (one line: what and what to do)."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def check_exposure(host: str, tls: bool, insecure: bool) -> str | None:
    """Why listening on `host` is refused, or None. Off loopback, tokens and job commands
    would cross the network in clear without TLS."""
    if is_loopback(host) or tls or insecure:
        return None
    return (
        f"refusing to listen on {host} without TLS: tokens and jobs would cross the network "
        "in clear; give --tls-cert and --tls-key, or --insecure to accept that"
    )


def listen_unix(path: Path) -> socket.socket:
    """A listening Unix socket at `path` that every local user may connect to. A socket file
    left by a dead service is replaced; one that a live service answers on is not."""
    parent = path.parent
    try:
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o755)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise ListenError(f"{path} exists and is not a socket; remove it or give --socket")
            _take_over_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            failpoints.hit(failpoints.PAUSE_AFTER_SOCKET_BIND)
            _open_to_all(path)
            sock.listen(2048)
        except (OSError, ListenError):
            sock.close()
            raise
    except OSError as e:
        raise ListenError(f"cannot serve on {path}: {e.strerror or e} (try --socket)") from None
    return sock


def _open_to_all(path: Path) -> None:
    """The socket just bound at `path` made writable by every local user, through the file
    itself: opened without following a link, and only if it is a socket of ours with no other
    name. A chmod by path would follow whatever is at the name by then: in a directory that
    another user may write, that user could put a link (or a hard link to another socket of
    ours) there after the bind, and have us open the file it leads to to everyone."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise ListenError(
                f"cannot serve on {path}: it was replaced while it was being made (another "
                f"user may write {path.parent}); give --socket in a directory of this user's alone"
            )
        os.chmod(f"/proc/self/fd/{fd}", 0o666)  # an O_PATH descriptor takes no fchmod
    finally:
        os.close(fd)


def _take_over_socket(path: Path) -> None:
    """Remove the socket left at `path` by a service that is gone; ListenError when something
    still serves there, or when it is another user's, which this user may neither use nor
    remove (a dead socket of theirs was called "another aisched is serving")."""
    owner = user_name(path.lstat().st_uid)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uid: int | None = None  # of the process serving there, when one does
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
        served, uid = True, peer_credentials(probe).uid
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise ListenError(
                f"{path} is a socket of {owner} that this user may not use; its owner or root "
                "may remove it, or give --socket"
            ) from None
        served = e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()
    if served:
        who = "another aisched" if uid in (None, os.geteuid()) else f"a process of {user_name(uid)}"
        raise ListenError(f"{who} is serving on {path}; stop it, or give --socket")
    try:
        path.unlink()
    except PermissionError:
        raise ListenError(
            f"{path} is a socket of {owner} that this user may not remove; its owner or root "
            "may, or give --socket"
        ) from None


def make_servers(
    app: Any,
    listeners: list[tuple[socket.socket, dict[str, Any]]],
    graceful_s: float,
    per_peer: int = CONNECTIONS_PER_PEER,
) -> list[tuple[uvicorn.Server, socket.socket]]:
    """One uvicorn server per (socket, extra uvicorn options), all serving `app`; signals are
    left to the caller (`service.shutdown.Stopper`). A peer holds at most `per_peer`
    connections to them all together (`service.protocol`); a local user is one peer, over
    the socket and loopback TCP alike. A TCP listener on the loopback answers only to loopback
    host names and the machine's own where it resolves to the loopback (`service.hosts`)."""
    on_loopback = [_on_loopback(sock) for sock, _ in listeners]
    own_names = own_loopback_names() if any(on_loopback) else frozenset()
    caps = ConnectionCaps(per_peer, app.state.service.admins)
    protocol = type("ServiceProtocol", (ServiceProtocol,), {"caps": caps, "owners": ClientOwners()})
    return [
        (
            _Server(
                uvicorn.Config(
                    LoopbackHostsOnly(app, own_names) if loopback else app,
                    http=protocol,
                    lifespan="off",
                    log_level="warning",
                    timeout_keep_alive=5,
                    timeout_graceful_shutdown=max(1, int(graceful_s)),
                    limit_concurrency=4096,
                    # A client's address is its connection's: uvicorn would otherwise take the
                    # one X-Forwarded-For names from any local user on 127.0.0.1, and the
                    # rate limit of requests without a token (by address) would name nobody.
                    proxy_headers=False,
                    **extra,
                )
            ),
            sock,
        )
        for (sock, extra), loopback in zip(listeners, on_loopback, strict=True)
    ]


def _on_loopback(sock: socket.socket) -> bool:
    """Whether `sock` is a TCP socket bound to a loopback address (not a Unix socket, not the
    unspecified address)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    return is_loopback(str(sock.getsockname()[0]))


def stop_servers(servers: list[tuple[uvicorn.Server, socket.socket]]) -> None:
    for server, _ in servers:
        server.should_exit = True


def run_servers(servers: list[tuple[uvicorn.Server, socket.socket]]) -> None:
    """Serve until one server stops (asked to, or failing), then stop the others."""

    async def run() -> None:
        tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in servers]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop_servers(servers)
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())

"""Whose process accepts a TCP connection on this machine: the uid that owns the socket the
kernel made for it, read from the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`),
which every process may read. The autoscaler asks before it takes a replica's port as the
replica's: a port is free between the service choosing it and the replica binding it, and
after a replica dies, so another local user could bind it first and answer its probes and
scrapes. The CLI asks of each connection it makes to this machine before it writes to it
(`cli/owned_connections.py`). The kernel names no owner for a connection its listener has not
accepted yet, nor for one in TIME_WAIT (it answers uid 0, root's): such an answer is not
taken; the tables name a waiting connection's listener.

`ClientOwners` asks the other way round, for the service's own listener: which local user
owns the CLIENT socket of a loopback connection it accepted (`service/protocol.py` counts the
connections and tokenless requests of loopback TCP clients by that user, not by the address
127.0.0.1 that every local user shares). It asks the kernel for exactly that connection
(one NETLINK_SOCK_DIAG request, the `ss` tool's interface): the cost of a lookup does not grow
with the sockets open on the machine, as a scan of the tables would, so a user opening many
cannot make everyone's connections slow to accept.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import pwd
import socket
import struct
import threading

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the kernel's TCP_LISTEN, as the tables write states
TIME_WAIT = "06"

# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
TCP_LISTEN = 10
# Sockets the kernel names no owner for (it answers uid 0, as for root's): a connection in
# TIME_WAIT, and one the listener's side has not accepted yet, kept as a request, not a
# socket (answered as SYN_RECV with no inode; with TCP_DEFER_ACCEPT, until its first data).
TCP_SYN_RECV = 3
TCP_TIME_WAIT = 6
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2: family, protocol, extensions, states
_ID_ADDRESS = struct.Struct(">HH16s16s")  # inet_diag_sockid: ports and addresses, big-endian
_ID_REST = struct.Struct("=III")  # ... interface, cookie (two halves)
_MESSAGE = struct.Struct("=BBBB48sIIIII")  # inet_diag_msg: ..., sockid, ..., uid, inode
_ERROR = struct.Struct("=i")  # nlmsgerr's errno, negated
ALL_STATES = 0xFFFFFFFF

log = logging.getLogger("aisched.service")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return _plain(ipaddress.ip_address(host)).is_loopback
    except ValueError:
        return False


def is_this_machines(address: str) -> bool:
    """Whether a connection to `address` (an IP address, as a connected socket names its peer)
    reaches this machine: its loopback, the unspecified address (0.0.0.0 and :: connect here),
    or an address of one of its interfaces. Another local user may be listening there."""
    try:
        peer = _plain(ipaddress.ip_address(address.split("%")[0]))
    except ValueError:
        return False
    if peer.is_loopback or peer.is_unspecified:
        return True
    import psutil  # here: a connection to the loopback never needs it

    return peer in {
        _plain(ipaddress.ip_address(a.address.split("%")[0]))
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }


def _plain(address: IPAddress) -> IPAddress:
    """An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) as the IPv4 one it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


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
    when it is not in this machine's tables (another network namespace, another machine, or
    closed already). Asked of the kernel for exactly that socket (`ClientOwners.owner`);
    where it cannot be asked, or does not answer, looked for in the tables (a scan whose cost
    grows with every socket open here, which one user could multiply)."""
    mine, theirs = _address(sock.getsockname()), _address(sock.getpeername())
    with _PEERS_LOCK:  # one netlink socket for every thread that asks
        uid = _PEERS.owner(theirs, mine)
    return uid if uid is not None else peer_uid_in_tables(mine, theirs, tables)


def peer_uid_in_tables(
    mine: tuple[str, int], theirs: tuple[str, int], tables: tuple[str, ...] = TABLES
) -> int | None:
    """`peer_uid` from the tables alone: the owner of the socket at `theirs` (address and
    port) connected to `mine`. A connection not yet accepted is listed with its listener's
    owner; one in TIME_WAIT with uid 0 (the kernel keeps no owner for it), so it is no
    answer: its process closed it, and it takes nothing more."""
    want = (_plain(ipaddress.ip_address(theirs[0])), theirs[1])
    to = (_plain(ipaddress.ip_address(mine[0])), mine[1])
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 7
                and fields[3] != TIME_WAIT
                and (_endpoint(fields[1]), _endpoint(fields[2])) == (want, to)
            ):
                return int(fields[7])
    return None


def _address(sockname: tuple[str, int] | tuple[str, int, int, int]) -> tuple[str, int]:
    """An AF_INET or AF_INET6 socket's address and port, without IPv6's flow and scope."""
    return str(sockname[0]).partition("%")[0], int(sockname[1])


def _endpoint(field: str) -> tuple[IPAddress, int]:
    """A table's `HEXADDR:HEXPORT`: the address is written 32 bits at a time, each in this
    machine's byte order."""
    hex_address, _, hex_port = field.rpartition(":")
    raw = bytes.fromhex(hex_address)
    words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
    packed = b"".join(struct.pack("=I", int.from_bytes(w, "big")) for w in words)
    return _plain(ipaddress.ip_address(packed)), int(hex_port, 16)


def uid_of(user: str, default: int) -> int:
    """The uid a job of `user` runs as: the account's, else `default` (the service's own,
    which runs the jobs of names that are no local account)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return default


class ClientOwners:
    """The uid owning the client socket of a TCP connection from this machine's loopback,
    asked of the kernel by the connection's exact addresses and ports (inet_diag).

    One netlink socket, opened on the first lookup and kept: a lookup is one send and one
    receive, answered by the kernel before the send returns. Where the kernel cannot be asked
    (no netlink in a container's seccomp profile, no inet_diag), every lookup answers None, and
    the log says so once. For the event loop's thread only (no lock)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._sequence = 0
        self._usable: bool | None = None  # whether the kernel answers; None: not asked yet
        self._warned = False

    def uid(self, local: tuple[str, int], client: tuple[str, int]) -> int | None:
        """The uid owning the socket that connected from `client` to `local` (the accepted
        connection's own and peer addresses), or None: not a loopback client, gone already,
        or the kernel cannot be asked."""
        return self._owner(client, local, loopback_only=True)

    def owner(self, source: tuple[str, int], destination: tuple[str, int]) -> int | None:
        """The uid owning this machine's TCP socket at `source` connected to `destination`
        (addresses of any interface here), or None: no such socket in this network namespace,
        or the kernel cannot be asked."""
        return self._owner(source, destination, loopback_only=False)

    def _owner(
        self, source: tuple[str, int], destination: tuple[str, int], loopback_only: bool
    ) -> int | None:
        family, src, dst = _address_pair(source[0], destination[0], loopback_only)
        if family is None or not self.usable():
            return None
        request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, ALL_STATES)
        request += _ID_ADDRESS.pack(source[1], destination[1], src, dst)
        request += _ID_REST.pack(0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
        try:
            answer = self._ask(request, NLM_F_REQUEST)
        except OSError as e:
            if e.errno != errno.ENOENT:  # ENOENT: no such socket (it closed already)
                self._warn(e)
            return None
        for kind, body in answer:
            if kind == SOCK_DIAG_BY_FAMILY and len(body) >= _MESSAGE.size:
                _, state, _, _, sockid, _, _, _, uid, inode = _MESSAGE.unpack_from(body)
                sport, dport = _ID_ADDRESS.unpack_from(sockid)[:2]
                if state in (TCP_LISTEN, TCP_TIME_WAIT) or (state == TCP_SYN_RECV and not inode):
                    continue  # no owner named: its uid 0 is not root's
                if (sport, dport) == (source[1], destination[1]):
                    return int(uid)
        return None

    def usable(self) -> bool:
        """Whether the kernel answers socket look-ups here: asked once (an empty listing), so
        that a missing inet_diag is not taken, on every connection, for a socket that closed
        already; said once in the log when it does not."""
        if self._usable is None:
            try:
                no_state = _REQUEST.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0)
                self._ask(
                    no_state + bytes(_ID_ADDRESS.size + _ID_REST.size), NLM_F_REQUEST | NLM_F_DUMP
                )
                self._usable = True
            except OSError as e:
                self._usable = False
                self._warn(e)
        return self._usable

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _ask(self, payload: bytes, flags: int) -> list[tuple[int, bytes]]:
        """Send one request; its answer's messages (type, body). An error answer raises."""
        if self._sock is None:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        self._sequence += 1
        size = _HEADER.size + len(payload)
        header = _HEADER.pack(size, SOCK_DIAG_BY_FAMILY, flags, self._sequence, 0)
        messages: list[tuple[int, bytes]] = []
        try:
            self._sock.send(header + payload)
            while True:  # the kernel answered during the send: a receive never waits
                data = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
                for kind, sequence, body in _messages(data):
                    if sequence != self._sequence:
                        continue  # an earlier request's, left unread
                    if kind == NLMSG_ERROR:
                        code = -_ERROR.unpack_from(body)[0]
                        if code:
                            raise OSError(code, os.strerror(code))
                        return messages
                    if kind == NLMSG_DONE:
                        return messages
                    messages.append((kind, body))
                if messages and not flags & NLM_F_DUMP:
                    return messages  # one socket's: no NLMSG_DONE follows
        except OSError as e:
            if e.errno != errno.ENOENT:
                self.close()  # a fresh socket next time: nothing stale left to read
            raise

    def _warn(self, e: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot ask the kernel which user owns a loopback TCP connection (%s): "
                "loopback TCP clients are counted by address, all local users together "
                "(limits.connections_per_peer, request rate without a token)",
                e.strerror or e,
            )


_PEERS = ClientOwners()  # `peer_uid`'s, under its lock
_PEERS_LOCK = threading.Lock()


def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
    """The netlink messages in one datagram: (type, sequence, body)."""
    found = []
    at = 0
    while at + _HEADER.size <= len(data):
        length, kind, _, sequence, _ = _HEADER.unpack_from(data, at)
        if length < _HEADER.size:
            break
        found.append((kind, sequence, data[at + _HEADER.size : at + length]))
        at += (length + 3) & ~3  # NLMSG_ALIGN
    return found


def _address_pair(
    client: str, local: str, loopback_only: bool = True
) -> tuple[int | None, bytes, bytes]:
    """The family and 16-byte addresses to ask the kernel about a connection from `client`
    to `local`, or (None, ...) when they are not of one family (or, with `loopback_only`,
    not both loopback). An IPv4 address an IPv6 socket shows mapped (`::ffff:127.0.0.1`) is
    asked as IPv4: the client's socket is an IPv4 one."""
    try:
        addresses = [ipaddress.ip_address(a.partition("%")[0]) for a in (client, local)]
    except ValueError:
        return None, b"", b""
    addresses = [
        a.ipv4_mapped if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped else a
        for a in addresses
    ]
    if addresses[0].version != addresses[1].version:
        return None, b"", b""
    if loopback_only and not all(a.is_loopback for a in addresses):
        return None, b"", b""
    family = socket.AF_INET if addresses[0].version == 4 else socket.AF_INET6
    client_bytes, local_bytes = (a.packed.ljust(16, b"\0") for a in addresses)
    return family, client_bytes, local_bytes

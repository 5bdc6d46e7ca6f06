"""What it costs the service to learn which local user owns a loopback TCP client, per
accepted connection: one NETLINK_SOCK_DIAG request for the connection's exact addresses
(`listeners.ClientOwners`, what the service does) against a scan of /proc/net/tcp and
/proc/net/tcp6 (`listeners.peer_uid_in_tables`), with more and more connections open on the machine.

A local user can open thousands of connections; the cost of a scan grows with them, and the
service would pay it for each connection it accepts, so the user would slow every other
user's connections. Prints the median CPU microseconds (user + system, this process: the kernel
answers both in the caller's time) per lookup, and writes them into docs/benchmarks.md.

    python benchmarks/bench_peer_uid.py [--sizes 10,1000,8000] [--port 0] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

from aisched.service.listeners import ClientOwners, peer_uid, peer_uid_in_tables  # noqa: E402


def open_pairs(listener: socket.socket, n: int) -> list[tuple[socket.socket, socket.socket]]:
    """`n` connections to `listener`: (client, accepted) each."""
    address = listener.getsockname()
    pairs = []
    for _ in range(n):
        client = socket.create_connection(address)
        accepted, _ = listener.accept()
        pairs.append((client, accepted))
    return pairs


def cpu_us_per_call(call: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """The median over `rounds` of the CPU microseconds per call of `calls` calls."""
    per_call = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            call()
        per_call.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(per_call)


def measure(sizes: list[int], port: int) -> list[str]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    listener = socket.create_server(("127.0.0.1", port), backlog=4096)
    owners = ClientOwners()
    me = os.geteuid()
    rows = []
    pairs: list[tuple[socket.socket, socket.socket]] = []
    for size in sizes:
        pairs += open_pairs(listener, size - len(pairs))
        accepted = pairs[len(pairs) // 2][1]
        local, client = accepted.getsockname(), accepted.getpeername()
        assert owners.uid(local, client) == me and peer_uid(accepted) == me
        netlink_us = cpu_us_per_call(partial(owners.uid, local, client), 2000)
        scan = partial(peer_uid_in_tables, local, client)
        scan_us = cpu_us_per_call(scan, max(5, 20_000 // size))
        sockets = len(Path("/proc/net/tcp").read_text().splitlines()) - 1
        rows.append(
            f"| {size:,} | {sockets:,} | {netlink_us:,.1f} | {scan_us:,.1f} | "
            f"{scan_us / netlink_us:,.0f}× |"
        )
        print(rows[-1], flush=True)
    for client, accepted in pairs:
        client.close()
        accepted.close()
    listener.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,1000,8000", help="connections open, comma-separated")
    ap.add_argument("--port", type=int, default=0, help="the listener's port (0: any free)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    header = (
        "| connections open (this benchmark's) | lines in /proc/net/tcp | netlink lookup "
        "(CPU µs, median) | /proc/net/tcp{,6} scan (CPU µs, median) | scan / lookup |\n"
        "| ---: | ---: | ---: | ---: | ---: |"
    )
    print(header)
    rows = measure([int(s) for s in args.sizes.split(",")], args.port)
    if not args.no_write:
        write_section("peer-uid", header + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()

"""`aisched up`: start the scheduler service on this machine, in the foreground.

Configuration comes from the embedded defaults, then `--config FILE`, then flags. The service
listens on loopback and on a Unix socket (identity from the kernel) unless told otherwise; off
loopback it needs TLS or an explicit --insecure. Ctrl-C (or SIGTERM) stops the scheduler but
not the jobs it runs: the next `aisched up` on the same data directory adopts them. It exits
within `limits.shutdown_grace` whatever it waits on, and at once on a second signal
(`service.shutdown`). Every reason not to start is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import logging
import os
import signal
import socket
import ssl
import sys
import time
from typing import Any

from aisched import __version__
from aisched.cli.errors import CLIError
from aisched.model.cluster import capacity_of
from aisched.model.resources import describe_mib
from aisched.service.defaults import DEFAULT_PORT
from aisched.service.identity import service_user
from aisched.service.listeners import is_loopback
from aisched.service.serve import ListenError, check_exposure, listen_unix
from aisched.service.tls_files import check_tls_files

# This instance stopped leading or standing by (another took the lease over, starting as
# leader failed, a newer aisched migrated the database): the last line says why.
EXIT_DEPOSED = 3


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="start the scheduler service on this machine (foreground)",
        description="Start the aisched service: the scheduler, the local executor and the "
        "REST API. State lives in the data directory (SQLite); jobs keep running across "
        "restarts of the service.",
    )
    p.add_argument("--config", metavar="FILE", help="a service config YAML file")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="the local Unix socket, where identity comes from the kernel (default "
        "/run/aisched/aisched.sock as root, else $AISCHED_HOME/aisched.sock; '' for none)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="TLS certificate for the TCP port (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="TLS private key for the TCP port (PEM)")
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback --host without TLS (tokens then cross the network in clear)",
    )
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="state, logs, checkpoints (default $AISCHED_HOME or ~/.aisched)",
    )
    p.add_argument(
        "--database",
        metavar="URL",
        help="SQLAlchemy URL (default: SQLite in DIR); postgresql://USER@HOST/DB lets several "
        "instances share the state, one leading and the others standing by (docs/ha.md)",
    )
    p.add_argument(
        "--advertise",
        metavar="URL",
        help="with a shared database: the API address the other instances name to clients "
        "(default: the one listened on)",
    )
    p.add_argument("--policy", help="a policy preset or policy file (default: default)")
    p.add_argument(
        "--gpus",
        type=int,
        help="GPUs of this machine: with no NVIDIA GPU, declares N GPUs (for trying aisched "
        "on a CPU-only machine); with real GPUs, uses only the first N",
    )
    p.add_argument("--gpu-model", help="GPU model name for declared GPUs")
    p.add_argument("--cpus", help="CPU cores to schedule, e.g. 8 (default: all usable)")
    p.add_argument("--mem", help="memory to schedule, e.g. 64G (default: all)")
    p.add_argument(
        "--memory-limit",
        choices=("auto", "cgroup-v2", "cgroup-v1", "rlimit", "none"),
        help="how task memory is bounded (default auto: cgroups where writable, else rlimit)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run jobs on a Ray cluster: HOST:PORT of its head node, or auto for the one "
        "started on this machine (needs pip install 'aisched[ray]'; docs/ray.md)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every decision")
    p.set_defaults(func=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    # Imported here: the other commands should not pay for the server's start-up.
    from aisched.service.api import create_app
    from aisched.service.app import Service, ServiceError, forget_announcement
    from aisched.service.config import load_config
    from aisched.service.recovery import NodeChanged
    from aisched.service.serve import make_servers, run_servers, stop_servers
    from aisched.service.shutdown import Stopper
    from aisched.spec.errors import SpecError
    from aisched.spec.units import parse_cpus_milli, parse_mem_mib
    from aisched.store.db import StoreError

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:  # in the flags' own words, as `aisched run` says them
        cpus = None if args.cpus is None else parse_cpus_milli(args.cpus, "--cpus") / 1000
        mem_mib = None if args.mem is None else parse_mem_mib(args.mem, "--mem")
    except SpecError as e:
        raise CLIError(str(e)) from None
    if cpus == 0 or mem_mib == 0:
        raise CLIError(f"{'--cpus' if cpus == 0 else '--mem'}: must be above 0")
    overrides: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "socket": args.socket,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "insecure": args.insecure,
        "data_dir": args.data_dir,
        "database": args.database,
        "advertise": args.advertise,
        "policy": args.policy,
        "memory_limit": args.memory_limit,
        "ray": args.ray,
        "node": {
            "gpus": args.gpus,
            "gpu_model": args.gpu_model,
            "cpus": cpus,
            "mem": args.mem,
        },
    }
    try:
        config = load_config(args.config, overrides, flags=True)
    except SpecError as e:
        raise CLIError(str(e)) from None
    tls = _tls_options(config.tls_cert, config.tls_key)
    refusal = check_exposure(config.host, bool(tls), config.insecure)
    if refusal is not None:
        raise CLIError(refusal)

    stopper = Stopper(config.limits.shutdown_grace_s())
    stopper.install()
    # `kill -USR1 PID` writes every thread's stack to the log: where a wedged service waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        sock = _listen(config.host, config.port)
    except OSError as e:
        why = f"cannot listen on {config.host}:{config.port}: {e.strerror or e}"
        if e.errno == errno.EADDRINUSE:
            why += "; another program (another aisched up?) has it: stop it, or give --port"
        elif isinstance(e, socket.gaierror):
            why += " (--host takes an address or a name of this machine)"
        raise CLIError(why) from None
    try:
        service = Service.open(config)
    except (SpecError, ServiceError, StoreError) as e:
        sock.close()
        raise CLIError(str(e)) from None
    # Again: `ray.init` (--ray) put its own SIGTERM handler in place of ours, which printed a
    # stack and exited 15 without stopping in order.
    stopper.install()
    listeners: list[tuple[socket.socket, dict[str, Any]]] = [(sock, tls)]
    socket_path = config.socket_path()
    try:
        if socket_path is not None:
            listeners.append((listen_unix(socket_path), {}))
    except ListenError as e:
        service.close()
        sock.close()
        raise CLIError(str(e)) from None

    def forget_addresses() -> None:
        for path in service.announcements():
            forget_announcement(path)
        if socket_path is not None:
            with contextlib.suppress(OSError):
                socket_path.unlink()

    stopper.before_exit = forget_addresses
    deposed: list[str] = []
    try:
        host, port = sock.getsockname()[:2]
        # An IPv6 address goes in brackets in a URL (RFC 3986): http://[::1]:8470.
        where = f"[{host}]" if ":" in host else host
        url = f"{'https' if tls else 'http'}://{where}:{port}"
        app = create_app(service)
        servers = make_servers(
            app,
            listeners,
            config.limits.shutdown_grace_s() / 2,
            config.limits.connections_per_peer,
        )

        def on_deposed(why: str) -> None:  # another instance leads: stop, to stand by anew
            deposed.append(why)
            stop_servers(servers)

        service.on_deposed = on_deposed
        stopper.request_stop = lambda: stop_servers(servers)
        try:
            service.start(address=config.advertise or url)
        except (ServiceError, StoreError, NodeChanged) as e:  # recovery cannot start from it
            raise CLIError(str(e)) from None  # closed below
        if not is_loopback(config.host) and not tls:
            logging.getLogger("aisched.service").warning(
                "listening on %s without TLS (--insecure): tokens and jobs cross the network "
                "in clear",
                config.host,
            )
        nodes = service.scheduler.nodes
        node = nodes[0] if len(nodes) == 1 else None
        info = service.executor.info()
        print(f"aisched {__version__} listening on {url}", file=sys.stderr)
        if socket_path is not None:
            print(f"  local socket: {socket_path} (identity from the kernel)", file=sys.stderr)
        if os.geteuid() != 0:
            print(
                f"  not running as root: only {service_user()}'s jobs can run (docs/security.md)",
                file=sys.stderr,
            )
        print(f"  data directory: {service.home}", file=sys.stderr)
        print(f"  policy: {service.policy.name}", file=sys.stderr)
        lead = service.leadership
        if service.store.shared:
            print(
                f"  database {service.store.url}: {lead.role.value}, term {lead.seen_term()}"
                + ("" if lead.leading else f", leader {lead.leader_address() or '(none)'}"),
                file=sys.stderr,
            )
        if node is not None:
            print(
                f"  node {node.name}: {node.milli_cpu / 1000:g} CPUs, "
                f"{describe_mib(node.mem_mib)}, {len(node.gpus)} GPUs; "
                f"memory limits: {info.memory_limit}",
                file=sys.stderr,
            )
        if len(nodes) != 1:
            print(
                f"  {len(nodes)} nodes: {sum(n.milli_cpu for n in nodes) / 1000:g} CPUs, "
                f"{sum(len(n.gpus) for n in nodes)} GPUs, "
                f"racks {', '.join(sorted({n.rack for n in nodes}))}",
                file=sys.stderr,
            )
        for note in service.node_notes:
            print(f"  {note}", file=sys.stderr)
        for note in service.scheduler.queues.guarantees_beyond(capacity_of(nodes)):
            logging.getLogger("aisched.service").warning("queues: %s", note)
        for note in service.recovery_notes:
            print(f"  recovered: {note}", file=sys.stderr)
        service.announce(f"unix:{socket_path}" if socket_path is not None else url)
        run_servers(servers)
    finally:
        service.close()
        for s, _ in listeners:
            s.close()
        forget_addresses()
        stopper.stopped.set()
    if deposed:
        # What became of it, as this instance knows it: a new leader only if it saw one.
        print(f"aisched: {deposed[0]}; {service.leadership.then}", file=sys.stderr)
        return EXIT_DEPOSED
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it every keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _tls_options(cert: str | None, key: str | None) -> dict[str, Any]:
    """uvicorn's TLS options, after checking that the files make a usable TLS context."""
    if cert is None and key is None:
        return {}
    if cert is None or key is None:
        raise CLIError("TLS needs both --tls-cert and --tls-key")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise CLIError(f"cannot use the TLS certificate {cert} and key {key}: {e}") from None
    checked = check_tls_files(cert, key, time.time())
    if checked.refusal is not None:
        raise CLIError(checked.refusal)
    for warning in checked.warnings:  # the log is stderr
        logging.getLogger("aisched.service").warning("%s", warning)
    return {"ssl_certfile": cert, "ssl_keyfile": key}

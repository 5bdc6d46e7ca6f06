"""`aisched up`: start the scheduler service on this machine, in the foreground.

Configuration comes from the embedded defaults, then `--config FILE`, then flags. The service
listens on loopback unless told otherwise. Ctrl-C (or SIGTERM) stops the scheduler but not the
jobs it runs: the next `aisched up` on the same data directory adopts them. It exits within
`limits.shutdown_grace` whatever it waits on, and at once on a second signal
(`service.shutdown`). Every reason not to start is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
from typing import Any

from aisched import __version__
from aisched.cli.errors import CLIError
from aisched.service.defaults import DEFAULT_PORT


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
        "--data-dir",
        metavar="DIR",
        help="state, logs, checkpoints (default $AISCHED_HOME or ~/.aisched)",
    )
    p.add_argument("--database", metavar="URL", help="SQLAlchemy URL (default: SQLite in DIR)")
    p.add_argument("--policy", help="a policy preset or policy file (default: default)")
    p.add_argument(
        "--gpus",
        type=int,
        help="GPUs of this machine: with no NVIDIA GPU, declares N GPUs (for trying aisched "
        "on a CPU-only machine); with real GPUs, uses only the first N",
    )
    p.add_argument("--gpu-model", help="GPU model name for declared GPUs")
    p.add_argument("--cpus", type=float, help="CPU cores to schedule (default: all usable)")
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
    import uvicorn

    from aisched.service.api import create_app
    from aisched.service.app import Service, ServiceError
    from aisched.service.config import load_config
    from aisched.service.shutdown import Stopper
    from aisched.spec.errors import SpecError
    from aisched.store.db import StoreError

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "database": args.database,
        "policy": args.policy,
        "memory_limit": args.memory_limit,
        "ray": args.ray,
        "node": {
            "gpus": args.gpus,
            "gpu_model": args.gpu_model,
            "cpus": args.cpus,
            "mem": args.mem,
        },
    }
    try:
        config = load_config(args.config, overrides)
    except SpecError as e:
        raise CLIError(str(e)) from None

    class _QuietServer(uvicorn.Server):
        """uvicorn's server with the signals left to the `Stopper` (uvicorn's own handler
        waits for open connections without a bound, then raises the signal again)."""

        def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
            return contextlib.nullcontext()

    stopper = Stopper(config.limits.shutdown_grace_s())
    stopper.install()
    try:
        sock = _listen(config.host, config.port)
    except OSError as e:
        raise CLIError(
            f"cannot listen on {config.host}:{config.port}: {e.strerror or e}; another program "
            "(another aisched up?) has it: stop it, or give --port",
        ) from None
    try:
        service = Service.open(config)
    except (SpecError, ServiceError, StoreError) as e:
        sock.close()
        raise CLIError(str(e)) from None
    stopper.before_exit = lambda: (service.home / "server.json").unlink(missing_ok=True)
    try:
        service.start()
        app = create_app(service)
        grace = config.limits.shutdown_grace_s()
        server = _QuietServer(
            uvicorn.Config(
                app, log_level="warning", timeout_graceful_shutdown=max(1, int(grace / 2))
            )
        )

        def request_stop() -> None:
            server.should_exit = True

        stopper.request_stop = request_stop
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}"
        nodes = service.scheduler.nodes
        node = nodes[0] if len(nodes) == 1 else None
        info = service.executor.info()
        print(f"aisched {__version__} listening on {url}", file=sys.stderr)
        print(f"  data directory: {service.home}", file=sys.stderr)
        print(f"  policy: {service.policy.name}", file=sys.stderr)
        if node is not None:
            print(
                f"  node {node.name}: {node.milli_cpu / 1000:g} CPUs, "
                f"{node.mem_mib / 1024:.1f} GiB, {len(node.gpus)} GPUs; "
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
        for note in service.recovery_notes:
            print(f"  recovered: {note}", file=sys.stderr)
        service.announce(url)
        server.run(sockets=[sock])
    finally:
        service.close()
        sock.close()
        stopper.stopped.set()
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

"""`aisched top`: a live terminal view of nodes, GPUs, queues and waiting jobs.

It reads the service's `/v1/dashboard` document (one request a frame, the same figures as the
web page) and redraws with rich's `Live`; `--once` prints one frame and exits, for scripts and
tests. Into a pipe or a file, where nothing can be redrawn, it prints each frame after the last
(as `top -b` does). Ctrl-C ends it quietly.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from aisched.cli.client import Client, add_server_option
from aisched.cli.errors import CLIError
from aisched.cli.eta import eta_words
from aisched.cli.printable import plain
from aisched.model.resources import describe_mib_of

GPU_STYLE = {"free": "green", "used": "bold blue", "shared": "bold yellow"}
MIN_INTERVAL_S = 0.2  # each frame is a request: faster spends the caller's rate limit for nothing


def register(sub: Any) -> None:
    p = sub.add_parser("top", help="live view of nodes, GPUs, queues and waiting jobs")
    add_server_option(p)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between frames"
    )
    p.set_defaults(func=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    client = Client.from_args(args)
    if args.json:
        print(json.dumps(client.request("GET", "/v1/dashboard"), indent=2))
        return 0
    console = Console(highlight=False)
    if not console.is_terminal:
        # A pipe gets rich's 80 columns, which would wrap every reason; give the frame room.
        console = Console(highlight=False, width=160)
    if args.once:
        console.print(frame(client.request("GET", "/v1/dashboard")))
        return 0
    if not args.interval >= MIN_INTERVAL_S:  # NaN too; it was taken as 0.2 s without a word
        raise CLIError(f"--interval: at least {MIN_INTERVAL_S:g} (seconds between frames)")
    interval = args.interval
    try:
        if not console.is_terminal:
            # Live draws a pipe's frame only when it stops, and a `top` is stopped by a signal.
            while True:
                console.print(frame(client.request("GET", "/v1/dashboard")))
                console.print()
                time.sleep(interval)
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                live.update(frame(client.request("GET", "/v1/dashboard")), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def frame(doc: dict[str, Any]) -> RenderableType:
    """One screen: a summary line, the GPUs of every node by rack, queues, waiting jobs."""
    parts: list[RenderableType] = [_summary(doc), _gpus(doc), _queues(doc), _pending(doc)]
    for line in doc.get("errors") or []:
        parts.append(Text(f"section failed: {line}", style="red"))
    return Group(*parts)


def _pair(p: dict[str, float] | None) -> str:
    return "-" if not p else f"{p['used']:g}/{p['total']:g}"


def _summary(doc: dict[str, Any]) -> Text:
    s = doc.get("summary") or {}
    jobs = s.get("jobs") or {}
    return Text.assemble(
        ("aisched ", "bold"),
        f"{doc.get('version', '')}  policy {doc.get('policy') or '-'}  ",
        ("running ", "dim"),
        str(jobs.get("running", 0)),
        ("  waiting ", "dim"),
        str(jobs.get("pending", 0)),
        ("  GPUs ", "dim"),
        _pair(s.get("gpus")),
        ("  CPUs ", "dim"),
        _pair(s.get("cpus")),
        ("  memory ", "dim"),
        _memory(s.get("mem_gib")),
    )


def _memory(p: dict[str, float] | None) -> str:
    """A part of the memory (used, or free) and the total, as `aisched nodes` and every
    other size say them (`22057 / 24105 MiB`), not in tenths of a GiB (`21.5/23.5`). The
    document's GiB are MiB / 1024: rounding gives the MiB back."""
    if not p:
        return "-"
    return describe_mib_of(round(p["used"] * 1024), round(p["total"] * 1024))


def _gpu_cell(gpu: dict[str, Any]) -> Text:
    state = gpu.get("state", "free")
    if state == "free":
        who = "free"
    else:
        who = ",".join(
            f"{u['job']}" + (f"×{u['gpu_milli'] / 1000:g}" if u["gpu_milli"] < 1000 else "")
            for u in gpu.get("users", [])
        )
    return Text(f"{gpu['index']}:{who}", style=GPU_STYLE.get(state, ""))


def _gpus(doc: dict[str, Any]) -> Table:
    table = Table(title="nodes", title_justify="left", box=None, header_style="bold")
    for col in ("RACK", "NODE", "CPUS FREE", "MEM FREE", "GPUS (index:job)"):
        table.add_column(col)
    for rack in doc.get("racks") or []:
        for i, node in enumerate(rack["nodes"]):
            cells = Text(" ").join(_gpu_cell(g) for g in node["gpus"]) or Text("-")
            name = node["name"] + ("" if node["healthy"] else " (unhealthy)")
            table.add_row(
                plain(rack["name"] if i == 0 else ""),
                plain(name),
                f"{node['free_cpus']:g}/{node['cpus']:g}",
                _memory({"used": node["free_mem_gib"], "total": node["mem_gib"]}),
                cells,
            )
    return table


def _queues(doc: dict[str, Any]) -> Table:
    table = Table(title="queues", title_justify="left", box=None, header_style="bold")
    for col in ("QUEUE", "GPUS USED", "GUARANTEE", "BORROWED", "SHARE", "WAITING", "RUNNING"):
        table.add_column(col)
    for q in doc.get("queues") or []:
        table.add_row(
            plain(q["name"]),
            f"{q['used_gpus']:g}",
            f"{q['guarantee_gpus']:g}",
            Text(f"{q['borrowed_gpus']:g}", style="red" if q["borrowed_gpus"] else ""),
            f"{100 * q['share']:.0f}%",
            str(q["pending"]),
            str(q["running"]),
        )
        for u in q.get("users") or []:
            table.add_row(*_user_row(u, q["user_limit"]))
    return table


# A per-user limit's resources, as `aisched queues`' PER USER column names them.
USER_UNITS = (("gpus", "GPU"), ("cpus", "CPU"), ("mem_gib", "GiB"))


def _user_row(user: dict[str, Any], limit: dict[str, float]) -> tuple[Text, Text]:
    """Under a queue with a per-user limit: a user with running jobs there and what they hold
    against it, in red at the limit (their next job there waits)."""
    name = "other users" if user["others"] else user["user"]
    held = ", ".join(
        f"{user[key]:g} of {limit[key]:g} {unit}" for key, unit in USER_UNITS if key in limit
    )
    if user["at_limit"]:
        return plain(f"  {name}"), Text(f"{held} (at the limit)", style="red")
    return plain(f"  {name}"), Text(held)


def _pending(doc: dict[str, Any]) -> Table:
    table = Table(title="waiting jobs", title_justify="left", box=None, header_style="bold")
    for col in ("JOB", "NAME", "QUEUE", "GPUS", "WAITING", "REASON", "ESTIMATED START"):
        table.add_column(col)
    now = doc.get("time") or time.time()
    for j in doc.get("pending") or []:
        eta = j.get("eta")
        table.add_row(
            plain(j["id"]),
            plain(j["name"]),
            plain(j["queue"]),
            f"{j['gpus']:g}",
            _duration(j["waited_s"]),
            plain(j["reason"]),
            "-" if eta is None else eta_words(eta, now),
        )
    if not doc.get("pending"):
        table.add_row("-", "no job is waiting", "", "", "", "", "")
    if more := doc.get("pending_more"):
        table.add_row("", f"and {more} more waiting jobs, submitted later", "", "", "", "", "")
    return table


def _duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"

"""`aisched nodes` and `aisched queues`: what the cluster has, who uses it, how it is enforced."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aisched.cli.client import Client, add_server_option
from aisched.cli.printable import plain
from aisched.model.resources import describe_mib, describe_mib_of


def register(sub: Any) -> None:
    p = sub.add_parser("nodes", help="nodes: capacity, free resources, each GPU and its users")
    add_server_option(p)
    p.set_defaults(func=cmd_nodes)
    p = sub.add_parser(
        "queues", help="queues: guarantee, limit, per-user limit, usage, waiting and running jobs"
    )
    add_server_option(p)
    p.set_defaults(func=cmd_queues)


def cmd_nodes(args: argparse.Namespace) -> int:
    out = Client.from_args(args).request("GET", "/v1/nodes")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_nodes(out["nodes"], Console(highlight=False))
    return 0


def print_nodes(nodes: list[dict[str, Any]], con: Console) -> None:
    """The nodes table, each node's GPUs, then the executor's notes. On one machine it fits
    80 columns: RACK only where the nodes are in more than one rack (like the optional
    columns of `aisched queues`), and the headings no wider than what they head."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    racked = len({n["rack"] for n in nodes}) > 1
    for col in ("NODE", *(("RACK",) if racked else ()), "CPUS FREE", "MEM FREE", "GPUS FREE"):
        table.add_column(col)
    table.add_column("MEM LIMIT")
    table.add_column("PINNING")
    for n in nodes:
        free_gpus = sum(g["free_milli"] for g in n["gpus"]) / 1000
        table.add_row(
            Text.assemble(plain(n["name"]), ("" if n["healthy"] else (" (unhealthy)", "red"))),
            *((plain(n["rack"]),) if racked else ()),
            f"{n['free_milli_cpu'] / 1000:g} / {n['milli_cpu'] / 1000:g}",
            describe_mib_of(n["free_mem_mib"], n["mem_mib"]),
            f"{free_gpus:g} / {len(n['gpus'])}",
            plain(n["memory_limit"]),
            plain(n.get("pinning") or ("cpu affinity" if n["cpu_affinity"] else "none")),
        )
    con.print(table)
    for n in nodes:
        if n["gpus"]:
            gt = Table(
                box=None,
                header_style="bold",
                title=plain(f"{n['name']} GPUs"),
                title_justify="left",
            )
            for col in ("GPU", "MODEL", "MEMORY", "FREE", "USED BY"):
                gt.add_column(col)
            for g in n["gpus"]:
                users = ", ".join(
                    f"job {u['job']} {u['task']}"
                    + (f" ({u['gpu_milli'] / 1000:g})" if u["gpu_milli"] < 1000 else "")
                    for u in g["used_by"]
                )
                gt.add_row(
                    str(g["index"]),
                    plain(g["model"]),
                    describe_mib(g["mem_mib"]) if g["mem_mib"] else "-",
                    f"{g['free_milli'] / 1000:g}",
                    plain(users or "-"),
                )
            con.print(gt)
    # Most notes are the executor's, alike on every node: each is said once.
    for note in dict.fromkeys(note for n in nodes for note in n["notes"]):
        con.print(Text.assemble("  ", plain(note, "dim")))


def cmd_queues(args: argparse.Namespace) -> int:
    out = Client.from_args(args).request("GET", "/v1/queues")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    Console(highlight=False).print(queues_table(out["queues"]))
    return 0


def queues_table(queues: list[dict[str, Any]]) -> Table:
    """The queues table. An 80-column terminal has no room for a column that says nothing:
    PARENT only where some queue has one, WEIGHT where some weight differs (equal weights
    share alike), MAX PRI where some queue sets a cap, BORROWED per `_shows_borrowed`."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    nested = any(q["parent"] for q in queues)
    weighted = len({q["weight"] for q in queues}) > 1
    capped = any(q.get("max_priority") for q in queues)
    borrowing = _shows_borrowed(queues)
    columns = (
        "QUEUE",
        *(("PARENT",) if nested else ()),
        *(("WEIGHT",) if weighted else ()),
        "GUARANTEE",
        "LIMIT",
        "PER USER",
        *(("MAX PRI",) if capped else ()),
        "USED",
        *(("BORROWED",) if borrowing else ()),
        "PENDING",
        "RUNNING",
    )
    for col in columns:
        table.add_column(col)
    for q in queues:
        table.add_row(
            plain(q["name"]),
            *((plain(q["parent"] or "-"),) if nested else ()),
            *((f"{q['weight']:g}",) if weighted else ()),
            _amount(q["guarantee"]),
            _cap(q["limit"]),
            _cap(q.get("user_limit")),
            *((str(q.get("max_priority", 0)),) if capped else ()),
            _amount(q["used"]),
            *((_amount(q.get("borrowed") or {}),) if borrowing else ()),
            str(q["pending"]),
            str(q["running"]),
        )
    return table


def _shows_borrowed(queues: list[dict[str, Any]]) -> bool:
    """Whether `aisched queues` has a BORROWED column: like MAX PRI, only where it says
    something (an 80-column terminal has no room to spare), while some queue borrows and some
    queue has a guarantee to take it back for (a server before it was given says nothing)."""
    guaranteed = any(_amount(q["guarantee"]) != "-" for q in queues)
    return guaranteed and any(_amount(q.get("borrowed") or {}) != "-" for q in queues)


def _cap(a: dict[str, float] | None) -> str:
    """A limit: each resource it caps, a 0 too (the queue may use none of it); "-" where it
    caps none."""
    if not a:
        return "-"
    parts = [f"{a['gpus']:g} GPU"] if "gpus" in a else []
    if "cpus" in a:
        parts.append(f"{a['cpus']:g} CPU")
    if "mem_gib" in a:
        parts.append(describe_mib(round(a["mem_gib"] * 1024)))
    return ", ".join(parts)


def _amount(a: dict[str, float]) -> str:
    parts = []
    if a.get("gpus"):
        parts.append(f"{a['gpus']:g} GPU")
    if a.get("cpus"):
        parts.append(f"{a['cpus']:g} CPU")
    if a.get("mem_gib"):
        parts.append(describe_mib(round(a["mem_gib"] * 1024)))
    return ", ".join(parts) or "-"

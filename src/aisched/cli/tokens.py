"""`aisched token create|list|revoke` and `aisched audit`: API tokens and the audit log.

Tokens are for TCP clients (another machine, a script, the dashboard); on this machine the CLI
talks over the Unix socket, where the kernel says who you are. `create` prints the secret once:
the service keeps only its hash. Admins create tokens for anyone; a user lists and revokes
their own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from aisched.cli.client import Client, add_server_option
from aisched.cli.errors import CLIError
from aisched.cli.options import token_id, whole
from aisched.cli.printable import plain
from aisched.service.defaults import MAX_LIST_LIMIT


def register(sub: Any) -> None:
    p = sub.add_parser("token", help="API tokens for TCP clients and the dashboard")
    tsub = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    c = tsub.add_parser("create", help="create a token for USER (admins); printed once")
    add_server_option(c)
    c.add_argument("user")
    c.add_argument("--admin", action="store_true", help="the token acts as an admin")
    c.add_argument(
        "--read-only",
        action="store_true",
        help="the token may only read (dashboards, monitoring): no submit, cancel or change",
    )
    c.add_argument("--expires", metavar="DURATION", help="e.g. 30d, 12h (default: never)")
    c.add_argument("--note", help="what the token is for")
    c.set_defaults(func=cmd_create)
    ls = tsub.add_parser("list", help="tokens (yours; every user's for admins)")
    add_server_option(ls)
    ls.set_defaults(func=cmd_list)
    r = tsub.add_parser("revoke", help="revoke a token by its id")
    add_server_option(r)
    r.add_argument("id", type=token_id, metavar="ID")
    r.set_defaults(func=cmd_revoke)

    a = sub.add_parser("audit", help="the audit log: cancels and actions on others' jobs (admins)")
    add_server_option(a)
    a.add_argument("--limit", type=whole(1, MAX_LIST_LIMIT), default=100)
    a.set_defaults(func=cmd_audit)


def cmd_create(args: argparse.Namespace) -> int:
    from aisched.spec.errors import SpecError
    from aisched.spec.units import parse_duration_s

    body: dict[str, Any] = {
        "user": args.user,
        "admin": args.admin,
        "read_only": args.read_only,
        "note": args.note,
    }
    if args.expires:
        try:
            body["expires_in_s"] = parse_duration_s(args.expires, "--expires")
        except (SpecError, ValueError) as e:
            raise CLIError(str(e)) from None
    out = Client.from_args(args).request("POST", "/v1/tokens", json=body)
    if args.json:
        print(json.dumps(out))
    else:
        print(out["token"])
        print(
            f"token {out['id']} for {out['user']}{' (admin)' if out['admin'] else ''}"
            f"{' (read-only)' if out.get('read_only') else ''}: "
            "shown once; keep it in AISCHED_TOKEN or a 0600 file",
            file=sys.stderr,
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = Client.from_args(args).request("GET", "/v1/tokens")
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("ID", "USER", "ADMIN", "READ-ONLY", "CREATED", "BY", "EXPIRES", "STATE", "NOTE"):
        table.add_column(col)
    now = time.time()
    for r in rows:
        expired = r["expires_at"] is not None and r["expires_at"] <= now
        state = "revoked" if r["revoked_at"] else "expired" if expired else "active"
        table.add_row(
            *map(
                plain,
                (
                    r["id"],
                    r["user"],
                    "yes" if r["admin"] else "",
                    "yes" if r.get("read_only") else "",
                    _when(r["created_at"]),
                    r["created_by"],
                    _when(r["expires_at"]) if r["expires_at"] else "never",
                    state,
                    r["note"] or "",
                ),
            )
        )
    Console().print(table)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    out = Client.from_args(args).request("POST", f"/v1/tokens/{args.id}/revoke")
    print(json.dumps(out) if args.json else f"token {out['id']} of {out['user']} revoked")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    rows = Client.from_args(args).request("GET", "/v1/audit", params={"limit": args.limit})
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(box=None, header_style="bold")
    for col in ("TIME", "WHO", "VIA", "ACTION", "TARGET", "OWNER", "DETAIL"):
        table.add_column(col)
    for r in rows:
        table.add_row(  # what users did, in their words (names, details): text, not markup
            *map(
                plain,
                (
                    _when(r["time"]),
                    r["actor"],
                    r["via"],
                    r["action"],
                    r["target"],
                    r["owner"] or "",
                    r["detail"] or "",
                ),
            )
        )
    Console().print(table)
    return 0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

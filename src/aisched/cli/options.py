"""The `aisched` argument parser: one-line errors, and `--server`/`--json` on either side of the
subcommand.

Every error the command prints has one form (docs/service.md, "Errors"): one `error: ...` line,
then one indented line per problem, each naming its field path. argparse's own mistakes (an
unknown option, `--replicas x`) keep to it too: the `error:` line and a pointer to `--help`,
never the whole usage text.

`--server URL` and `--json` are accepted before the subcommand (`aisched --json jobs`) as well as
after it (`aisched jobs --json`); given after it, the subcommand's value wins. A command that
takes neither (`up`, `simulate`'s `--json FILE`) refuses the global one with a clear line. This
module imports only argparse, so it costs nothing to a command that never talks to a service.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from aisched.model.numerals import is_decimal


def whole(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `minimum` to `maximum`. Past them the service
    refused the value naming its own field (`query.limit`, `replicas`), not the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value}: from {minimum} to {maximum:,}")
        return value

    return parse


# Where the global options land in the namespace, apart from the subcommands' own.
_SERVER, _JSON = "global_server", "global_json"


class Parser(argparse.ArgumentParser):
    """argparse with the house error form. Subparsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        if hasattr(ns, _SERVER):  # the top-level parser: the subcommand has been parsed too
            self._merge_globals(ns)
        return ns, rest

    def _merge_globals(self, ns: argparse.Namespace) -> None:
        server, as_json = getattr(ns, _SERVER), getattr(ns, _JSON)
        delattr(ns, _SERVER)
        delattr(ns, _JSON)
        command = getattr(ns, "command", None)
        if command is None:
            return
        if server is not None:
            if not hasattr(ns, "server"):
                self.error(f"--server: aisched {command} does not talk to a service")
            if ns.server is None:
                ns.server = server
        if as_json:
            own = getattr(ns, "json", None)
            if not hasattr(ns, "json"):
                self.error(f"--json: aisched {command} has no JSON output")
            if not isinstance(own, bool):
                self.error(
                    f"--json: aisched {command} writes JSON to a file: give --json FILE after it"
                )
            ns.json = True


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """`--server` and `--json` on the top-level parser (see the module docstring)."""
    parser.add_argument(
        "--server",
        dest=_SERVER,
        metavar="URL",
        help="the aisched service, for every client command (also accepted after it)",
    )
    parser.add_argument(
        "--json",
        dest=_JSON,
        action="store_true",
        help="print JSON instead of a table, for every client command (also after it)",
    )


def job_id(value: str) -> str:
    """An argparse type: a job's ID as the service gives it (a decimal number), so that no
    argument can make a request to another path (`1/../2`, `?x=1`)."""
    if not (is_decimal(value) and len(value) <= 20):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a job ID: give the number `aisched jobs` shows"
        )
    return value


def idempotency_key(value: str) -> str:
    """An argparse type: a submission's Idempotency-Key (1 to 200 letters, digits, '.', '_',
    ':' or '-'; the service takes up to 200 characters, and a header takes no others)."""
    plain = all(c.isascii() and (c.isalnum() or c in "._:-") for c in value)
    if not (plain and 0 < len(value) <= 200):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an idempotency key: give 1 to 200 letters, digits, '.', '_', "
            "':' or '-' (a failed submission's error names its key)"
        )
    return value


def token_id(value: str) -> str:
    """An argparse type: a token's public id (letters, digits, '-' and '_'), as `job_id`."""
    plain = all(c.isascii() and (c.isalnum() or c in "-_") for c in value)
    if not (plain and 0 < len(value) <= 64):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a token id: give the id `aisched token list` shows"
        )
    return value

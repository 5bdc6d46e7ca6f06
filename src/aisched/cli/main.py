"""Entry point of the `aisched` command: global options and the subcommand table.

`main` never lets an expected error escape as a traceback: a `CLIError` becomes one `error: ...`
line (continuation lines indented) on stderr and its exit status; argparse's own usage errors
exit 2 as usual. Unexpected exceptions are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from aisched import __version__
from aisched.cli import cluster, jobs, simulate, up
from aisched.cli.errors import CLIError

# Subcommand modules, in the order `aisched --help` lists them.
COMMANDS = (up, jobs, cluster, simulate)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aisched",
        description="An AI compute-resource scheduler and its trace-driven simulator.",
    )
    parser.add_argument("--version", action="version", version=f"aisched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def print_error(message: str) -> None:
    first, *rest = message.splitlines() or [""]
    print(f"error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return func(args)
    except CLIError as e:
        print_error(str(e))
        return e.status
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

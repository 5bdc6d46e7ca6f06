"""Entry point of the `aisched` command: global options and the subcommand table.

`main` never lets an expected error escape as a traceback: a `CLIError` becomes one `error: ...`
line (continuation lines indented) on stderr and its exit status; argparse's own usage errors
take the same one-line form and exit 2 (`cli/options.py`, which also lets `--server` and
`--json` come before the subcommand), and so does an answer of the wrong shape from a server
(`errors.reading_answers`). Unexpected exceptions are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from aisched import __version__
from aisched.cli.errors import CLIError, reading_answers
from aisched.cli.options import Parser, add_global_options
from aisched.cli.printable import printable

# Subcommand modules, in the order `aisched --help` lists them, and the commands each adds.
COMMANDS: dict[str, tuple[str, ...]] = {
    "up": ("up",),
    "jobs": ("run", "submit", "jobs", "show", "logs", "cancel"),
    "cluster": ("nodes", "queues"),
    "top": ("top",),
    "tokens": ("token", "audit"),
    "simulate": ("simulate",),
}

Handler = Callable[[argparse.Namespace], int]


def _modules(argv: Sequence[str]) -> list[ModuleType]:
    """The subcommand modules to load: only the invoked command's (a client command should not
    import the simulator or the server), all of them for `--help` or a mistake."""
    first = _command_word(argv)
    names = [m for m, cmds in COMMANDS.items() if first in cmds] or list(COMMANDS)
    return [importlib.import_module(f"aisched.cli.{m}") for m in names]


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand's name: the first word that is neither an option nor the value of a
    global option that takes one (`aisched --server URL jobs`)."""
    words = iter(argv)
    for a in words:
        if a == "--server":
            next(words, None)
        elif not a.startswith("-"):
            return a
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog="aisched",
        description="An AI compute-resource scheduler and its trace-driven simulator.",
    )
    parser.add_argument("--version", action="version", version=f"aisched {__version__}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in _modules([] if argv is None else argv):
        module.register(sub)
    return parser


def print_error(message: str) -> None:
    first, *rest = printable(message, lines=True).splitlines() or [""]
    print(f"error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        with reading_answers():
            return func(args)
    except CLIError as e:
        print_error(str(e))
        return e.status
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (`aisched jobs --json | head`): stop quietly with status 1, as
        # rich does for the tables. Python flushes stdout again at exit: point it elsewhere.
        with contextlib.suppress(OSError, ValueError):  # a stdout with no file: nothing to do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

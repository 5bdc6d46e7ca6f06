"""The `aisched` command. Each subcommand lives in its own module of this package.

A subcommand module has `register(subparsers)`, which adds its parser and sets `func` to a
function taking the parsed arguments and returning the exit status. Bad input is reported by
raising `CLIError`; `main` turns it into one `error: ...` line on stderr and exit status 2.
"""

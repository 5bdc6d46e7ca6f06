"""The one exception a subcommand raises for bad input; `main` prints it and exits 2."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_FAILURE = 1


class CLIError(Exception):
    """Bad input or an unusable environment, told to the user without a traceback.

    `status` is the exit status: 2 for input the user can fix, 1 for a run that failed.
    """

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status

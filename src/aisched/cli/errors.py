"""The one exception a subcommand raises for bad input; `main` prints it and exits 2.

An answer of the service is read by the commands as the JSON it is. A server that is no aisched
(or not of this version) may answer JSON of another shape (`{"jobs": 5}`, a list where an object
is expected): what the command then trips over is told, with the server and endpoint that gave
it, as one line (`reading_answers`), never as a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

EXIT_USAGE = 2
EXIT_FAILURE = 1


class CLIError(Exception):
    """Bad input or an unusable environment, told to the user without a traceback.

    `status` is the exit status: 2 for input the user can fix, 1 for a run that failed.
    """

    def __init__(self, message: str, status: int = EXIT_USAGE, kept_nothing: bool = False) -> None:
        super().__init__(message)
        self.status = status
        # The service said it kept nothing of the request (its header `aisched-kept`).
        self.kept_nothing = kept_nothing


class NotSent(CLIError):
    """A request that never reached the service (it could not be connected to): nothing of
    it can have been kept there."""


# What reading a JSON document of another shape than expected raises: a missing field, a value
# of another type (iterated, indexed, called a method of, converted).
_SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)
# The server, method and path of the last JSON answer the command was given, if any.
_answered: ContextVar[tuple[str, str, str] | None] = ContextVar("answered", default=None)
_JSON_TYPES = {
    "int": "a number",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list",
    "dict": "an object",
    "NoneType": "null",
}
_TYPE = "(" + "|".join(_JSON_TYPES) + ")"
# Python's words for the usual mismatches, and what they mean in JSON's.
_MISMATCHES = [
    (re.compile(rf"^'{_TYPE}' object is not iterable$"), "{} where a list was expected"),
    (re.compile(rf"^'{_TYPE}' object is not subscriptable$"), "{} where an object was expected"),
    (re.compile(rf"^'{_TYPE}' object has no attribute"), "{} where an object was expected"),
    (
        re.compile(r"^(list|str)(?:ing)? indices must be integers"),
        "{} where an object was expected",
    ),
]
_PY_TYPE = re.compile(rf"'{_TYPE}' object")


def answered(server: str, method: str, path: str) -> None:
    """The command was given the JSON answer of `server` to `method path`."""
    _answered.set((server, method, path))


@contextmanager
def reading_answers() -> Iterator[None]:
    """Run a command: an error it raises reading a JSON answer becomes a `CLIError` naming the
    server and endpoint, and what was wrong with the answer."""
    token = _answered.set(None)
    try:
        yield
    except _SHAPE_ERRORS as e:
        where = _answered.get()
        if where is None:
            raise  # no answer was read: a bug, with its traceback
        server, method, path = where
        raise CLIError(
            f"{server} answered {method} {path} with JSON of another shape than aisched's "
            f"({_what(e)}): it does not look like an aisched service of this version (--server "
            "or AISCHED_SERVER choose another)",
            EXIT_FAILURE,
        ) from None
    finally:
        _answered.reset(token)


def _what(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"no field {e.args[0]!r}" if e.args else "a field missing"
    said = str(e)
    for pattern, words in _MISMATCHES:
        m = pattern.match(said)
        if m is not None:
            return words.format(_JSON_TYPES[m.group(1)])
    return _PY_TYPE.sub(lambda m: _JSON_TYPES[m.group(1)], said) or type(e).__name__

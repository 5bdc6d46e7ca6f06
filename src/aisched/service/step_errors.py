"""What the loop's failed steps leave behind: a count, the current run of failures, the last
error, and the back-off before the next try.

The loop thread alone writes it (`failed` / `succeeded`); readiness, metrics and `nodes` read
it from other threads, so every field is a plain value replaced whole (no torn reads of a
compound). A failure of the store (a full disk, an I/O error, a locked database) is told
apart from a bug, because readiness and the refusal of submissions depend on which it is.
"""

from __future__ import annotations

import errno
import sqlite3

import sqlalchemy.exc
from sqlalchemy.exc import SQLAlchemyError

from aisched.store.errors import StoreError, StoreUnanswered

# Error numbers that mean "the disk cannot take more", whatever layer raised them.
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_IO = (errno.EIO, errno.EROFS)
# What the database (or its driver, binding the value) says about a value rather than about
# the connection: out of range, a NUL byte in text, too long, a constraint broken (SQLAlchemy
# wraps psycopg's and sqlite3's DataError and IntegrityError in its own). Such a statement fails
# the same way every time; an OperationalError (a lost connection, a lock, a timeout) may not.
# sqlite3 refuses an integer past 64 bits with a bare OverflowError.
_DATA = (
    sqlalchemy.exc.DataError,
    sqlalchemy.exc.IntegrityError,
    sqlite3.DataError,
    sqlite3.IntegrityError,
    OverflowError,
)


def classify(exc: BaseException) -> str:
    """`disk-full`, `io-error`, `data` (the database refuses a value: not one it can hold),
    `store` (any other failure of the database) or `bug`."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _DATA):
            return "data"
        if isinstance(seen, OSError) and seen.errno in _FULL:
            return "disk-full"
        if isinstance(seen, OSError) and seen.errno in _IO:
            return "io-error"
        if isinstance(seen, StoreError):  # the store's own (a server that did not answer)
            return "store"
        if isinstance(seen, sqlite3.Error | SQLAlchemyError):
            text = str(seen).lower()
            if "disk is full" in text or "no space" in text:
                return "disk-full"
            if "disk i/o error" in text or "readonly" in text or "read-only" in text:
                return "io-error"
            return "store"
        seen = seen.__cause__ or seen.__context__
    return "bug"


# A failure of the way to the database rather than of what it holds or was asked: a connection
# refused, lost or terminated (psycopg's OperationalError, AdminShutdown among them), a
# timeout, no connection free in the pool, a server that took a request and never answered.
_TRANSIENT = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    StoreUnanswered,
)


def transient(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is the database's connection failing, which
    a later try may not meet; not an unreadable row, a refused value or a refused write of a
    deposed leader, which fail the same way every time."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _TRANSIENT):
            return True
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__
    return False


def one_line(exc: BaseException) -> str:
    """The first line of the error, without SQLAlchemy's statement and parameter dump."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else exc.__class__.__name__
    return first[:300]


class StepErrors:
    """The loop's failures, with an exponential back-off: the first failed step waits
    `base_s`, each further one twice as long, up to `max_s` for a bug and `store_max_s` for a
    failure of the store; a step that succeeds resets it.

    A store's failure ends by itself, unseen by the loop (space freed, the server back): a
    failed write costs little, and the service should take work again within seconds of it,
    not half a minute later. A bug fails the same way each time, and logs a traceback."""

    def __init__(self, base_s: float = 0.5, max_s: float = 30.0, store_max_s: float = 4.0) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.store_max_s = store_max_s
        self.total = 0  # every failed step since start (aisched_loop_errors_total)
        self.consecutive = 0  # failed steps since the last one that succeeded
        self.kind = ""  # classify() of the last failure while failing, else ""
        self.last_error = ""
        self.since: float | None = None  # wall time of the first failure of this run

    def failed(self, exc: BaseException, now: float) -> float:
        """Record a failed step; returns how long the loop waits before the next one."""
        self.total += 1
        self.consecutive += 1
        if self.since is None:
            self.since = now
        self.kind = classify(exc)
        self.last_error = one_line(exc)
        cap = self.max_s if self.kind == "bug" else min(self.max_s, self.store_max_s)
        return float(min(cap, self.base_s * 2.0 ** (self.consecutive - 1)))

    def succeeded(self) -> None:
        if self.consecutive:
            self.consecutive = 0
            self.kind = ""
            self.since = None

    @property
    def failing(self) -> bool:
        return self.consecutive > 0

    @property
    def store_failing(self) -> bool:
        return self.consecutive > 0 and self.kind != "bug"

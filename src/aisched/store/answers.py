"""A bound on how long a PostgreSQL connection waits for the server's answer.

The server's own `statement_timeout` ends a slow statement, and TCP keepalives find a peer
whose machine is gone; neither helps when the server process is alive but does not answer (a
stopped postmaster and backends, a server stuck in I/O): the kernel still takes the request and
acknowledges it, and the client waits for an answer for ever. Here every round trip (a
statement, a commit, a rollback, the pool's reset) arms a deadline for its connection and its
end disarms it; a thread shuts the socket of a connection whose deadline passed, so the waiting
call fails at once as on a lost connection (`StoreUnanswered`, which the loop retries like any
failure of the store) and SQLAlchemy drops the connection from its pool.

Never: it never closes a file descriptor (libpq owns it; shutting a duplicate's socket down
wakes the waiting thread without freeing the descriptor under it), and a round trip that ended
in time is never cut (arm, disarm and cut hold one lock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

from aisched.store.errors import StoreUnanswered

log = logging.getLogger("aisched.store")


class AnswerDeadlines:
    """The deadlines of one engine's connections (see the module docstring)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._lock = threading.Lock()
        # id(DBAPI connection) -> (deadline, the connection, its socket's fd when armed)
        self._due: dict[int, tuple[float, weakref.ref[Any], int]] = {}
        self._cut: set[int] = set()  # connections cut, until their error is raised
        self._unbounded: set[int] = set()  # connections doing work that may take long
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def install(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._on_execute)
        event.listen(engine, "after_cursor_execute", self._on_executed)
        event.listen(engine, "commit", self._on_tx_end)
        event.listen(engine, "rollback", self._on_tx_end)
        event.listen(engine, "reset", self._on_reset)  # the pool's rollback of a returned one
        event.listen(engine, "checkin", self._on_checkin)
        event.listen(engine, "handle_error", self._on_error)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake.set()

    # --- arming (in the thread that waits for the answer) ------------------------------------

    def arm(self, dbapi_conn: Any) -> None:
        try:
            fd = int(dbapi_conn.fileno())
        except Exception:  # closed already: nothing to wait for
            return
        with self._lock:
            if id(dbapi_conn) in self._unbounded:
                return
            # Deadlines only grow (now + one limit): the thread, asleep until the first one,
            # needs waking only when there was none.
            idle = not self._due
            self._due[id(dbapi_conn)] = (
                time.monotonic() + self.limit_s,
                weakref.ref(dbapi_conn),
                fd,
            )
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._watch, name="aisched-store-deadlines", daemon=True
                )
                self._thread.start()
        if idle:
            self._wake.set()

    @contextlib.contextmanager
    def unbounded(self, dbapi_conn: Any) -> Iterator[None]:
        """No deadline for `dbapi_conn` inside: work that may rightly take long (a migration
        of a big database, or the wait for another instance's)."""
        key = id(dbapi_conn)
        with self._lock:
            self._unbounded.add(key)
            self._due.pop(key, None)
        try:
            yield
        finally:
            with self._lock:
                self._unbounded.discard(key)

    def disarm(self, dbapi_conn: Any) -> None:
        with self._lock:
            self._due.pop(id(dbapi_conn), None)

    def _on_execute(self, _conn: Any, cursor: Any, *_args: Any) -> None:
        self.arm(cursor.connection)

    def _on_executed(self, _conn: Any, cursor: Any, *_args: Any) -> None:
        self.disarm(cursor.connection)

    def _on_tx_end(self, conn: Any) -> None:
        if not conn.invalidated:  # an invalidated one sends nothing more
            self.arm(conn.connection.dbapi_connection)  # disarmed at the next round or checkin

    def _on_reset(self, dbapi_conn: Any, *_args: Any) -> None:
        self.arm(dbapi_conn)

    def _on_checkin(self, dbapi_conn: Any, _record: Any) -> None:
        if dbapi_conn is not None:
            self.disarm(dbapi_conn)

    def _on_error(self, context: ExceptionContext) -> BaseException | None:
        conn = context.connection
        if conn is None or conn.invalidated:
            return None
        dbapi_conn = conn.connection.dbapi_connection
        if dbapi_conn is None:
            return None
        with self._lock:
            self._due.pop(id(dbapi_conn), None)
            cut = id(dbapi_conn) in self._cut
            self._cut.discard(id(dbapi_conn))
        if not cut:
            return None
        context.is_disconnect = True  # the pool drops it, as a connection the server closed
        return StoreUnanswered(
            f"the database server did not answer within {self.limit_s:g} s "
            "(limits.store_statement_timeout): its connection was closed"
        )

    # --- the watching thread -----------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                for key, (deadline, ref, fd) in list(self._due.items()):
                    if deadline <= now:
                        del self._due[key]
                        if _still_open(ref(), fd):
                            self._cut.add(key)
                            _shut(fd)
                first = min((due[0] for due in self._due.values()), default=now + 60.0)
            self._wake.wait(max(0.05, first - now))
            self._wake.clear()


def _still_open(dbapi_conn: Any, fd: int) -> bool:
    """Whether the connection is open on the socket it was armed with: a descriptor closed
    meanwhile may have been given to another file, which must not be touched."""
    try:
        return dbapi_conn is not None and not dbapi_conn.closed and dbapi_conn.fileno() == fd
    except Exception:  # closed as we looked
        return False


def _shut(fd: int) -> None:
    """Shut down the socket behind `fd` through a duplicate of it: the thread waiting on it
    wakes to an end of file; `fd` stays open (its owner closes it)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return
    # Suppressed: a socket no longer connected has nothing to shut down.
    with socket.socket(fileno=dup) as sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    log.warning("the database server did not answer in time: its connection was closed")

"""The service's durable state behind one small interface: `Store.tx()` for a transaction that
writes, `Store.read()` for a consistent read, both yielding a `Tx` with typed helpers.

SQLite by default (one file, WAL, so readers never block the single writer and a commit costs
one fsync-free append with `synchronous=NORMAL`), or PostgreSQL through psycopg 3
(`postgresql://` is read as `postgresql+psycopg://`), which several instances share: one leads
and writes, each of its write transactions fenced by its term (`store.lease`; `Store.fence`),
the others read. The schema is created on first open and its version checked on every open; an
older one is migrated (`store.migrate`). Every failure to open is a `StoreError` of one line
that says what to do (a damaged, foreign or newer database; a full or read-only disk).

A write that fails (ENOSPC, EIO, a lock held too long) rolls its whole transaction back: the
database holds every committed transaction whole and nothing of the failed one. Nothing waits
on PostgreSQL for ever: a connection, a lock, a statement and the server's answer are each
bounded (`connect_timeout`, `lock_timeout`, `statement_timeout`, `store.answers`), so a stopped
or unreachable server fails the step (retried) or the request (503) rather than hanging them.

Who writes: only the service's loop thread writes jobs, tasks and events; API threads read
them, and write only the `tokens` and `audit` tables (no scheduling state lives there). Rows
come back as plain dicts (column name → value); the store knows tables, not scheduling.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Engine,
    Text,
    and_,
    bindparam,
    case,
    cast,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from aisched.store.answers import AnswerDeadlines
from aisched.store.errors import Deposed, StoreError
from aisched.store.lease import Fence, check_fence
from aisched.store.migrate import SchemaError, check_and_migrate
from aisched.store.schema import audit, events, jobs, meta, tasks, tokens

__all__ = ["Deposed", "Row", "Store", "StoreError", "Tx"]

Row = dict[str, Any]
TERMINAL = ("succeeded", "failed", "cancelled")
# The event that says a live job's oldest attempts were forgotten (`limits.keep_attempts`).
ATTEMPTS_FORGOTTEN = "attempts-forgotten"


# Serialises the first open (schema creation, migration) of instances sharing one PostgreSQL
# database: a transaction-level advisory lock, released at its commit.
_MIGRATION_LOCK = 0x61697363  # "aisc"
# The client waits up to this much longer than the server's statement_timeout (never more than
# that timeout again) before it cuts a connection: a server that is merely slow cancels its
# statement first, keeping the connection.
_ANSWER_GRACE_S = 5.0


def normalize_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 (SQLAlchemy's default driver for
    them is psycopg2, which aisched does not install)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def shown(url: str) -> str:
    """The URL as messages show it: an SQLite file's path, or the URL with its password
    masked and a `password` query parameter left out, as SQLAlchemy parses it (a password
    may hold any character, `/` and `@` included); only the scheme when it cannot be parsed."""
    if url.startswith("sqlite:///"):
        return url.removeprefix("sqlite:///")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url.partition("://")[0] + "://(unparsable URL, not shown)"
    base = parsed.set(query={}).render_as_string(hide_password=True)
    # The query unquoted: `host=/run/...` reads better than `host=%2Frun%2F...`.
    kept = [
        f"{key}={value}"
        for key, values in parsed.query.items()
        if key != "password"
        for value in ((values,) if isinstance(values, str) else values)
    ]
    return base + ("?" + "&".join(kept) if kept else "")


class Store:
    def __init__(
        self,
        url: str,
        *,
        busy_timeout_s: float = 30.0,
        idle_tx_timeout_s: float | None = None,
        statement_timeout_s: float = 30.0,
    ) -> None:
        url = normalize_url(url)
        self.url = shown(url) if not url.startswith("sqlite") else url
        self.migration_note: str | None = None
        # Set while this instance leads a shared database: every `tx` checks it first.
        self.fence: Fence | None = None
        self.deposed: str | None = None  # why this instance may write no more, once deposed
        kwargs: dict[str, Any] = {}
        self.deadlines: AnswerDeadlines | None = None  # PostgreSQL's bound on an answer
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": busy_timeout_s}
        elif url.startswith("postgresql"):
            # A write waits at most this long for a row another transaction holds, and a
            # connection at most this long for the server; then the step fails (and retries).
            ms = max(1, int(busy_timeout_s * 1000))
            options = f"-c lock_timeout={ms}"
            if idle_tx_timeout_s is not None:
                # A leader stopped inside a transaction (SIGSTOP, a frozen VM) holds the lease
                # row's lock, and a standby could never take over: the server ends such a
                # transaction once it has sat idle this long (the lease's TTL, past which the
                # lease is lost anyway), and its late commit fails.
                options += (
                    f" -c idle_in_transaction_session_timeout={int(idle_tx_timeout_s * 1000)}"
                )
            # A statement the server works on for longer is cancelled by the server; one it
            # does not answer at all (stopped, stuck) is cut by the client a little later
            # (`answers`), and TCP keepalives and tcp_user_timeout find a peer whose machine or
            # network is gone. The URL's own libpq parameters win over these.
            options += f" -c statement_timeout={max(1, int(statement_timeout_s * 1000))}"
            answer_s = statement_timeout_s + min(_ANSWER_GRACE_S, statement_timeout_s)
            connect_args = {
                "options": options,
                "connect_timeout": max(2, int(busy_timeout_s)),
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "tcp_user_timeout": int(answer_s * 1000),
            }
            given = make_url(url).query
            kwargs["connect_args"] = {k: v for k, v in connect_args.items() if k not in given}
            self.deadlines = AnswerDeadlines(answer_s)
            # No pre-ping (a round trip per checkout): a connection the server dropped fails
            # its statement once, SQLAlchemy drops the pool's connections, and the loop's step
            # is retried on new ones.
            kwargs["pool_size"] = 10
        where = shown(url)
        try:
            self.engine: Engine = create_engine(url, **kwargs)
            if url.startswith("sqlite"):
                event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout_s))
            if self.deadlines is not None:
                self.deadlines.install(self.engine)
            with self.engine.connect() as conn, self._unbounded(conn), self._open_tx(conn):
                if self.engine.dialect.name == "postgresql":
                    # A migration may take long on a big database, and an instance starting
                    # beside one waits for its end: neither is bounded as a step's work is.
                    conn.execute(text("SET LOCAL statement_timeout = 0"))
                    conn.execute(text("SET LOCAL lock_timeout = 0"))
                    conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
                self.migration_note = check_and_migrate(conn, where)
                if self.engine.dialect.name == "sqlite":
                    _check_intact(conn)
        except SchemaError as e:
            self.close()
            raise StoreError(str(e)) from None
        except StoreError as e:  # a server that took the connection and never answered
            self.close()
            raise StoreError(open_failure(where, e)) from None
        except (SQLAlchemyError, sqlite3.Error) as e:
            if self.deadlines is not None:
                self.deadlines.close()
            raise StoreError(open_failure(where, e)) from None
        except ModuleNotFoundError as e:  # a driver that is not installed
            raise StoreError(f"cannot open the state database {where}: {e}") from None

    @property
    def shared(self) -> bool:
        """Whether several instances may open this database (PostgreSQL), so that who leads
        is decided by the lease; SQLite is one process's (the data directory's lock)."""
        return self.engine.dialect.name == "postgresql"

    @classmethod
    def sqlite(cls, path: Path) -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{path}")

    def instance_id(self) -> str:
        """A random id made on the database's first open and kept: it names this service's
        files outside its data directory (users' checkpoint directories), so that two services
        never hand one job's checkpoints to another's job of the same id."""
        with self.engine.begin() as conn:
            got = conn.execute(select(meta.c.value).where(meta.c.key == "instance")).scalar()
            if got is None:
                got = secrets.token_hex(6)
                conn.execute(insert(meta).values(key="instance", value=got))
            return str(got)

    @contextmanager
    def tx(self) -> Iterator[Tx]:
        """A write transaction: committed when the block ends, rolled back on an exception.
        While this instance leads (`fence`), the lease row is checked and locked first, and a
        term that moved on refuses the whole transaction (`Deposed`)."""
        if self.deposed is not None:
            raise Deposed(self.deposed)
        with self.engine.begin() as conn:
            if self.fence is not None:
                check_fence(conn, self.fence)
            yield Tx(conn)

    @contextmanager
    def trial(self) -> Iterator[Tx]:
        """A write transaction that is always rolled back: whether the store would take these
        writes, without keeping any of them."""
        with self.engine.connect() as conn:
            trans = conn.begin()
            try:
                yield Tx(conn)
            finally:
                trans.rollback()

    @contextmanager
    def lease_tx(self) -> Iterator[Connection]:
        """A transaction for the lease itself (acquire, renew, resign): never fenced."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self.engine.connect() as conn:
            yield Tx(conn)

    def _open_tx(self, conn: Connection) -> contextlib.AbstractContextManager[object]:
        """The transaction of the open (check, migrate). On SQLite the driver begins none
        before DDL, so each ALTER of a migration would commit on its own and a migration killed
        half-way leave a database neither version reads: there it is one real transaction."""
        if self.engine.dialect.name != "sqlite":
            return conn.begin()
        return _sqlite_transaction(conn)

    def _unbounded(self, conn: Connection) -> contextlib.AbstractContextManager[None]:
        """`conn` without the bound on the server's answer (`answers`), where there is one."""
        if self.deadlines is None:
            return contextlib.nullcontext()
        return self.deadlines.unbounded(conn.connection.dbapi_connection)

    def close(self) -> None:
        self.engine.dispose()
        if self.deadlines is not None:
            self.deadlines.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _sqlite_transaction(conn: Connection) -> Iterator[None]:
    """One SQLite transaction around DDL too: BEGIN IMMEDIATE (the write lock at once), then
    COMMIT, or ROLLBACK on any error, with the driver's own transaction handling off meanwhile."""
    raw: Any = conn.connection.driver_connection  # the sqlite3.Connection
    saved = raw.isolation_level
    raw.isolation_level = None  # the driver adds no BEGIN or COMMIT of its own
    try:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            raw.rollback()  # a no-op where SQLite ended the transaction itself
            raise
        raw.commit()
    finally:
        raw.isolation_level = saved


def _sqlite_pragmas(busy_timeout_s: float) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.close()

    return on_connect


def _check_intact(conn: Connection) -> None:
    """Refuse an SQLite file whose pages are damaged (a torn write, a bad disk) at start, in
    one line, rather than in the middle of a cycle at the first read of a broken page.
    `quick_check` reads every page once: about a second per few hundred MB."""
    rows = [str(r) for r in conn.execute(text("PRAGMA quick_check")).scalars()]
    if rows != ["ok"]:
        raise sqlite3.DatabaseError(f"database disk image is malformed: {rows[0]}")


def open_failure(where: str, exc: BaseException) -> str:
    """One line for a database that cannot be opened: what is wrong and what to do."""
    orig = getattr(exc, "orig", None) or exc
    msg = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    low = msg.lower()
    if "not a database" in low or "malformed" in low:
        return (
            f"the state database {where} is damaged ({msg}): move it aside to start with an "
            "empty one (its jobs are forgotten), or restore it from a backup; "
            "`sqlite3 FILE .recover` can save what is still readable"
        )
    if "disk is full" in low:
        return f"the state database {where} cannot be written: the disk is full; free some space"
    if "readonly" in low or "read-only" in low or "unable to open" in low:
        return (
            f"the state database {where} cannot be opened for writing ({msg}): give a writable "
            "--data-dir, or fix the file's permissions"
        )
    if "locked" in low:
        return (
            f"the state database {where} is locked by another process ({msg}): stop it, or "
            "give another --data-dir"
        )
    if "connection" in low and ("failed" in low or "refused" in low):
        return (
            f"cannot reach the state database {where} ({msg}): start the PostgreSQL server, "
            "or fix --database"
        )
    return f"cannot open the state database {where}: {msg}"


def job_row(values: Mapping[str, Any]) -> Row:
    """A whole jobs row from the values inserted: the other columns at their defaults."""
    row: Row = {}
    for col in jobs.columns:
        default = col.default
        row[col.name] = getattr(default, "arg", None) if default is not None else None
    row.update(values)
    return row


def _grouped(
    items: Iterable[tuple[Any, Mapping[str, Any]]], where: Callable[[Any], dict[str, Any]]
) -> Iterator[list[dict[str, Any]]]:
    """Parameter lists for executemany: rows that set the same columns go together (an
    executemany UPDATE sets the columns of its first row)."""
    groups: dict[frozenset[str], list[dict[str, Any]]] = {}
    for key, values in items:
        if values:
            groups.setdefault(frozenset(values), []).append({**values, **where(key)})
    yield from groups.values()


def _not_newest() -> ColumnElement[bool]:
    """A job that is not the newest: the newest job's seq keeps the next id from going back to
    a forgotten one, so it is never forgotten."""
    return jobs.c.seq < select(func.max(jobs.c.seq)).scalar_subquery()


class Tx:
    """Typed helpers over one connection (inside a transaction for `Store.tx`)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def get_meta(self, key: str) -> Any:
        """The JSON value kept under `key` in the meta table, or None."""
        got = self.conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar()
        return None if got is None else json.loads(got)

    def set_meta(self, key: str, value: Any) -> None:
        text_value = json.dumps(value)
        done = self.conn.execute(update(meta).where(meta.c.key == key).values(value=text_value))
        if done.rowcount == 0:
            self.conn.execute(insert(meta).values(key=key, value=text_value))

    # --- jobs -------------------------------------------------------------------------------

    def max_seq(self) -> int:
        return int(self.conn.execute(select(func.max(jobs.c.seq))).scalar() or 0)

    def insert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self.conn.execute(insert(jobs), list(rows))

    def update_job(self, job_id: str, values: Mapping[str, Any]) -> None:
        if values:
            self.conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))

    def update_jobs(self, changes: Mapping[str, Mapping[str, Any]]) -> None:
        """Many jobs' changes (job id → column → value) in one executemany per set of columns:
        a step of the loop may touch thousands of rows (e.g. every waiting job's reason)."""
        stmt = update(jobs).where(jobs.c.id == bindparam("_id"))
        for params in _grouped(changes.items(), lambda key: {"_id": key}):
            self.conn.execute(stmt, params)

    def get_job(self, job_id: str) -> Row | None:
        r = self.conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
        return dict(r) if r is not None else None

    def list_jobs(
        self,
        *,
        states: Iterable[str] | None = None,
        queue: str | None = None,
        user: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
        before_seq: int | None = None,
        columns: Sequence[str] | None = None,
    ) -> list[Row]:
        """Jobs, newest (or oldest) first; `before_seq`: only those submitted before the job
        of that `seq` (a newest-first list read a page at a time); `columns`: only these (a
        list that needs no job's document leaves out `spec`, which a user may make megabytes
        long, and which is read and parsed whole when selected)."""
        q = select(*(jobs.c[c] for c in columns)) if columns is not None else select(jobs)
        if before_seq is not None:
            q = q.where(jobs.c.seq < before_seq)
        if states is not None:
            q = q.where(jobs.c.state.in_(list(states)))
        if queue is not None:
            q = q.where(jobs.c.queue == queue)
        if user is not None:
            q = q.where(jobs.c.user == user)
        q = q.order_by(jobs.c.seq.desc() if newest_first else jobs.c.seq.asc())
        if limit is not None:
            q = q.limit(limit)
        return [dict(r) for r in self.conn.execute(q).mappings()]

    def job_specs(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The documents (`spec`) of these jobs, by id; forgotten ones left out."""
        if not job_ids:
            return {}
        q = select(jobs.c.id, jobs.c.spec).where(jobs.c.id.in_(list(job_ids)))
        return {str(i): spec for i, spec in self.conn.execute(q)}

    def live_jobs(self) -> list[Row]:
        """Jobs not yet in a terminal state, oldest first."""
        q = select(jobs).where(jobs.c.state.not_in(TERMINAL)).order_by(jobs.c.seq)
        return [dict(r) for r in self.conn.execute(q).mappings()]

    def succeeded_jobs(self, limit: int) -> list[Row]:
        """The `limit` most recently finished successful jobs, oldest finish first."""
        q = (
            select(jobs)
            .where(jobs.c.state == "succeeded", jobs.c.attempt_started_at.is_not(None))
            .order_by(jobs.c.finished_at.desc())
            .limit(limit)
        )
        rows = [dict(r) for r in self.conn.execute(q).mappings()]
        return rows[::-1]

    def failed_replicas(
        self, service_id: str, user: str, after_seq: int, limit: int
    ) -> list[tuple[str, float, str]]:
        """(id, end, message) of the `limit` replicas of a service that failed last, oldest
        end first. A replica is a job of its service's user, kind `infer`, submitted after
        it, whose spec names the service."""
        q = (
            select(jobs.c.id, jobs.c.finished_at, jobs.c.message)
            .where(
                jobs.c.user == user,
                jobs.c.seq > after_seq,
                jobs.c.kind == "infer",
                jobs.c.state == "failed",
                jobs.c.spec["replica_of"].as_string() == service_id,
            )
            .order_by(jobs.c.finished_at.desc(), jobs.c.seq.desc())
            .limit(limit)
        )
        rows = [(str(i), float(at or 0.0), str(m or "")) for i, at, m in self.conn.execute(q)]
        return rows[::-1]

    def jobs_by_idempotency_key(self, user: str, keys: Sequence[str]) -> list[Row]:
        """The jobs stored with these keys for `user`, in the order of `keys` (missing ones
        left out)."""
        q = select(jobs).where(jobs.c.user == user, jobs.c.idempotency_key.in_(list(keys)))
        found = {r["idempotency_key"]: dict(r) for r in self.conn.execute(q).mappings()}
        return [found[k] for k in keys if k in found]

    def ended_before(self, cutoff: float, limit: int) -> list[str]:
        """Ids of up to `limit` jobs that ended before `cutoff`, oldest end first; never the
        newest job, whose seq keeps the next id from going back to a forgotten one."""
        q = (
            select(jobs.c.id)
            .where(jobs.c.finished_at < cutoff, jobs.c.state.in_(TERMINAL), _not_newest())
            .order_by(jobs.c.finished_at)
            .limit(limit)
        )
        return [str(r) for r in self.conn.execute(q).scalars()]

    def ended_doc_sizes(self) -> list[tuple[str, str, int]]:
        """(id, user, size of its document) of every ended job, oldest end first."""
        size = func.length(cast(jobs.c.spec, Text))
        q = (
            select(jobs.c.id, jobs.c.user, size)
            .where(jobs.c.state.in_(TERMINAL))
            .order_by(jobs.c.finished_at, jobs.c.seq)
        )
        return [(str(i), str(u), int(n or 0)) for i, u, n in self.conn.execute(q)]

    def forget_jobs(self, job_ids: Sequence[str]) -> None:
        """Delete ended jobs with their tasks and events (a job not ended is left alone, and
        so is the newest job, whose seq keeps the next id from going back to a forgotten one)."""
        if not job_ids:
            return
        ended = select(jobs.c.id).where(
            jobs.c.id.in_(list(job_ids)), jobs.c.state.in_(TERMINAL), _not_newest()
        )
        gone = [str(r) for r in self.conn.execute(ended).scalars()]
        if gone:
            self.conn.execute(delete(events).where(events.c.job_id.in_(gone)))
            self.conn.execute(delete(tasks).where(tasks.c.job_id.in_(gone)))
            self.conn.execute(delete(jobs).where(jobs.c.id.in_(gone)))

    def forget_attempts(self, job_id: str, first_kept: int, first_events: int) -> None:
        """Delete a live job's task rows of the attempts before `first_kept`, and its events
        before the placement of that attempt, except its first `first_events` (how it began)
        and the newest `attempts-forgotten` note (older ones go: one says it all)."""
        self.conn.execute(
            delete(tasks).where(tasks.c.job_id == job_id, tasks.c.attempt < first_kept)
        )
        mine = events.c.job_id == job_id
        cut = self.conn.execute(
            select(func.min(events.c.seq)).where(
                mine, events.c.kind == "placed", events.c.message.like(f"attempt {first_kept}:%")
            )
        ).scalar_one_or_none()
        note = events.c.kind == ATTEMPTS_FORGOTTEN
        newest_note = select(func.max(events.c.seq)).where(mine, note).scalar_subquery()
        gone = and_(note, events.c.seq < newest_note)
        if cut is not None:
            gone = or_(gone, and_(events.c.seq < cut, ~note))
        first = select(events.c.seq).where(mine).order_by(events.c.seq).limit(first_events)
        self.conn.execute(delete(events).where(mine, gone, events.c.seq.not_in(first)))

    def count_jobs(self, states: Iterable[str]) -> int:
        q = select(func.count()).select_from(jobs).where(jobs.c.state.in_(list(states)))
        return int(self.conn.execute(q).scalar_one())

    def count_by_state(self) -> dict[str, int]:
        q = select(jobs.c.state, func.count()).group_by(jobs.c.state)
        return {str(s): int(n) for s, n in self.conn.execute(q)}

    # --- tasks ------------------------------------------------------------------------------

    def insert_tasks(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self.conn.execute(insert(tasks), list(rows))

    def update_task(self, job_id: str, attempt: int, name: str, values: Mapping[str, Any]) -> None:
        self.conn.execute(
            update(tasks)
            .where(tasks.c.job_id == job_id, tasks.c.attempt == attempt, tasks.c.name == name)
            .values(**values)
        )

    def update_tasks(self, changes: Mapping[tuple[str, int, str], Mapping[str, Any]]) -> None:
        """Many tasks' changes ((job id, attempt, name) → column → value), as `update_jobs`."""
        stmt = update(tasks).where(
            tasks.c.job_id == bindparam("_job"),
            tasks.c.attempt == bindparam("_attempt"),
            tasks.c.name == bindparam("_name"),
        )
        for params in _grouped(
            changes.items(), lambda key: {"_job": key[0], "_attempt": key[1], "_name": key[2]}
        ):
            self.conn.execute(stmt, params)

    def tasks_of(self, job_id: str, attempt: int | None = None) -> list[Row]:
        q = select(tasks).where(tasks.c.job_id == job_id)
        if attempt is not None:
            q = q.where(tasks.c.attempt == attempt)
        q = q.order_by(tasks.c.attempt, tasks.c.rank)
        return [dict(r) for r in self.conn.execute(q).mappings()]

    def kept_attempts(self, job_id: str) -> tuple[int, int] | None:
        """The first and the last attempt of `job_id` whose task rows are kept (None: none
        is); the attempts before a live job's latest `limits.keep_attempts` are forgotten."""
        q = select(func.min(tasks.c.attempt), func.max(tasks.c.attempt)).where(
            tasks.c.job_id == job_id
        )
        first, last = self.conn.execute(q).one()
        return None if first is None else (int(first), int(last))

    def attempt_spans(self, job_ids: Sequence[str]) -> dict[str, list[tuple[float, float | None]]]:
        """Per job of `job_ids`, when each of its attempts ran, first to last: from the start
        of its first task to the end of its last, None while one still runs. An attempt none
        of whose tasks started is left out."""
        unfinished = func.sum(case((tasks.c.finished_at.is_(None), 1), else_=0))
        q = (
            select(
                tasks.c.job_id,
                func.min(tasks.c.started_at),
                func.max(tasks.c.finished_at),
                unfinished,
            )
            .where(tasks.c.job_id.in_(list(job_ids)), tasks.c.started_at.is_not(None))
            .group_by(tasks.c.job_id, tasks.c.attempt)
            .order_by(tasks.c.job_id, tasks.c.attempt)
        )
        spans: dict[str, list[tuple[float, float | None]]] = {}
        for job_id, start, end, running in self.conn.execute(q):
            spans.setdefault(str(job_id), []).append((start, None if running else end))
        return spans

    def running_tasks(self) -> list[Row]:
        """Tasks that may still hold resources: launching or running."""
        q = (
            select(tasks)
            .where(tasks.c.state.in_(("launching", "running")))
            .order_by(tasks.c.job_id, tasks.c.rank)
        )
        return [dict(r) for r in self.conn.execute(q).mappings()]

    # --- events -----------------------------------------------------------------------------

    def add_events(self, rows: Sequence[tuple[float, str, str, str]]) -> None:
        """(time, job_id, kind, message) rows, in order."""
        if rows:
            self.conn.execute(
                insert(events),
                [{"time": t, "job_id": j, "kind": k, "message": m} for t, j, k, m in rows],
            )

    def events_of(self, job_id: str, after_seq: int = 0) -> list[Row]:
        q = (
            select(events)
            .where(events.c.job_id == job_id, events.c.seq > after_seq)
            .order_by(events.c.seq)
        )
        return [dict(r) for r in self.conn.execute(q).mappings()]

    # --- tokens and audit (written by API threads) -------------------------------------------

    def add_token(self, values: Mapping[str, Any]) -> None:
        self.conn.execute(insert(tokens).values(**values))

    def token_by_digest(self, digest: str) -> Row | None:
        r = self.conn.execute(select(tokens).where(tokens.c.digest == digest)).mappings().first()
        return dict(r) if r is not None else None

    def token_by_id(self, token_id: str) -> Row | None:
        r = self.conn.execute(select(tokens).where(tokens.c.id == token_id)).mappings().first()
        return dict(r) if r is not None else None

    def set_cookie_digest(self, token_id: str, cookie_digest: str) -> None:
        """Records the digest of the token's dashboard cookie where it has none (a token made
        before schema 8: the secret, which makes it, is seen again only at a login)."""
        self.conn.execute(
            update(tokens)
            .where(tokens.c.id == token_id, tokens.c.cookie_digest.is_(None))
            .values(cookie_digest=cookie_digest)
        )

    def list_tokens(self, user: str | None = None) -> list[Row]:
        q = select(tokens).order_by(tokens.c.created_at)
        if user is not None:
            q = q.where(tokens.c.user == user)
        return [dict(r) for r in self.conn.execute(q).mappings()]

    def revoke_token(self, token_id: str, now: float) -> Row | None:
        """Marks the token revoked (once); returns it as it is now, or None when there is no
        such token."""
        r = self.conn.execute(select(tokens).where(tokens.c.id == token_id)).mappings().first()
        if r is None:
            return None
        row = dict(r)
        if row["revoked_at"] is None:
            self.conn.execute(update(tokens).where(tokens.c.id == token_id).values(revoked_at=now))
            row["revoked_at"] = now
        return row

    def add_audit(self, values: Mapping[str, Any]) -> None:
        self.conn.execute(insert(audit).values(**values))

    def audit_before(self, cutoff: float, limit: int) -> list[int]:
        """Seqs of the oldest audit rows, up to `limit`, written before `cutoff`. Rows are
        appended with the time they are written, so the oldest by seq (the primary key) are
        the oldest by time: this reads `limit` rows at most, never the whole table."""
        q = select(audit.c.seq, audit.c.time).order_by(audit.c.seq).limit(limit)
        return [int(seq) for seq, time in self.conn.execute(q) if time < cutoff]

    def forget_audit(self, seqs: Sequence[int]) -> None:
        if seqs:
            self.conn.execute(delete(audit).where(audit.c.seq.in_(list(seqs))))

    def audit_log(self, limit: int = 1000) -> list[Row]:
        q = select(audit).order_by(audit.c.seq.desc()).limit(limit)
        return [dict(r) for r in self.conn.execute(q).mappings()]

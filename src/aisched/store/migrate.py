"""Schema versions of the state database and the steps between them.

A database records its version in `meta` (key `schema`). On open (`check_and_migrate`):

- an empty database gets the current tables and version;
- a database of an older version is brought up to date by the steps of `MIGRATIONS`, all in
  one transaction (on SQLite too, where the driver would commit each ALTER on its own: the
  store opens it with BEGIN IMMEDIATE, `Store._open_tx`), so a failed or killed migration
  leaves the old database as it was;
- a newer version, or tables without the `meta` row (another program's database), is refused
  with one line saying what to do: nothing is changed.

Why not Alembic: the schema is one file of SQLAlchemy Core tables, every step so far is an
`ALTER TABLE ... ADD COLUMN` and an index, and the service must migrate itself at start with
no migration scripts shipped beside it. A linear list of steps checked by a test (an old
database migrated equals a new one) does that; Alembic earns its place once there are
branches or data migrations.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, inspect, select, text

from aisched.store.schema import SCHEMA_VERSION, audit, leader, meta, metadata, tokens


class SchemaError(RuntimeError):
    """The database cannot be used by this aisched: its message is one line, with the fix."""


def _add_column(conn: Connection, table: str, column: str, ddl: str) -> None:
    """`ALTER TABLE table ADD COLUMN column ddl`, unless the column is there already."""
    if column not in {c["name"] for c in inspect(conn).get_columns(table)}:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}"))


# Every step is idempotent (IF NOT EXISTS, a column added only where missing): a database that
# an older aisched left half-migrated (its steps were not one transaction on SQLite) is
# completed rather than refused for what it already has.


def _v1_to_v2(conn: Connection) -> None:
    _add_column(conn, "jobs", "idempotency_key", "VARCHAR(256)")
    conn.execute(
        text(
            "CREATE UNIQUE INDEX IF NOT EXISTS ix_jobs_idempotency "
            'ON jobs ("user", idempotency_key)'
        )
    )


def _v2_to_v3(conn: Connection) -> None:
    """Sharing: API tokens (hashed) and the audit log, two new tables."""
    tokens.create(conn, checkfirst=True)
    audit.create(conn, checkfirst=True)


def _v3_to_v4(conn: Connection) -> None:
    """High availability: the leader's lease, one row (nobody holds it yet)."""
    leader.create(conn, checkfirst=True)
    if conn.execute(select(leader.c.id).where(leader.c.id == 1)).first() is None:
        conn.execute(leader.insert().values(LEASE_ROW))


def _v4_to_v5(conn: Connection) -> None:
    """Retention: ended jobs are found by when they finished. Read-only tokens."""
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_jobs_finished ON jobs (finished_at)"))
    # A version-2 database made its tokens table in the v2 -> v3 step, from today's schema.
    _add_column(conn, "tokens", "read_only", "INTEGER NOT NULL DEFAULT 0")


def _v5_to_v6(conn: Connection) -> None:
    """Schema 5 gained tokens.read_only after its first release without a new version: the
    databases made by those first versions of 5 lack it (every token request failed)."""
    _add_column(conn, "tokens", "read_only", "INTEGER NOT NULL DEFAULT 0")


def _v6_to_v7(conn: Connection) -> None:
    """A job's quick exits under `restart: always`, kept across scheduler restarts."""
    _add_column(conn, "jobs", "quick_exits", "INTEGER NOT NULL DEFAULT 0")


def _v7_to_v8(conn: Connection) -> None:
    """Dashboard cookies checked against a digest of their own: their MAC was keyed with the
    token's digest, which the database holds, so a leaked database made working cookies. The
    older tokens' cookies stop working until their next login (`service.tokens`)."""
    _add_column(conn, "tokens", "cookie_digest", "VARCHAR(64)")
    # A token's uid (`service.tokens`); the tokens made before have none and are not bound.
    _add_column(conn, "tokens", "uid", "INTEGER")


# The leader row a new database starts with: term 0, held by nobody, long expired.
LEASE_ROW = {"id": 1, "holder": "", "address": "", "term": 0, "expires_at": 0.0}

# MIGRATIONS[v] takes a database from version v to v + 1.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
    6: _v6_to_v7,
    7: _v7_to_v8,
}


def newer_than_readable(conn: Connection) -> str | None:
    """Why this aisched must not lead the database any more, or None: a newer aisched has
    migrated it since this instance opened it (`check_and_migrate` ran only then). Read
    before each try for the lease, so that an older standby never takes over a database whose
    rows it cannot read."""
    got = conn.execute(select(meta.c.value).where(meta.c.key == "schema")).scalar()
    try:
        version = int(str(got))
    except ValueError:
        return None  # not ours to judge here: the next start refuses it, saying why
    if version <= SCHEMA_VERSION:
        return None
    return (
        f"the state database was migrated to schema version {version} by a newer aisched "
        f"(this one reads up to {SCHEMA_VERSION}), and this instance could not lead it"
    )


def check_and_migrate(conn: Connection, where: str) -> str | None:
    """Make the database at `where` current (inside the caller's transaction); returns a note
    when it was migrated. Raises SchemaError when it cannot be used."""
    tables = set(inspect(conn).get_table_names())
    if not tables:
        metadata.create_all(conn)
        conn.execute(meta.insert().values(key="schema", value=str(SCHEMA_VERSION)))
        conn.execute(leader.insert().values(LEASE_ROW))
        return None
    got = None
    if "meta" in tables:
        got = conn.execute(select(meta.c.value).where(meta.c.key == "schema")).scalar()
    if got is None or "jobs" not in tables:
        raise SchemaError(
            f"{where} is not an aisched state database (its tables: "
            f"{', '.join(sorted(tables))}); give aisched its own --data-dir or --database"
        )
    try:
        version = int(got)
    except ValueError:
        raise SchemaError(
            f"{where} has an unreadable schema version {got!r}; it is damaged: move it aside "
            "(aisched then starts empty) or restore it from a backup"
        ) from None
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{where} was written by a newer aisched (schema version {version}; this one "
            f"reads up to {SCHEMA_VERSION}): run that newer aisched, or give another "
            "--data-dir"
        )
    if version == SCHEMA_VERSION:
        return None
    for v in range(version, SCHEMA_VERSION):
        MIGRATIONS[v](conn)
    conn.execute(meta.update().where(meta.c.key == "schema").values(value=str(SCHEMA_VERSION)))
    return f"migrated the state database from schema version {version} to {SCHEMA_VERSION}"

"""Opening the state database: created, migrated from an older schema, or refused in one line
(damaged, foreign, newer) without being changed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from test_schema_versions import tables_of

from aisched.service import tokens
from aisched.store.db import Store, StoreError, shown
from aisched.store.schema import SCHEMA_VERSION

# The schema-1 tables as aisched 0.1 made them (the jobs table without idempotency_key).
V1_JOBS = """CREATE TABLE jobs (seq INTEGER NOT NULL, id VARCHAR(32) NOT NULL,
 name VARCHAR(128) NOT NULL, user VARCHAR(128) NOT NULL, queue VARCHAR(128) NOT NULL,
 priority INTEGER NOT NULL, kind VARCHAR(16) NOT NULL, format VARCHAR(16) NOT NULL,
 spec JSON NOT NULL, state VARCHAR(16) NOT NULL, submitted_at FLOAT NOT NULL, started_at FLOAT,
 attempt_started_at FLOAT, finished_at FLOAT, attempt INTEGER NOT NULL,
 failures INTEGER NOT NULL, preemptions INTEGER NOT NULL, not_before FLOAT,
 stopping VARCHAR(16), waiting_for JSON, reason_code VARCHAR(32), reason TEXT, eta FLOAT,
 predicted_s FLOAT, predicted_upper_s FLOAT, exit_code INTEGER, message TEXT,
 attained_gpu_s FLOAT NOT NULL, checkpoint_dir TEXT NOT NULL, warnings JSON,
 PRIMARY KEY (seq), UNIQUE (id))"""


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def shape(path: Path) -> dict[str, object]:
    """Columns and indexes of the jobs table, as the database reports them."""
    insp = inspect(create_engine(url(path)))
    return {
        "columns": sorted(c["name"] for c in insp.get_columns("jobs")),
        "indexes": sorted((i["name"], tuple(i["column_names"])) for i in insp.get_indexes("jobs")),
    }


def test_an_older_database_is_migrated_to_what_a_new_one_is(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    v1_database(old)
    con = sqlite3.connect(old)
    con.execute(
        "INSERT INTO jobs (seq, id, name, user, queue, priority, kind, format, spec, state, "
        "submitted_at, attempt, failures, preemptions, attained_gpu_s, checkpoint_dir) VALUES "
        "(1, '1', 'a', 'u', 'default', 0, 'batch', 'native', '{}', 'succeeded', 1.0, 1, 0, 0, "
        "0.0, '/c')"
    )
    con.commit()
    con.close()
    store = Store(url(old))
    assert store.migration_note == (
        f"migrated the state database from schema version 1 to {SCHEMA_VERSION}"
    )
    with store.read() as tx:
        assert [(r["id"], r["state"], r["idempotency_key"]) for r in tx.list_jobs()] == [
            ("1", "succeeded", None)
        ]
    store.close()
    Store(url(tmp_path / "new.db")).close()
    assert shape(old) == shape(tmp_path / "new.db")
    assert Store(url(old)).migration_note is None  # once is enough


def test_a_newer_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(url(db)).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    con.commit()
    con.close()
    with pytest.raises(StoreError) as err:
        Store(url(db))
    assert str(err.value) == (
        f"{db} was written by a newer aisched (schema version 99; this one reads up to "
        f"{SCHEMA_VERSION}): run that newer aisched, or give another --data-dir"
    )
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta").fetchall() == [("99",)]


def test_a_damaged_database_is_one_line_with_what_to_do(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    db.write_bytes(b"this is not SQLite at all, just bytes " * 200)
    with pytest.raises(StoreError) as err:
        Store(url(db))
    assert str(err.value) == (
        f"the state database {db} is damaged (file is not a database): move it aside to start "
        "with an empty one (its jobs are forgotten), or restore it from a backup; "
        "`sqlite3 FILE .recover` can save what is still readable"
    )


def test_another_programs_database_is_refused_and_not_changed(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE photos (id INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(StoreError) as err:
        Store(url(db))
    assert str(err.value) == (
        f"{db} is not an aisched state database (its tables: photos); give aisched its own "
        "--data-dir or --database"
    )
    con = sqlite3.connect(db)
    tables = con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [("photos",)]


def test_a_database_with_a_damaged_page_is_refused_at_open(tmp_path: Path) -> None:
    # The header and the meta table read fine; the jobs table's root page is garbage. Without
    # the check at open the service would start and fail at its first read of the jobs.
    db = tmp_path / "state.db"
    Store(url(db)).close()
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=DELETE")  # everything in the main file, no WAL beside it
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    con.close()
    with db.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\x77" * page_size)
    with pytest.raises(StoreError) as err:
        Store(url(db))
    assert str(err.value) == (
        f"the state database {db} is damaged (database disk image is malformed): move it "
        "aside to start with an empty one (its jobs are forgotten), or restore it from a "
        "backup; `sqlite3 FILE .recover` can save what is still readable"
    )


PG = "postgresql+psycopg://"


@pytest.mark.parametrize(
    ("url", "want"),
    [
        # A raw `/` or `@` in a password is legal to SQLAlchemy; a pattern that stopped at
        # either showed the password whole.
        (PG + "ais:ab/cd+ef@127.0.0.1:5432/db", PG + "ais:***@127.0.0.1:5432/db"),
        (PG + "ais:p%40ss@host/db?host=/run/pg", PG + "ais:***@host/db?host=/run/pg"),
        (PG + "ais@host/db?password=s3cret&sslmode=require", PG + "ais@host/db?sslmode=require"),
        (PG + "host/db", PG + "host/db"),
        (PG + "ais:a?b&password=c@host/db?sslmode=require", PG + "ais:***@host/db?sslmode=require"),
        (PG + "ais:s3cret@[::1/db", PG + "(unparsable URL, not shown)"),
    ],
)
def test_a_database_url_is_shown_without_its_password(url: str, want: str) -> None:
    assert shown(url) == want


def v1_database(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute(V1_JOBS)
    con.execute("CREATE INDEX ix_jobs_state ON jobs (state)")
    con.execute("CREATE TABLE meta (key VARCHAR(64) PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO meta VALUES ('schema', '1')")
    con.commit()
    con.close()


def test_a_migration_that_fails_leaves_the_old_database_as_it_was(tmp_path: Path) -> None:
    """Every step's ALTER and CREATE is undone with the failed last write (SQLite's driver
    would commit each on its own: a migration killed half-way left a database that neither
    version could open)."""
    old = tmp_path / "old.db"
    v1_database(old)
    con = sqlite3.connect(old)
    con.execute(
        "CREATE TRIGGER no_new_version BEFORE UPDATE ON meta "
        "BEGIN SELECT RAISE(ABORT, 'the version may not change'); END"
    )
    con.commit()
    con.close()
    before = tables_of(old)
    with pytest.raises(StoreError, match="the version may not change"):
        Store(url(old))
    assert tables_of(old) == before
    con = sqlite3.connect(old)
    assert con.execute("SELECT value FROM meta").fetchall() == [("1",)]


def test_a_database_an_older_aisched_left_half_migrated_is_completed(tmp_path: Path) -> None:
    """Schema 4 with what the step to 5 makes already there (that step killed before it wrote
    the version, by an aisched whose migrations were not one transaction on SQLite)."""
    db = tmp_path / "state.db"
    Store(url(db)).close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = '4' WHERE key = 'schema'")
    con.commit()
    con.close()
    store = Store(url(db))
    assert store.migration_note == (
        f"migrated the state database from schema version 4 to {SCHEMA_VERSION}"
    )
    store.close()
    assert tables_of(db) == tables_of_new(tmp_path)


def test_a_first_release_schema_5_database_gets_its_tokens_read_only(tmp_path: Path) -> None:
    """Version 5 gained tokens.read_only after its first releases; their databases said 5
    without it, and every token request failed ("no such column")."""
    db = tmp_path / "state.db"
    Store(url(db)).close()
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE tokens DROP COLUMN read_only")
    con.execute("UPDATE meta SET value = '5' WHERE key = 'schema'")
    con.commit()
    con.close()
    store = Store(url(db))
    assert store.migration_note == (
        f"migrated the state database from schema version 5 to {SCHEMA_VERSION}"
    )
    secret, _ = tokens.create(store, "alice", admin=False, created_by="test", now=1.0)
    info = tokens.verify(store, secret, now=2.0)
    assert (info.user, info.read_only) == ("alice", False)
    store.close()
    assert tables_of(db) == tables_of_new(tmp_path)


def tables_of_new(tmp_path: Path) -> object:
    Store(url(tmp_path / "new.db")).close()
    return tables_of(tmp_path / "new.db")


def test_a_schema_7_database_gets_cookie_digests_and_its_tokens_a_new_login(
    tmp_path: Path,
) -> None:
    """Version 8 keeps a digest of each dashboard cookie; a token made before it has none, so
    its old cookies are refused until a login with the token records one."""
    db = tmp_path / "state.db"
    store = Store(url(db))
    secret, row = tokens.create(store, "alice", admin=False, created_by="test", now=1.0)
    store.close()
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE tokens DROP COLUMN cookie_digest")
    con.execute("ALTER TABLE tokens DROP COLUMN uid")
    con.execute("UPDATE meta SET value = '7' WHERE key = 'schema'")
    con.commit()
    con.close()
    store = Store(url(db))
    assert store.migration_note == (
        f"migrated the state database from schema version 7 to {SCHEMA_VERSION}"
    )
    cookie = tokens.dashboard_cookie(secret, row["id"])
    with pytest.raises(tokens.TokenRefused):
        tokens.verify_cookie(store, cookie, now=2.0)
    assert tokens.login_cookie(store, secret, row["id"]) == cookie
    assert tokens.verify_cookie(store, cookie, now=2.0).user == "alice"
    store.close()
    assert tables_of(db) == tables_of_new(tmp_path)

"""The store on a real PostgreSQL server: opened and migrated like SQLite, URLs as users write
them, one-line errors, and the leader's lease with its fencing term checked against the
database itself (two stores on one database play two instances)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from aisched.store.db import _MIGRATION_LOCK, Deposed, Store, StoreError
from aisched.store.errors import StoreUnanswered
from aisched.store.lease import Fence, read_lease, renew, try_acquire
from aisched.store.schema import SCHEMA_VERSION
from aisched.testing import postgres
from aisched.testing.postgres import PostgresServer

JOB = {
    "seq": 1,
    "id": "1",
    "name": "a",
    "user": "u",
    "queue": "default",
    "priority": 0,
    "kind": "batch",
    "format": "native",
    "spec": {},
    "state": "pending",
    "submitted_at": 1.0,
    "attempt": 0,
    "failures": 0,
    "preemptions": 0,
    "attained_gpu_s": 0.0,
    "checkpoint_dir": "/c",
}


def lead(store: Store, ttl_s: float = 30.0, *, force: bool = False) -> Fence | None:
    with store.lease_tx() as conn:
        _, got, _ = try_acquire(conn, f"h{id(store)}", f"addr-{id(store)}", ttl_s, force=force)
    if got is None:
        return None
    store.fence = Fence(got.holder, got.term)
    return store.fence


def job_ids(store: Store) -> list[str]:
    with store.read() as tx:
        return [r["id"] for r in tx.list_jobs()]


def states(store: Store) -> list[tuple[str, str]]:
    with store.read() as tx:
        return [(r["id"], r["state"]) for r in tx.list_jobs()]


def test_a_version_3_database_gets_the_lease_row_the_finished_index_and_its_tokens_columns(
    pg_server: PostgresServer,
) -> None:
    url = pg_server.create_database()
    Store(url).close()
    with Store(url).engine.begin() as conn:
        conn.execute(text("DROP TABLE leader"))
        conn.execute(text("DROP INDEX ix_jobs_finished"))
        conn.execute(text("ALTER TABLE tokens DROP COLUMN read_only"))
        conn.execute(text("ALTER TABLE tokens DROP COLUMN cookie_digest"))
        conn.execute(text("ALTER TABLE tokens DROP COLUMN uid"))
        conn.execute(
            text(
                'INSERT INTO tokens (id, digest, "user", admin, created_at, '
                "created_by) VALUES ('t1', 'd1', 'ana', 0, 1.0, 'root')"
            )
        )
        conn.execute(text("UPDATE meta SET value = '3' WHERE key = 'schema'"))
    store = Store(url)
    assert store.migration_note == (
        f"migrated the state database from schema version 3 to {SCHEMA_VERSION}"
    )
    with store.lease_tx() as conn:
        lease = read_lease(conn)
    assert (lease.holder, lease.address, lease.term, lease.expires_at) == ("", "", 0, 0.0)
    indexes = {i["name"] for i in inspect(store.engine).get_indexes("jobs")}
    assert "ix_jobs_finished" in indexes
    with store.read() as tx:  # a token made before read-only ones existed may write
        assert [(t["id"], t["read_only"]) for t in tx.list_tokens()] == [("t1", 0)]
    with store.tx() as tx:  # its first dashboard login records its cookie's digest
        tx.set_cookie_digest("t1", "c1")
        tx.set_cookie_digest("t1", "c2")  # once: the cookie of a token never changes
    with store.read() as tx:
        assert [t["cookie_digest"] for t in tx.list_tokens()] == ["c1"]
    store.close()


def test_postgresql_urls_mean_psycopg_and_hide_the_password(pg_server: PostgresServer) -> None:
    url = pg_server.create_database()
    plain = url.replace("postgresql+psycopg://aisched@", "postgresql://aisched:secret@")
    store = Store(plain)
    assert store.url == url.replace("aisched@", "aisched:***@")
    assert store.shared
    store.close()


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    url = f"postgresql://aisched@/nothing?host={tmp_path}"
    with pytest.raises(StoreError) as err:
        Store(url, busy_timeout_s=1.0)
    msg = str(err.value)
    assert msg.startswith(
        f"cannot reach the state database postgresql+psycopg://aisched@/nothing?host={tmp_path} "
        "(connection"
    )
    assert msg.endswith("): start the PostgreSQL server, or fix --database")
    assert "\n" not in msg


def test_instances_opening_one_empty_database_at_once_all_open_it(
    pg_server: PostgresServer,
) -> None:
    url = pg_server.create_database()
    opened: list[object] = []

    def open_one() -> None:
        try:
            opened.append(Store(url))
        except StoreError as e:
            opened.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [type(s) for s in opened] == [Store] * 4
    for s in opened:
        assert isinstance(s, Store)
        s.close()


def test_opening_waits_for_another_instances_migration_however_long_the_bounds(
    pg_server: PostgresServer,
) -> None:
    # A migration of a big database may take longer than a step's statements may, and an
    # instance starting beside it waits for its end: neither is held to those bounds.
    url = pg_server.create_database()
    Store(url).close()
    migrating = Store(url)
    try:
        with migrating.engine.connect() as conn, migrating._unbounded(conn), conn.begin():
            conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
            opened: list[object] = []

            def open_one() -> None:
                try:
                    opened.append(Store(url, busy_timeout_s=0.5, statement_timeout_s=0.5))
                except StoreError as e:
                    opened.append(e)

            t = threading.Thread(target=open_one)
            t.start()
            time.sleep(3.0)  # six times both bounds
            assert opened == []  # still waiting
        t.join(30)
        assert [type(s) for s in opened] == [Store], opened
        assert isinstance(opened[0], Store)
        opened[0].close()
    finally:
        migrating.close()


def test_a_deposed_leaders_late_write_is_refused_whole(pg_server: PostgresServer) -> None:
    url = pg_server.create_database()
    old, new = Store(url), Store(url)
    first = lead(old, ttl_s=0.3)
    assert first is not None and first.term == 1
    assert lead(new) is None  # a live lease is not taken
    with old.tx() as tx:
        tx.insert_jobs([JOB])
    time.sleep(0.5)  # the old leader misses its renewals (paused, cut off...)
    second = lead(new)
    assert second is not None and second.term == 2
    with pytest.raises(Deposed) as err, old.tx() as tx:
        tx.update_job("1", {"state": "cancelled"})
    assert str(err.value) == (
        f"this instance was deposed: it led in term 1, and term 2 belongs to addr-{id(new)}; "
        "its write was refused"
    )
    with old.lease_tx() as conn:
        assert renew(conn, first, 30.0) is False
    assert states(new) == [("1", "pending")]  # nothing of the refused write landed
    with new.tx() as tx:
        tx.update_job("1", {"state": "running"})
    assert states(new) == [("1", "running")]
    old.close()
    new.close()


def test_a_takeover_waits_for_the_leaders_write_under_way(pg_server: PostgresServer) -> None:
    url = pg_server.create_database()
    old, new = Store(url), Store(url)
    assert lead(old, ttl_s=0.2) is not None
    order: list[str] = []
    taken = threading.Event()

    def take_over() -> None:
        got = lead(new, force=True)  # as a standby that saw the lease expire
        order.append(f"took term {got.term if got else None}")
        taken.set()

    with old.tx() as tx:  # the fence check locks the lease row to the commit
        threading.Thread(target=take_over).start()
        assert not taken.wait(0.5)  # the takeover waits for this transaction
        tx.insert_jobs([JOB])
        order.append("old leader's write")
    assert taken.wait(10)
    assert order == ["old leader's write", "took term 2"]
    assert job_ids(new) == ["1"]  # the write that won the race landed whole
    with pytest.raises(Deposed), old.tx() as tx:
        tx.update_job("1", {"state": "failed"})
    old.close()
    new.close()


def test_a_leader_stuck_inside_a_write_past_its_lease_cannot_block_the_takeover(
    pg_server: PostgresServer,
) -> None:
    # A leader stopped (SIGSTOP, a frozen VM) inside a write transaction holds the lease row's
    # lock; without a bound the standby would wait for it for ever. The server ends the
    # transaction once it has sat idle for the lease's TTL, and its late commit fails.
    url = pg_server.create_database()
    old = Store(url, busy_timeout_s=5.0, idle_tx_timeout_s=1.0)
    new = Store(url, busy_timeout_s=5.0, idle_tx_timeout_s=1.0)
    assert lead(old, ttl_s=1.0) is not None
    terms: list[int | None] = []
    taken = threading.Event()

    def take_over() -> None:  # as a standby that saw the lease expire
        got = lead(new, force=True)
        terms.append(got.term if got else None)
        taken.set()

    with pytest.raises(Exception), old.tx() as tx:  # noqa: B017 - the driver's own error
        threading.Thread(target=take_over).start()
        # Stuck, idle in its transaction; the takeover goes through meanwhile (at about 1 s).
        assert taken.wait(3.0)
        tx.insert_jobs([JOB])
    assert terms == [2]
    assert job_ids(new) == []  # nothing of the stuck write landed
    old.close()
    new.close()


def test_a_server_that_stops_answering_fails_a_statement_within_its_bound() -> None:
    """SIGSTOP of the server (its own, not the session's): the kernel still takes requests and
    nothing answers them; the statement fails with StoreUnanswered instead of waiting for ever,
    and once the server goes on the store works again on a new connection."""
    try:
        server = postgres.start()
    except postgres.PostgresUnavailable as e:
        pytest.skip(str(e))
    store = Store(server.create_database(), busy_timeout_s=0.5, statement_timeout_s=0.5)
    try:
        with store.tx() as tx:
            tx.insert_jobs([JOB])
        failed: list[BaseException] = []

        def count() -> None:
            try:
                with store.read() as tx:
                    tx.count_by_state()
            except BaseException as e:
                failed.append(e)

        server.pause()
        try:
            t = threading.Thread(target=count, daemon=True)
            t.start()
            t.join(60)  # far past the bound: no answer by then is an answer never
        finally:
            server.resume()
        assert [type(e) for e in failed] == [StoreUnanswered]
        assert str(failed[0]) == (
            "the database server did not answer within 1 s (limits.store_statement_timeout): "
            "its connection was closed"
        )
        with store.read() as tx:
            assert tx.count_by_state() == {"pending": 1}
    finally:
        store.close()
        server.stop()

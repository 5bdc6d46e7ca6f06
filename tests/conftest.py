"""Fixtures every test directory may use: the state database, run on SQLite and on a real
PostgreSQL server (one per test session, started by `aisched.testing.postgres`; a new empty
database per test keeps the tests apart).

A test that asks for `database_url` runs twice, ids `sqlite` and `postgresql`; the SQLite one
gets None (the service's default: a file in its data directory)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aisched.testing import postgres


@pytest.fixture(scope="session")
def pg_server() -> Iterator[postgres.PostgresServer]:
    try:
        server = postgres.start()
    except postgres.PostgresUnavailable as e:
        pytest.skip(str(e))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """None for SQLite (the default file in the data directory), else a new PostgreSQL
    database's URL."""
    if request.param == "sqlite":
        return None
    server: postgres.PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database()

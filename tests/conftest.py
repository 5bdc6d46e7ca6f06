"""Fixtures every test directory may use: the state database, run on SQLite and on a real
PostgreSQL server (one per test session, started by `aisched.testing.postgres`; a new empty
database per test keeps the tests apart).

A test that asks for `database_url` runs twice, ids `sqlite` and `postgresql`; the SQLite one
gets None (the service's default: a file in its data directory).

Hypothesis draws the same examples on every run (`derandomize`), so a run passes or fails by
the code alone, never by the draw; `AISCHED_HYPOTHESIS=explore` draws new ones on each run, to
look for failing cases (one found belongs in a test written by hand, with its cause fixed)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from aisched.testing import postgres

settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("AISCHED_HYPOTHESIS", "repeatable"))


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

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
from pathlib import Path

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


# Under pytest-xdist (`--dist loadgroup`), the tests that share what the machine has once and a
# test cannot have its own of run on one worker, one after another: the Ray cluster of
# tests/ray (Ray's /tmp/ray, the nodes' state in /run/aisched-ray), and the real local users
# (tests plant and remove alice's ~/.aisched, where her jobs keep their checkpoints, and each
# rootless podman test stops her podman, and its containers, as it ends).
SHARED_MACHINE = "ray-and-local-users"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ray = Path(__file__).parent / "ray"
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if item.path.is_relative_to(ray) or "local_users" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SHARED_MACHINE))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A pytest-xdist worker stops at once if `--dist loadgroup` would not keep a group's tests
    on one worker: it names each test it sends with its `xdist_group` (node id `...@group`),
    which a pytest it does not support may silently drop (pytest 9.2 with xdist 3.8); the
    tests that share a resource of the machine would then run side by side."""
    if not session.config.getoption("loadgroup", False):  # not a worker of --dist loadgroup
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            raise pytest.UsageError(
                f"{item.nodeid}: its xdist_group is not in its node id, so pytest-xdist would "
                "not keep it on its group's worker (see the pytest pin in pyproject.toml)"
            )

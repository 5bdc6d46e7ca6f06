"""The leader's side of the election on a real PostgreSQL server, its threads running: what
its log says when renewals fail and then come back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from aisched.service.leader import Leadership, LeaseTimes
from aisched.store.db import Store
from aisched.testing.postgres import PostgresServer

# A deadline (ttl less renew) far beyond a loaded machine's pauses: the leader is never
# deposed here unless something is wrong.
TIMES = LeaseTimes(ttl_s=30.0, renew_s=0.1, poll_s=0.1)


def until(what: str, check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def test_a_renewal_that_comes_back_after_failures_is_logged(
    pg_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The log showed a leader's failed renewals only: one whose every other renewal came back
    (on the one connection to the database still working) read as a leader whose watch never
    deposed it, failing for 30 s."""
    url = pg_server.create_database()
    deposed: list[str] = []
    caplog.set_level(logging.INFO, logger="aisched.leader")
    with Store(url) as store:
        lead = Leadership(store, on_elected=lambda: None, on_deposed=deposed.append, times=TIMES)
        lead.start("http://a.test:1")
        try:
            assert lead.leading
            # Every connection of the store is dropped: the next renewal fails on its pooled
            # one, and the one after comes back on a new connection.
            pg_server.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{make_url(url).database}' AND pid <> pg_backend_pid()"
            )
            until("a renewal to come back", lambda: "renewed the lease again" in caplog.text)
        finally:
            lead.stop()
    messages = [r.getMessage() for r in caplog.records]
    failed = next(i for i, m in enumerate(messages) if m.startswith("lease: "))
    again = next(i for i, m in enumerate(messages) if m.startswith("renewed the lease again"))
    assert failed < again
    assert messages[again].endswith(" s after the last renewal (those between failed)")
    assert deposed == []


def test_a_standby_whose_polls_failed_takes_over_without_their_error(
    pg_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The error of a standby's failed poll stayed the leader's once it took over: its first
    renewal said it "came back", and a watch deposing it would have named a failure that was
    not the leader's."""
    url = pg_server.create_database()
    deposed: list[str] = []
    caplog.set_level(logging.INFO, logger="aisched.leader")
    with Store(url) as first, Store(f"{url}&application_name=standby") as second:
        a = Leadership(first, on_elected=lambda: None, on_deposed=deposed.append, times=TIMES)
        b = Leadership(second, on_elected=lambda: None, on_deposed=deposed.append, times=TIMES)
        a.start("http://a.test:1")
        b.start("http://b.test:2")
        try:
            assert (a.leading, b.role.value) == (True, "standby")
            pg_server.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'standby'"
            )
            until("a poll of the standby to fail", lambda: "lease: " in caplog.text)
            a.stop()  # resigns: the standby takes over at its next poll
            until("the takeover", lambda: b.leading)
            assert b.lease is not None
            taken = b.lease.expires_at
            until("a renewal", lambda: b.lease is not None and b.lease.expires_at > taken)
        finally:
            a.stop()
            b.stop()
    assert "renewed the lease again" not in caplog.text
    assert deposed == []

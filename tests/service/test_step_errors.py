"""The loop's failed steps: classified (a full disk, an I/O error, another store error, a bug)
and backed off exponentially, reset by a step that succeeds."""

from __future__ import annotations

import errno
import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from aisched.service.step_errors import StepErrors, classify


def wrapped(message: str) -> OperationalError:
    return OperationalError("INSERT INTO jobs ...", {}, sqlite3.OperationalError(message))


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "disk-full"),
        (OSError(errno.EIO, "Input/output error"), "io-error"),
        (wrapped("database or disk is full"), "disk-full"),
        (wrapped("disk I/O error"), "io-error"),
        (wrapped("database is locked"), "store"),
        (KeyError("a bug"), "bug"),
    ],
)
def test_failures_are_told_apart(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind


def test_back_off_doubles_up_to_its_cap_and_a_success_resets_it() -> None:
    e = StepErrors(base_s=0.5, max_s=3.0)
    waits = [e.failed(wrapped("database is locked"), now=100.0 + i) for i in range(5)]
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert (e.total, e.consecutive, e.kind, e.since, e.store_failing) == (
        5,
        5,
        "store",
        100.0,
        True,
    )
    assert e.last_error == "(sqlite3.OperationalError) database is locked"
    e.succeeded()
    assert (e.total, e.consecutive, e.kind, e.since, e.failing) == (5, 0, "", None, False)
    assert e.failed(KeyError("x"), now=200.0) == 0.5
    assert (e.failing, e.store_failing) == (True, False)


def test_a_failing_store_is_tried_again_within_seconds_and_a_bug_backs_off_further() -> None:
    # A full disk ends unseen by the loop (space freed): the service takes work again soon
    # after, not up to half a minute later.
    full = OSError(errno.ENOSPC, "No space left on device")
    store = StepErrors()
    assert [store.failed(full, now=float(i)) for i in range(8)] == [
        0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0
    ]  # fmt: skip
    bug = StepErrors()
    assert [bug.failed(KeyError("x"), now=float(i)) for i in range(8)][-3:] == [16.0, 30.0, 30.0]

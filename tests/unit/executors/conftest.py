"""Fixtures of the executor tests (the harness itself is in executor_harness.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from executor_harness import Harness  # noqa: E402


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.cleanup()


@pytest.fixture(
    params=[(True, True), (False, True), (True, False)],
    ids=["pidfd", "polling", "spawned"],
)
def any_watch(request: pytest.FixtureRequest, harness: Harness) -> Harness:
    """The harness with exits seen through pidfds, then by polling (supervisors forked by the
    fork server), then with supervisors spawned as our own children."""
    use_pidfd, fork_server = request.param
    harness.defaults = {"use_pidfd": use_pidfd, "fork_server": fork_server}
    harness.new_executor()
    return harness

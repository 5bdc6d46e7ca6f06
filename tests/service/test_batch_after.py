"""What a stored step does after its commit: every action runs, whatever another one raises."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.service.live import Batch
from aisched.store.db import Store


def test_an_action_that_fails_after_the_commit_drops_none_of_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A stop whose request file cannot be written raised out of the first action, and the
    # stops and answers after it were dropped with the list: a cancelled job stayed running.
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    done: list[str] = []

    def fails() -> None:
        raise OSError(28, "No space left on device")

    batch = Batch()
    batch.event(1.0, "1", "note", "stored with the step")
    batch.after += [lambda: done.append("before"), fails, lambda: done.append("after")]
    batch.flush(store)
    assert done == ["before", "after"]
    assert "an action after a stored step failed" in caplog.text
    assert batch.after == []
    store.close()

"""Fixtures of the control-loop tests (the world itself: world.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from world import World, new_world


@pytest.fixture
def w(tmp_path: Path, database_url: str | None) -> Iterator[World]:
    """A world on each store (ids sqlite, postgresql)."""
    world = new_world(tmp_path, database_url=database_url)
    yield world
    world.store.close()


@pytest.fixture
def pw(tmp_path: Path, database_url: str | None) -> Iterator[World]:
    """A world whose loop learns runtimes."""
    world = new_world(tmp_path, predicting=True, database_url=database_url)
    yield world
    world.store.close()

"""Fixtures of the control-loop tests (the world itself: world.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from world import World, new_world


@pytest.fixture
def w(tmp_path: Path) -> World:
    return new_world(tmp_path)


@pytest.fixture
def pw(tmp_path: Path) -> World:
    """A world whose loop learns runtimes."""
    return new_world(tmp_path, predicting=True)

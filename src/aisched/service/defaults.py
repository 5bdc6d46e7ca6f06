"""Where a local service lives by default. Standard library only: CLI clients import it."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8470


def default_home() -> Path:
    """The data directory: `$AISCHED_HOME`, else `~/.aisched`."""
    env = os.environ.get("AISCHED_HOME")
    return Path(env).expanduser() if env else Path.home() / ".aisched"

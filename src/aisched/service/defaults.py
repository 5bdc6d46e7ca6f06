"""Where a local service lives by default. Standard library only: CLI clients import it."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8470


def default_home() -> Path:
    """The data directory: `$AISCHED_HOME`, else `~/.aisched`."""
    env = os.environ.get("AISCHED_HOME")
    return Path(env).expanduser() if env else Path.home() / ".aisched"


# The system service's socket: every local user's CLI finds it here.
SYSTEM_SOCKET = Path("/run/aisched/aisched.sock")


def default_socket() -> Path:
    """Where `aisched up` serves its Unix socket: the system path when run as root (every
    local user's CLI looks there), else inside the data directory (only its user can reach
    it, and only its user's jobs can run)."""
    return SYSTEM_SOCKET if os.geteuid() == 0 else default_home() / "aisched.sock"


# The most rows one listing (`/v1/jobs`, `/v1/audit`) returns; the CLI's `--limit` checks it too.
MAX_LIST_LIMIT = 100_000

# The last line of a followed log whose caller's token was revoked or expired as it streamed
# (`service/routes/logs.py`); the CLI, seeing it last, says why it stopped and fails.
FOLLOW_STOPPED = "--- stopped following: the token is no longer valid (revoked or expired) ---\n"

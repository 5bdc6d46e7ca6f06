"""Work run in a forked child of a test, which may become another user or join a cgroup
without changing the test's own process."""

from __future__ import annotations

import os
from collections.abc import Callable


def in_child(work: Callable[[], str]) -> str:
    """What `work()` returns, run in a forked child and sent back through a pipe ("" when it
    raised: the child never returns to the test's code)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            os.write(write, work().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out

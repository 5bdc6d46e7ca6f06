"""Failpoints: named places where the service stops itself with SIGSTOP, so that a test can
reproduce a fault at an exact instant that no outside signal could hit (a leader paused after
committing a launch and before making it, for longer than its lease).

Named in `AISCHED_FAILPOINTS` (comma-separated); each fires at most once per process. Unset,
`hit` costs a dictionary lookup. The pause is real: every thread of the process stops, the
lease goes unrenewed, and the process goes on where it stopped when sent SIGCONT. Only tests
set the variable; docs/ha.md names it.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "AISCHED_FAILPOINTS"
# Between the commit of an attempt's intent (its tasks `launching`) and their launch.
PAUSE_BEFORE_LAUNCH = "pause-before-launch"
# After the first task of an attempt of several tasks is started, before the others are.
PAUSE_MID_LAUNCH = "pause-mid-launch"
# Between the bind of the Unix socket and the change of its mode (a swap of its name then).
PAUSE_AFTER_SOCKET_BIND = "pause-after-socket-bind"

_fired: set[str] = set()


def hit(name: str) -> None:
    """Stop this process here if `name` is armed and has not fired yet."""
    if name in _fired or name not in os.environ.get(ENV, "").split(","):
        return
    _fired.add(name)
    # Sent to this thread, not the process: a process-directed SIGSTOP is taken by the main
    # thread, which stops the others only once it is scheduled, and this one ran on meanwhile
    # (a gang's second task was started past its "pause").
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

"""How `aisched up` stops: SIGTERM or SIGINT asks the server to stop, and the process is gone
within the configured grace whatever it is waiting on (a wedged store, a stuck request).

1. The first signal asks the HTTP server to stop (it stops taking connections, then the loop
   is shut down and the store closed) and arms a deadline of `grace_s`.
2. When the deadline passes first, or a second signal comes, the process exits at once
   (`os._exit`) after one line saying why: running tasks are unaffected (they live under their
   own supervisors and are adopted by the next start), the data directory's lock goes with
   the process, and the store is left as its last commit (a transaction in flight is rolled
   back by the database).

A signal that arrives before the server runs (while the service is still opening) exits at
once: there is nothing yet to stop cleanly.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TextIO

EXIT_FORCED = 1  # the grace ran out, or a second signal came


class Stopper:
    def __init__(
        self,
        grace_s: float,
        *,
        before_exit: Callable[[], None] = lambda: None,
        out: TextIO = sys.stderr,
        exit_now: Callable[[int], None] = os._exit,
    ) -> None:
        self.grace_s = grace_s
        self.before_exit = before_exit
        self.out = out
        self.exit_now = exit_now
        self.request_stop: Callable[[], None] | None = None  # set once the server runs
        self.signalled = False
        self.stopped = threading.Event()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, _frame: FrameType | None = None) -> None:
        name = signal.Signals(signum).name
        if self.signalled:
            self._exit(f"second {name}: exiting at once")
            return
        self.signalled = True
        if self.request_stop is None:
            self._exit(f"{name} while starting: exiting")
            return
        print(
            f"aisched: {name}: stopping (exits within {self.grace_s:g} s; "
            "a second signal exits at once)",
            file=self.out,
            flush=True,
        )
        self.request_stop()
        threading.Thread(target=self._deadline, name="aisched-stop", daemon=True).start()

    def _deadline(self) -> None:
        if not self.stopped.wait(self.grace_s):
            self._exit(
                f"did not stop within {self.grace_s:g} s (limits.shutdown_grace): exiting now; "
                "running tasks go on and are adopted by the next start"
            )

    def _exit(self, why: str) -> None:
        try:
            self.before_exit()
            print(f"aisched: {why}", file=self.out, flush=True)
        finally:
            self.exit_now(EXIT_FORCED)

    def remaining_s(self, started: float, now: float) -> float:
        return max(0.0, self.grace_s - (now - started))

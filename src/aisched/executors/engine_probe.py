"""A node's container engine: probed at start, and again once a failed probe has aged.

A probe can fail for a passing reason: a new user's first rootless podman start is slow (the
probe's time runs out), the engine's storage is being migrated, runc was installed after the
service started. Kept for good, such a failure turned container tasks off until a restart. So a
failure holds for `REPROBE_AFTER_S` only: a container task launched after that starts a new
probe in a thread of its own and fails to start now, saying so; its restart policy retries it
after its backoff, by when the answer is in. The probe runs containers and can take its whole
time-out, which the scheduling loop, the launcher, must not wait for. One probe runs at a time.

A found engine is kept: a later fault of a working engine is the task's own (its container is
not created, in the engine's words), as it always was.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from aisched.executors import container as ctr

log = logging.getLogger(__name__)

REPROBE_AFTER_S = 10.0


class EngineProbe:
    """`probe` finds the engine or raises `EngineError`; `on_found(engine)` runs before the
    engine is handed to anyone (the executor's sweep of its old containers). Thread-safe."""

    def __init__(
        self,
        probe: Callable[[], ctr.Engine],
        on_found: Callable[[ctr.Engine], None],
        *,
        reprobe_after_s: float = REPROBE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._on_found = on_found
        self._reprobe_after_s = reprobe_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._first_lock = threading.Lock()  # held through the first probe, not the later ones
        self._engine: ctr.Engine | None = None
        self._error: str | None = None
        self._failed_at = -math.inf
        self._probing: threading.Thread | None = None
        self.off = False  # container tasks are turned off on this node (`ContainersOff`)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the last probe found, in the words of the service's start-up lines."""
        with self._lock:
            if self._engine is not None:
                return self._engine.notes
            if self._error is not None:
                return (f"container tasks cannot run: {self._error}",)
            return ()

    def first(self) -> ctr.Engine | None:
        """The engine, probed here and now if it never was (the service's start)."""
        with self._first_lock:
            with self._lock:
                probed = self._engine is not None or self._error is not None
            if not probed:
                self._run()
        return self._engine

    def engine(self) -> ctr.Engine | str:
        """The engine, else why there is none. A failure older than `reprobe_after_s` starts
        a new probe in the background; the answer is for the next call."""
        self.first()
        with self._lock:
            if self._engine is not None:
                return self._engine
            why = self._error or "no engine"
            if self.off:
                return why
            if self._probing is not None:
                return f"{why} (the engine is being probed again)"
            wait = self._failed_at + self._reprobe_after_s - self._clock()
            if wait > 0:
                later = math.ceil(wait)
                return f"{why} (probed again for a container task launched {later} s from now)"
            self._probing = threading.Thread(
                target=self._run, name="aisched-engine-probe", daemon=True
            )
            self._probing.start()
        return f"{why} (the engine is being probed again)"

    def _run(self) -> None:
        try:
            found = self._probe()
            self._on_found(found)
        except ctr.ContainersOff as e:  # configured so: no probe will find one
            with self._lock:
                self.off, self._error, self._probing = True, str(e), None
        except ctr.EngineError as e:
            self._failed(str(e))
        except Exception as e:  # a bug of the probe: containers stay off, the service lives
            log.exception("probing the container engine failed")
            self._failed(repr(e))
        else:
            with self._lock:
                again = self._error is not None
                self._engine, self._error, self._probing = found, None, None
            if again:  # the first probe's findings are in the start-up lines
                log.info("container engine found on a new probe: %s", "; ".join(found.notes))

    def _failed(self, why: str) -> None:
        with self._lock:
            again = self._error is not None
            self._error, self._failed_at, self._probing = why, self._clock(), None
        if again:
            log.warning("container engine: probed again, still cannot run containers: %s", why)

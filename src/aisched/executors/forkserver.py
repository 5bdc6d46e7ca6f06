"""The executor's side of the supervisor fork server (`supervisor.py --fork-server`).

Starting each task's supervisor as a new Python interpreter costs tens of milliseconds of CPU;
forking it from a small stdlib process that has already started costs about one. The server is
a child of the executor and ends when the executor closes its pipe (or dies); the supervisors
it forked are in their own sessions and outlive both, as spawned ones do.

If the server cannot be started or dies, `spawn` raises `ForkServerError` and the executor
falls back to spawning the supervisor directly: the fork server is an optimisation, never a
condition for running a task. A server killed between forking a supervisor and answering with
its pid leaves that supervisor to exit without running anything (it waits for its go), so the
one asked for next is the task's only one, and the one watched.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from typing import IO


class ForkServerError(RuntimeError):
    """The fork server is not available (could not start, or died)."""


class ForkServer:
    def __init__(self, script: str) -> None:
        self._script = script
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def spawn(self, task_dir: str) -> tuple[int, int]:
        """(pid, start time) of a new supervisor for `task_dir`; start time 0 if it has
        already ended."""
        with self._lock:
            for attempt in range(2):  # a server that died is restarted once
                proc = self._proc if self._proc is not None else self._start()
                stdin, stdout = _pipes(proc)
                try:
                    stdin.write(os.fsencode(task_dir) + b"\n")
                    stdin.flush()
                    reply = stdout.readline().decode()
                except OSError:
                    reply = ""
                if reply:
                    break
                self._stop()
                if attempt == 1:
                    raise ForkServerError("the supervisor fork server ended unexpectedly")
            if reply.startswith("ERR "):
                raise ForkServerError(f"fork failed: {reply[4:].strip()}")
            pid, start = reply.split()
            return int(pid), int(start)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> subprocess.Popen[bytes]:
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", self._script, "--fork-server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={},
                cwd="/",
                start_new_session=True,  # a Ctrl-C at the scheduler's terminal is not for it
            )
        except OSError as exc:
            raise ForkServerError(f"cannot start the fork server: {exc.strerror or exc}") from None
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        try:
            proc.wait(timeout=5)  # it ends at EOF on its stdin
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes]]:
    assert proc.stdin is not None and proc.stdout is not None
    return proc.stdin, proc.stdout

"""The body of the Ray actor that runs one task's process on the node the core chose.

The Ray executor wraps `TaskRunner` with `ray.remote` and creates one detached, named actor per
task, reserving exactly the task's CPUs, GPUs and memory in Ray and pinned to its node. The
actor starts the command as its own process group (stdout and stderr appended to the task's
log), watches it, and on `stop` runs the same SIGTERM, grace, SIGKILL sequence as the local
executor's supervisor, with the same exit kinds and messages.

Invariants: the command is started at most once per actor; `wait` returns exactly one result,
after the whole process group has been killed; the process gets exactly the environment it was
given (not the Ray worker's: Ray's own CUDA_VISIBLE_DEVICES must not leak into it). The process
is started from a thread that lives until it ends, with a parent-death signal, so a task whose
actor (or node) dies is killed with it instead of running on unseen.

Standard library only: it runs inside Ray worker processes, which import this module by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1

# The result of a task: {"kind": "exited"|"stopped", "exit_code": int|None, "message": str,
# "finished_at": float}; the kinds are those of `ExitKind`.
Result = dict[str, Any]


def _describe(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by signal {-code} ({name})"
    return f"exited with code {code}"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it (alive as long as the
    actor is) goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class TaskRunner:
    """One task's process. `spec` keys: command, env, workdir, log_path, grace_period_s."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.lock = threading.Lock()
        self.started = threading.Event()
        self.done = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.result: Result | None = None
        self.start_error: Result | None = None
        self.stop_requested = False
        self.killed_after_grace = False
        self.kill_at: float | None = None
        self.log_fd = -1

    # --- called by the executor (each in its own actor thread) ---------------------------

    def start(self) -> dict[str, Any]:
        """Start the command (once). Returns {"pid"}, or {"exit": Result} when it could
        not be executed (127: not found, 126: cannot run), like the local executor."""
        with self.lock:
            if not self.started.is_set():
                threading.Thread(target=self._run, name="aisched-task", daemon=True).start()
        self.started.wait()
        if self.start_error is not None:
            return {"exit": self.start_error}
        assert self.proc is not None
        return {"pid": self.proc.pid}

    def wait(self) -> Result:
        """Blocks until the task has ended; its result."""
        self.done.wait()
        assert self.result is not None
        return self.result

    def status(self) -> Result | None:
        """The result if the task has ended, else None (used when adopting it)."""
        return self.result if self.done.is_set() else None

    def stop(self, grace_period_s: float) -> None:
        """SIGTERM to the task's process group now, SIGKILL after the grace period (a later
        stop may shorten the grace, never extend it). Idempotent."""
        with self.lock:
            if self.done.is_set():
                return
            first = not self.stop_requested
            self.stop_requested = True
            deadline = time.monotonic() + max(0.0, grace_period_s)
            self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)
            proc = self.proc
        if proc is None:  # not started yet: the start sees stop_requested and gives up
            return
        if first:
            self._log(f"stop requested: SIGTERM, then SIGKILL after {max(0.0, grace_period_s):g} s")
            self._signal(proc, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(proc,), daemon=True).start()

    # --- inside the actor -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._spawn()
        finally:
            self.started.set()
        if self.proc is None:
            self._finish(self.start_error)
            return
        code = self.proc.wait()
        self._signal(self.proc, signal.SIGKILL)  # whatever the task left in its group
        with self.lock:
            stopped, after_grace = self.stop_requested, self.killed_after_grace
        if stopped and after_grace:
            msg = f"stopped: still running after the grace period, {_describe(code)}"
            self._finish({"kind": "stopped", "exit_code": code, "message": msg})
        elif stopped:
            msg = f"stopped: {_describe(code)} after SIGTERM"
            self._finish({"kind": "stopped", "exit_code": code, "message": msg})
        else:
            self._finish({"kind": "exited", "exit_code": code, "message": _describe(code)})

    def _spawn(self) -> None:
        spec = self.spec
        command = [str(c) for c in spec["command"]]
        name = command[0] if command else "(empty command)"
        try:
            os.makedirs(os.path.dirname(spec["log_path"]) or ".", exist_ok=True)
            self.log_fd = os.open(spec["log_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            msg = f"cannot open the log {spec['log_path']}: {exc.strerror}"
            self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
            return
        with self.lock:
            if self.stop_requested:
                msg = "stopped before it started"
                self.start_error = {"kind": "stopped", "exit_code": None, "message": msg}
                return
            try:
                self.proc = subprocess.Popen(
                    command,
                    env={str(k): str(v) for k, v in spec["env"].items()},
                    cwd=spec.get("workdir") or None,
                    stdin=subprocess.DEVNULL,
                    stdout=self.log_fd,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
                return
            except FileNotFoundError as exc:
                workdir = spec.get("workdir")
                if workdir and not os.path.isdir(workdir):
                    why = exc.strerror or "not found"
                    code, msg = 126, f"cannot run {name}: working directory {workdir}: {why}"
                else:
                    what = "no such file" if "/" in name else "command not found"
                    code, msg = 127, f"{what}: {name}"
            except PermissionError:
                code, msg = 126, f"cannot run {name}: permission denied"
            except OSError as exc:
                code, msg = 126, f"cannot run {name}: {exc.strerror or exc}"
        self._log(msg)
        self.start_error = {"kind": "exited", "exit_code": code, "message": msg}

    def _kill_after_grace(self, proc: subprocess.Popen[bytes]) -> None:
        while not self.done.is_set():
            with self.lock:
                kill_at = self.kill_at
            wait_s = 0.0 if kill_at is None else kill_at - time.monotonic()
            if wait_s <= 0:
                with self.lock:
                    self.killed_after_grace = proc.poll() is None
                self._signal(proc, signal.SIGKILL)
                return
            self.done.wait(min(wait_s, 0.5))

    def _signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        # The group id is the leader's pid, which stays ours until the leader is reaped.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def _log(self, line: str) -> None:
        if self.log_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self.log_fd, f"aisched: {line}\n".encode())

    def _finish(self, result: Result | None) -> None:
        assert result is not None
        result = {**result, "finished_at": time.time()}
        with self.lock:
            self.result = result
        if self.log_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.log_fd)
            self.log_fd = -1
        self.done.set()

"""The local executor's exit watcher: one thread that sees each supervisor end and turns it
into one `TaskExited`.

It waits on a pidfd per supervisor (or, where pidfds are missing or run out, checks each one's
liveness every `POLL_INTERVAL_S`). A supervisor is only trusted to be the one launched while it
is the process started at its recorded start time, so a reused pid is never taken for it. At
its end the recorded exit (`exit.json`) is handed out; a supervisor that died without one
(SIGKILL, OOM) has what is left of its task killed (its zombie still holds its pid, so its
session is told apart from a newcomer's) and its task is reported LOST, with the supervisor's
last words. Supervisors that are the executor's own children are reaped here too.

`ExitWatching` is a base class of `LocalExecutor` (`local.py`), which owns the state it works
on (declared below), sets it up and starts `_watch_loop` on a thread of its own; the executor
says in `_left_behind` what else to clean up after a task whose supervisor died without a
record (its container). The watcher never starts a task
and never writes a task directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aisched.executors import processes, task_files
from aisched.executors.base import ExitKind, TaskExited, TaskKey, exit_from_record

log = logging.getLogger("aisched.executors.local")

POLL_INTERVAL_S = 0.1


@dataclass(slots=True)
class Watched:
    key: TaskKey
    dir: str
    sup_pid: int
    sup_start: int
    cores: tuple[int, ...]
    cgroup: str | None
    grace_period_s: float
    own_child: bool
    report: bool = True  # False: only reap it (its exit was already handed out by adopt)
    pidfd: int | None = None
    gpus: tuple[int, ...] = ()
    gpu_mem_mib: int = 0


def pidfd_works() -> bool:
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


class ExitWatching:
    """The watcher's part of `LocalExecutor` (see the module docstring)."""

    _lock: threading.Lock
    _watched: dict[TaskKey, Watched]
    _reap_only: list[Watched]
    _by_fd: dict[int, Watched]
    _events: list[TaskExited]
    _wakeup: Callable[[], None] | None
    _closed: bool
    _wake_r: int
    _wake_w: int
    _epoll: select.epoll | None

    def _left_behind(self, launch: dict[str, Any] | None) -> None:
        """What to clean up, beyond the task's processes, after a supervisor that died without
        recording the end (the executor's own; nothing by default)."""

    def _watch_forked(self, w: Watched) -> None:
        """Starts watching a supervisor the fork server made. Not our child, so its pid is only
        trusted while the process is the one started at `w.sup_start`: a pidfd is kept only if
        opened while that holds; one that has already ended is found gone by the watcher."""
        pidfd: int | None = None
        if self._epoll is not None:
            try:
                pidfd = os.pidfd_open(w.sup_pid)
            except OSError:
                pidfd = None
            if pidfd is not None and not processes.is_alive(w.sup_pid, w.sup_start):
                os.close(pidfd)
                pidfd = None
        self._watch(w, pidfd, open_pidfd=False)

    def _watch(self, w: Watched, pidfd: int | None = None, *, open_pidfd: bool = True) -> None:
        """Starts watching `w` (with `pidfd` when the caller already opened one)."""
        if pidfd is None and open_pidfd and self._epoll is not None:
            try:
                pidfd = os.pidfd_open(w.sup_pid)
            except OSError:  # out of fds, or reaped by someone else already: polled instead
                pidfd = None
        with self._lock:
            if w.report:
                self._watched[w.key] = w
            else:
                self._reap_only.append(w)
            if pidfd is not None and self._epoll is not None:
                w.pidfd = pidfd
                self._by_fd[pidfd] = w
                self._epoll.register(pidfd, select.EPOLLIN)
        os.write(self._wake_w, b"x")

    def _try_watch(self, key: TaskKey, tdir: str, ident: tuple[int, int], launch: Any) -> bool:
        """Watches an adopted supervisor if it is still the process `ident` names."""
        pid, start = ident
        st = processes.proc_stat(pid)
        if st is None or st.start != start or st.state in ("Z", "X"):
            return False
        pidfd: int | None = None
        if self._epoll is not None:
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            except OSError:  # out of fds: this one is polled instead
                pidfd = None
        # Checked again after opening the pidfd: then the fd is the right process (a pid is
        # not reused while its process is alive).
        if not processes.is_alive(pid, start):
            if pidfd is not None:
                os.close(pidfd)
            return False
        w = Watched(
            key,
            tdir,
            pid,
            start,
            tuple(launch.get("cores") or ()),
            launch.get("cgroup"),
            float(launch.get("grace_period_s") or 0.0),
            own_child=st.ppid == os.getpid(),
            gpus=tuple(int(g) for g in launch.get("gpus") or ()),
            gpu_mem_mib=int(launch.get("gpu_mem_mib") or 0),
        )
        self._watch(w, pidfd)
        return True

    def _reap_later(self, key: TaskKey, tdir: str, ident: tuple[int, int] | None) -> None:
        """An adopted supervisor that is our own child still needs reaping after its end."""
        if ident is None:
            return
        st = processes.proc_stat(ident[0])
        if st is not None and st.start == ident[1] and st.ppid == os.getpid():
            self._watch(Watched(key, tdir, *ident, (), None, 0.0, own_child=True, report=False))

    def _recorded(self, key: TaskKey, tdir: str) -> TaskExited | None:
        rec = task_files.read_json(os.path.join(tdir, task_files.EXIT))
        if rec is None:
            return None
        return exit_from_record(key, rec)

    def _forget_fd(self, fd: int) -> None:
        """Under the lock."""
        self._by_fd.pop(fd, None)
        if self._epoll is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        os.close(fd)

    def _watch_loop(self) -> None:
        while not self._closed:
            try:
                if self._epoll is not None:
                    ready = [fd for fd, _ in self._epoll.poll(POLL_INTERVAL_S * 10)]
                else:
                    select.select([self._wake_r], [], [], POLL_INTERVAL_S)
                    ready = []
                self._drain_wake()
                if self._closed:
                    return
                for w in self._gone(ready):
                    self._on_gone(w)
            except Exception:  # the watcher must outlive any one task's trouble
                log.exception("exit watcher")
                time.sleep(POLL_INTERVAL_S)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _gone(self, ready: list[int]) -> list[Watched]:
        """The watched supervisors that have ended: pidfds that fired, and (without pidfds,
        or for those that could not get one) a liveness check of each."""
        with self._lock:
            gone = [self._by_fd[fd] for fd in ready if fd in self._by_fd]
            polled = [w for w in (*self._watched.values(), *self._reap_only) if w.pidfd is None]
        for w in polled:
            if w.own_child:
                # WNOWAIT: seen, not reaped, so its pid stays its own until _on_gone is done.
                try:
                    if os.waitid(os.P_PID, w.sup_pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                        continue
                except ChildProcessError:
                    w.own_child = False
                    if processes.is_alive(w.sup_pid, w.sup_start):
                        continue
                gone.append(w)
            elif not processes.is_alive(w.sup_pid, w.sup_start):
                gone.append(w)
        return gone

    def _on_gone(self, w: Watched) -> None:
        event = self._recorded(w.key, w.dir) if w.report else None
        if w.report and event is None:
            # Killed before it could record the end (SIGKILL, OOM...): its zombie still holds
            # its pid, so its session can be told apart from a newcomer's.
            started = task_files.read_json(os.path.join(w.dir, task_files.STARTED)) or {}
            processes.kill_leftovers(
                sup_pid=w.sup_pid,
                sup_start=w.sup_start,
                child_pid=started.get("child_pid"),
                child_start=started.get("child_start"),
                cgroup=w.cgroup,
            )
            self._left_behind(task_files.read_json(os.path.join(w.dir, task_files.LAUNCH)))
            event = lost_exit(
                w.key,
                f"its supervisor (pid {w.sup_pid}) ended without recording how the task ended;"
                f" what was left of the task was killed{_last_line(w.dir)}",
            )
        if w.report:
            processes.remove_cgroup(w.cgroup)
        with self._lock:
            if w.own_child:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(w.sup_pid, os.WNOHANG)
            if w.pidfd is not None:
                self._forget_fd(w.pidfd)
                w.pidfd = None
            if w in self._reap_only:
                self._reap_only.remove(w)
            if not w.report:
                return
            self._watched.pop(w.key, None)
            assert event is not None
            self._events.append(event)
            wakeup = self._wakeup
        if wakeup is not None:
            try:
                wakeup()
            except Exception:
                log.exception("wakeup callback")


def lost_exit(key: TaskKey, message: str) -> TaskExited:
    return TaskExited(
        key=key, kind=ExitKind.LOST, exit_code=None, message=message, time_s=time.time()
    )


def _last_line(tdir: str) -> str:
    """The supervisor's last words (a traceback's last line), if it left any."""
    try:
        with open(os.path.join(tdir, task_files.LOG), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 2048))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return f" (its log: {lines[-1]})" if lines else ""

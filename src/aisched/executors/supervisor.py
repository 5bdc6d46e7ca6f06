"""The per-task supervisor: runs one task's process and records how it ended, on its own.

Started by the local executor as `python -I -S supervisor.py TASK_DIR` in a new session, so it
outlives the scheduler (the role containerd-shim or conmon play for containers). It reads
`launch.json`, forks the task in a new process group (joining the task's cgroup, pinning its
cores, setting its rlimit, pointing its stdout and stderr at a pipe, then exec), writes
`started.json`, copies the task's output from the pipe into its size-capped log (`CappedLog`:
rotated past `log_max_bytes`, at most `log_max_files` files kept, a note in the log at each
rotation), waits, and writes `exit.json`. A stop is a SIGTERM to the supervisor; the
SIGTERM-grace-SIGKILL escalation runs here, so it completes even when the scheduler dies
meanwhile.

The files of a task directory, through which the executor and this process talk, are listed
in `task_files.py`.

The task's log is outside the task directory (`launch["log_path"]`); its rotated files are
`LOG.1` (the newest) to `LOG.N-1`. A log that cannot be written (a full disk) loses that output,
never blocks the task, and says how many bytes were lost once it can be written again.
`exit.json` is retried until it is written: a task's end is never lost to a full disk.

Invariants: the child is started at most once per task directory (the lock and the `abandoned`
and `exit.json` checks under it); `exit.json` is written at most once, after the child and every
process left in its group (and cgroup) has been killed; nothing of the task survives the
supervisor's normal exit.

It must never import anything outside the standard library but the package's own stdlib-only
modules it is split into (it runs with `-I -S`: at start-up, as a script, it appends the
directory that holds the package to its path), and those modules must stay side-effect free at
import. They must never import this module: run as a script it is `__main__`, and a second copy
of it would have classes of its own (an exception raised by one would not be caught as the
other's). Linux only (/proc, process groups, cgroups).

Its parts, each a module of its own: `processes.py` (/proc, signals, cgroups, killing what is
left of a task), `task_files.py` (the task directory's files), `mounts.py` (mount(2) and its
kin), `supervisor_pins.py` (a user's host paths, pinned for root's container engine) and
`supervisor_shm.py` (a job attempt's private /dev/shm). The sections below stand apart, each
with its own header.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource
import select
import signal
import stat
import sys
import time

# Without importing typing (start-up time counts): mypy treats this name as always true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

if not __package__:
    # Run as a script (with `-I -S`), the package is not on the import path: the directory
    # that holds it is appended (never prepended: nothing may shadow the standard library).
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from aisched.executors.processes import (  # noqa: E402
    MIB,
    describe_code,
    group_rss_bytes,
    kill_leftovers,
    killpg_quietly,
    oom_kills,
    remove_task_cgroups,
    signal_cgroup,
    signal_name,
    start_time,
)
from aisched.executors.supervisor_pins import Pins  # noqa: E402
from aisched.executors.supervisor_shm import (  # noqa: E402
    SHM_SHARED,
    enter_shm,
    join_shm,
    probe_shm,
    release_shm,
)
from aisched.executors.task_files import (  # noqa: E402
    ABANDONED,
    EXIT,
    LAUNCH,
    LOCK,
    LOG,
    STARTED,
    STOP,
    _ExecFailed,
    _note,
    read_json,
    write_json_atomic,
)

# How often memory is checked (group RSS under an rlimit, the OOM counter under a cgroup).
MEMORY_CHECK_S = 0.5
# Words a program prints when an allocation fails: under an rlimit that is how a task that
# went over its limit usually ends (malloc fails, nothing is killed).
ALLOCATION_FAILURES = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc")
# Task logs: 10 MiB per file and 3 files (the current one and two rotated), kubelet's default.
LOG_MAX_BYTES = 10 * MIB
LOG_MAX_FILES = 3
# How much output is copied per read of the pipe, and how often a write of exit.json that
# failed (ENOSPC, EIO) is tried again.
PIPE_READ = 1 << 16
EXIT_RETRY_S = 1.0


# --- the task's log --------------------------------------------------------------------------


class CappedLog:
    """A task's log that never grows past `max_bytes` per file and `max_files` files.

    At the cap, `PATH.1` ... become `PATH.2` ... (the oldest dropped), `PATH` becomes `PATH.1`,
    and a new `PATH` starts with a line saying so; with `max_files` 1 the old output is dropped.
    `max_bytes` 0 means no cap. A write that fails (ENOSPC, EIO) drops that output: the task is
    never blocked by its log, and the next write that succeeds says how much was lost."""

    def __init__(self, path: str, max_bytes: int, max_files: int) -> None:
        self.path = path
        # Never below a page: each new file starts with a note that must fit.
        self.max_bytes = max(4096, max_bytes) if max_bytes > 0 else 0
        self.max_files = max(1, max_files)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size
        self.start = self.size  # where this run's output begins in the current file
        self.rotations = 0
        self.dropped = 0  # bytes of output no longer kept (rotated out, or truncated)
        self.lost = 0  # bytes that could not be written since the last successful write
        self.lost_why = ""

    def write(self, data: bytes) -> None:
        while data:
            if self.max_bytes and self.size >= self.max_bytes:
                self.rotate()
            room = self.max_bytes - self.size if self.max_bytes else len(data)
            part, data = data[: max(room, 1)], data[max(room, 1) :]
            self._append(part)

    def _append(self, data: bytes) -> None:
        if self.lost:
            lost, self.lost = self.lost, 0
            self._append(f"aisched: {lost} bytes of output lost: {self.lost_why}\n".encode())
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                self.size += n
                view = view[n:]
        except OSError as exc:
            self.lost += len(view)
            self.lost_why = f"cannot write the log: {exc.strerror or exc}"

    def rotate(self) -> None:
        owner = os.fstat(self.fd)  # the new file is the task's user's, as the first was
        os.close(self.fd)
        self.rotations += 1
        try:
            if self.max_files == 1:
                self.dropped += self.size
                os.unlink(self.path)
            else:
                oldest = f"{self.path}.{self.max_files - 1}"
                with contextlib.suppress(FileNotFoundError):
                    self.dropped += os.stat(oldest).st_size
                for i in range(self.max_files - 1, 1, -1):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(f"{self.path}.{i - 1}", f"{self.path}.{i}")
                os.replace(self.path, f"{self.path}.1")
        except OSError:
            pass  # cannot rename: start the file again rather than let it grow
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        with contextlib.suppress(OSError):
            os.fchown(self.fd, owner.st_uid, owner.st_gid)
        self.size = self.start = 0
        name = os.path.basename(self.path)
        kept = (
            f"the output before this line is in {name}.1 to {name}.{self.max_files - 1}"
            if self.max_files > 2
            else f"the output before this line is in {name}.1"
            if self.max_files == 2
            else "the output before this line was dropped"
        )
        self._append(
            f"aisched: log rotated ({self.rotations} time(s); at most {self.max_files} "
            f"file(s) of {self.max_bytes} bytes are kept): {kept}; {self.dropped} bytes of "
            "older output dropped\n".encode()
        )

    def tail(self, n: int) -> bytes:
        """The last `n` bytes of this run's output in the current file."""
        try:
            size = os.fstat(self.fd).st_size
            start = max(self.start, size - n)
            return os.pread(self.fd, size - start, start) if size > start else b""
        except OSError:
            return b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# --- the supervisor --------------------------------------------------------------------------


class _Signals:
    """What the signal handlers saw; the main loop acts on it (handlers only set fields)."""

    __slots__ = ("stops",)

    def __init__(self) -> None:
        self.stops = 0


def _exec_failure(stage: str, exc: BaseException, command: list[str], workdir: str | None) -> str:
    """`CODE\\nMESSAGE` for a child that could not exec (127: not found, 126: cannot run)."""
    name = command[0] if command else "(empty command)"
    if stage == "workdir":
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"126\ncannot run {name}: working directory {workdir}: {why}"
    if stage == "exec" and isinstance(exc, FileNotFoundError):
        what = "no such file" if "/" in name else "command not found"
        return f"127\n{what}: {name}"
    if stage == "exec" and isinstance(exc, PermissionError):
        return f"126\ncannot run {name}: permission denied"
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
    return f"126\ncannot run {name}: {stage}: {why}"


def become(user: dict[str, Any]) -> None:
    """Drop to the task's user for good: groups first (they need root), then gid, then uid;
    then check that root cannot be regained."""
    uid, gid = int(user["uid"]), int(user["gid"])
    os.setgroups([int(g) for g in user.get("groups") or [gid]])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.geteuid() != uid or os.getegid() != gid:
        raise OSError(errno.EPERM, f"could not become uid {uid}")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError(errno.EPERM, "root could be regained after dropping privileges")


def _child(launch: dict[str, Any], out_w: int, err_w: int) -> None:
    """In the forked child, before exec. Never returns; failures go to `err_w`."""
    command = [str(c) for c in launch["command"]]
    stage = "setup"
    try:
        os.setpgid(0, 0)
        # Dispositions we set would survive exec (ignored ones) or be meaningless there.
        # Python itself ignores SIGPIPE and SIGXFSZ; a task expects the defaults.
        for sig in (
            signal.SIGINT,
            signal.SIGHUP,
            signal.SIGTERM,
            signal.SIGCHLD,
            signal.SIGPIPE,
            signal.SIGXFSZ,
        ):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        stage = "cgroup"
        # Join before exec, so every byte the task allocates counts against its limit.
        for cgroup in [launch.get("cgroup"), *launch.get("bound_cgroups", ())]:
            if cgroup:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
        stage = "cpu affinity"
        if launch.get("cores"):
            os.sched_setaffinity(0, launch["cores"])
        stage = "rlimit"
        limit = int(launch.get("mem_limit_mib") or 0) * MIB
        if launch.get("mechanism") == "rlimit" and limit:
            # RLIMIT_DATA, not RLIMIT_AS: CUDA reserves huge (unbacked) address ranges.
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        stage = "output"
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)  # the pipe the supervisor copies into the capped log
        os.dup2(out_w, 2)
        shm = launch.get("shm_path")
        if shm:
            stage = "private /dev/shm"
            try:
                enter_shm(shm, str(launch["shm"]["root"]))
            except OSError as exc:  # today's behaviour, said in its log: never a failed task
                os.write(1, f"aisched: {SHM_SHARED}: {exc.strerror or exc}\n".encode())
        user = launch.get("user")
        if user and not launch.get("container"):
            stage = "user"
            # os.execvpe imports this lazily; once we are the user, the interpreter's own
            # library may be out of reach (a Python installed under root's home).
            import warnings  # noqa: F401

            become(user)
        # The task's own files get the usual modes; the service's umask is for its own.
        os.umask(0o022)
        for path in launch.get("make_dirs") or ():
            stage = f"checkpoint directory {path}"
            os.makedirs(path, mode=0o700, exist_ok=True)
        stage = "workdir"  # as the user: a directory the user cannot enter is refused
        if launch.get("workdir"):
            os.chdir(launch["workdir"])
        stage = "exec"
        env = {str(k): str(v) for k, v in launch["env"].items()}
        os.execvpe(command[0], command, env)
    except BaseException as exc:
        report = _exec_failure(stage, exc, command, launch.get("workdir"))
        try:
            os.write(err_w, report.encode("utf-8", "replace"))
        finally:
            os._exit(int(report.split("\n", 1)[0]))


class Supervisor:
    def __init__(self, task_dir: str, launch: dict[str, Any], wake_r: int, sigs: _Signals):
        self.dir = task_dir
        self.launch = launch
        self.wake_r = wake_r
        self.sigs = sigs
        self.cgroup: str | None = launch.get("cgroup") or None
        self.mechanism = str(launch.get("mechanism") or "none")
        self.limit_mib = int(launch.get("mem_limit_mib") or 0)
        self.out: CappedLog | None = None
        self.out_r = -1  # the read end of the task's stdout/stderr pipe, while open
        self.child = 0
        self.container: Container | None = (
            Container(launch["container"], cwd=task_dir) if launch.get("container") else None
        )

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def log(self, line: str) -> None:
        """A line from aisched itself in the task's log, where the user will look."""
        if self.out is not None:
            self.out.write(f"aisched: {line}\n".encode())

    def finish(self, kind: str, code: int | None, message: str) -> int:
        remove_task_cgroups(self.launch)
        if self.launch.get("shm"):  # every process of the task is gone by now
            with contextlib.suppress(OSError):
                release_shm(self.launch["shm"], self.dir)
        record = {"kind": kind, "exit_code": code, "message": message, "finished_at": time.time()}
        # The end of a task is never lost to a full disk: wait for space (but not for a task
        # directory that was deleted).
        while True:
            try:
                write_json_atomic(self.path(EXIT), record)
                break
            except OSError as exc:
                if not os.path.isdir(self.dir):  # removed under us: no one will ever read it
                    _note(f"cannot write {EXIT}: the task directory is gone")
                    break
                _note(f"cannot write {EXIT} ({exc.strerror or exc}); retrying")
                with contextlib.suppress(OSError):
                    os.unlink(f"{self.path(EXIT)}.tmp{os.getpid()}")
                time.sleep(EXIT_RETRY_S)
        if self.out is not None:
            self.out.close()
        return 0

    def grace(self) -> float:
        stop = read_json(self.path(STOP)) or {}
        g = stop.get("grace_period_s")
        return float(g if g is not None else self.launch.get("grace_period_s", 0.0))

    def run(self) -> int:
        try:
            self.out = CappedLog(
                self.launch["log_path"],
                int(self.launch.get("log_max_bytes", LOG_MAX_BYTES)),
                int(self.launch.get("log_max_files", LOG_MAX_FILES)),
            )
        except OSError as exc:
            return self.finish("exited", 126, f"cannot open the log {exc.filename}: {exc.strerror}")
        if self.sigs.stops:
            return self.finish("stopped", None, "stopped before it started")
        try:
            self.spawn()
        except _ExecFailed as failed:
            self.log(failed.message)
            return self.finish(failed.kind, failed.code, failed.message)
        return self.watch()

    def spawn(self) -> None:
        launch = self.launch
        if self.container is not None:
            # The container is created and set up first; the child is its attached client.
            launch = self.container.prepare(self.log)
        elif launch.get("shm"):
            launch = {**launch, "shm_path": self.join_shm()}
        if launch.get("shm_notice"):
            self.log(str(launch["shm_notice"]))
        err_r, err_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child execs or _exits
            os.close(err_r)
            os.close(out_r)
            _child(launch, out_w, err_w)
        os.close(err_w)
        os.close(out_w)  # only the task holds it now: EOF once all its processes are gone
        os.set_blocking(out_r, False)
        self.out_r = out_r
        self.child = pid
        # Also here, so the group exists whichever of the two runs first.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        chunks = []
        while chunk := os.read(err_r, 4096):
            chunks.append(chunk)
        os.close(err_r)
        if chunks:
            os.waitpid(pid, 0)
            code, _, message = b"".join(chunks).decode("utf-8", "replace").partition("\n")
            raise _ExecFailed(int(code), message)
        try:
            write_json_atomic(
                self.path(STARTED),
                {
                    "supervisor_pid": os.getpid(),
                    "supervisor_start": start_time(os.getpid()),
                    "child_pid": pid,
                    "child_start": start_time(pid),
                    "started_at": time.time(),
                },
            )
        except OSError as exc:  # a full disk: a task nobody could find again must not run
            self.kill_task(signal.SIGKILL)
            os.waitpid(pid, 0)
            raise _ExecFailed(
                126, f"cannot record the task's start ({exc.strerror or exc}): not run"
            ) from None

    def join_shm(self) -> str | None:
        """The path of the attempt's tmpfs for the child to bind over /dev/shm; None (and a
        line in the task's log) when it cannot be had: the task runs as it would without."""
        try:
            return join_shm(self.launch["shm"], self.dir)
        except OSError as exc:
            self.log(f"{SHM_SHARED}: {exc.strerror or exc}")
            return None

    def kill_task(self, sig: int) -> None:
        if self.child <= 0:  # killpg(0) would hit our own group
            return
        if self.container is not None:
            # Signals go to the container through its engine; its attached client ends with it.
            self.container.signal(sig, self.grace())
            return
        killpg_quietly(self.child, sig)
        if self.cgroup:  # what left the task's group (a daemon that called setsid) as well
            signal_cgroup(self.cgroup, sig, skip_group=self.child)

    def memory_exceeded(self) -> str | None:
        """A message when the task went over its memory limit and must be killed."""
        if self.container is not None:
            return self.oom_message() if self.container.oom_seen() else None
        if self.mechanism == "rlimit" and self.limit_mib:
            rss = group_rss_bytes(self.child)
            if rss > self.limit_mib * MIB:
                return (
                    f"killed: exceeded its memory limit of {self.limit_mib} MiB "
                    f"(its processes held {rss // MIB} MiB)"
                )
        elif self.cgroup and oom_kills(self.cgroup):
            return self.oom_message()
        return None

    def oom_message(self) -> str:
        if self.limit_mib:
            return f"killed: exceeded its memory limit of {self.limit_mib} MiB"
        return "killed by the kernel's out-of-memory killer"

    def watch(self) -> int:
        seen_stops = 0
        kill_at: float | None = None
        killed_after_grace = False
        oom: str | None = None
        check_memory = self.limit_mib > 0 or self.cgroup is not None
        next_check = time.monotonic() + MEMORY_CHECK_S
        while True:
            # 1. Exited? WNOWAIT keeps the zombie, so its pid (and group id) stay the task's
            #    until the group has been killed.
            if os.waitid(os.P_PID, self.child, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                break
            now = time.monotonic()
            # 2. Stop: SIGTERM to the group now, SIGKILL after the grace (a later stop may
            #    shorten it, never extend it).
            if self.sigs.stops != seen_stops:
                first = seen_stops == 0
                seen_stops = self.sigs.stops
                grace = max(0.0, self.grace())
                if first:
                    self.log(f"stop requested: SIGTERM, then SIGKILL after {grace:g} s")
                    self.kill_task(signal.SIGTERM)
                deadline = now + grace
                kill_at = deadline if kill_at is None else min(kill_at, deadline)
            if kill_at is not None and now >= kill_at and not killed_after_grace:
                killed_after_grace = True
                self.kill_task(signal.SIGKILL)
            # 3. Memory.
            if check_memory and now >= next_check and oom is None:
                next_check = now + MEMORY_CHECK_S
                oom = self.memory_exceeded()
                if oom:
                    self.log(oom)
                    self.kill_task(signal.SIGKILL)
            waits = [next_check - now] if check_memory and oom is None else []
            if kill_at is not None and not killed_after_grace:
                waits.append(kill_at - now)
            timeout = max(0.0, min(waits)) if waits else None
            fds = [self.wake_r] if self.out_r < 0 else [self.wake_r, self.out_r]
            ready, _, _ = select.select(fds, [], [], timeout)
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 512)
            if self.out_r in ready:
                self.copy_output()
        return self.reap(seen_stops > 0, killed_after_grace, oom)

    def copy_output(self, *, drain: bool = False) -> None:
        """Copy what the task wrote into its log: one read, or (`drain`) all there is now."""
        while self.out_r >= 0:
            try:
                data = os.read(self.out_r, PIPE_READ)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # EOF: every writer is gone
                os.close(self.out_r)
                self.out_r = -1
                return
            if self.out is not None:
                self.out.write(data)
            if not drain:
                return

    def reap(self, stopped: bool, killed_after_grace: bool, oom: str | None) -> int:
        logged_oom = oom is not None
        # Orphans of the task first: the leader's zombie still holds the group id. (A
        # container's processes are not ours: `end` removes the container.)
        if self.container is None:
            self.kill_task(signal.SIGKILL)
        _, status = os.waitpid(self.child, 0)
        code = os.waitstatus_to_exitcode(status)
        if self.container is not None:
            code, oom_killed = self.container.end(code)
            if oom_killed and oom is None and code != 0:
                oom = self.oom_message()
        kill_leftovers(
            sup_pid=os.getpid(),
            sup_start=start_time(os.getpid()),
            child_pid=None,
            child_start=None,
            cgroup=None,
        )
        self.copy_output(drain=True)  # what the task wrote before it ended
        if self.out_r >= 0:  # a process that escaped the kill still holds the pipe
            os.close(self.out_r)
            self.out_r = -1
        if oom is None and self.cgroup and oom_kills(self.cgroup) and code != 0:
            oom = self.oom_message()
        remove_task_cgroups(self.launch)
        by_rlimit = self.mechanism == "rlimit" or (
            self.container is not None and self.container.rlimit_data > 0
        )
        if oom is None and by_rlimit and self.limit_mib and code != 0:
            oom = self.allocation_failure()
        if oom is not None:
            if not logged_oom:
                self.log(oom)
            return self.finish("oom", code, oom)
        if stopped:
            if killed_after_grace:
                message = f"stopped: still running after the grace period, {describe_code(code)}"
            else:
                message = f"stopped: {describe_code(code)} after SIGTERM"
            return self.finish("stopped", code, message)
        return self.finish("exited", code, describe_code(code))

    def allocation_failure(self) -> str | None:
        """Under an rlimit an over-limit task usually dies of a failed allocation, not a kill:
        recognised by what it printed during this run (the end of its log)."""
        tail = self.out.tail(8192) if self.out is not None else b""
        if any(word in tail for word in ALLOCATION_FAILURES):
            return (
                f"failed to allocate memory beyond its limit of {self.limit_mib} MiB "
                "(data-segment rlimit)"
            )
        return None


# --- container tasks --------------------------------------------------------------------------


def _own_dir(path: str, uid: int) -> None:
    """Raises _ExecFailed unless `path` is a directory of `uid` itself, not a link. The engine
    mounts it read-write with root's rights: a link the user placed there (to a directory it
    may not read) or another's directory would give the task what its user may not open."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise _ExecFailed(126, f"checkpoint directory {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link, which the engine would follow with root's rights"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != uid:
        why = f"belongs to uid {st.st_uid}, not to the task's user (uid {uid})"
    else:
        return
    raise _ExecFailed(126, f"checkpoint directory {path} {why}: refused; remove it")


def _make_dir(path: str, owner: list[int] | None) -> None:
    """`path` made by `owner` (uid, gid), the leaf 0700, its missing parents its own too; by
    the service, 0755, without one. Raises _ExecFailed with the reason."""
    if owner:
        why = _run_as(owner, (), ["mkdir", "-p", "-m", "700", "--", path])
        if why is not None:
            raise _ExecFailed(126, f"cannot make {path}: {why}")
        return
    try:
        os.makedirs(path, mode=0o755)
    except OSError as exc:
        raise _ExecFailed(126, f"cannot make {path}: {exc.strerror or exc}") from None


def _run_as(owner: Sequence[int], groups: Sequence[int], argv: list[str]) -> str | None:
    """Runs `argv` as `owner` (uid, gid) with `groups` and the usual umask; why it failed
    (its last line), or None."""
    import subprocess  # only container tasks pay for it

    done = subprocess.run(
        argv, user=int(owner[0]), group=int(owner[1]), extra_groups=list(groups),
        umask=0o022, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return None if done.returncode == 0 else _last(done.stderr)


def _own_resolved(path: str, uid: int) -> str:
    """Where `path` resolves to, once it and that are both checked by `_own_dir`: a link on
    the way (the user's to place) must lead to a directory of the task's user too."""
    _own_dir(path, uid)
    real = os.path.realpath(path)
    _own_dir(real, uid)
    return real


class _Pinned:
    """One `--volume` of `create` once pinned: where its value is (`at` is its flag's index),
    the host path, the normalised container path, the pin, and whether it is read-only. (A
    plain class: the supervisor imports no dataclasses, start-up time counts.)"""

    __slots__ = ("at", "host", "path", "pin", "read_only")

    def __init__(self, at: int, host: str, path: str, pin: str, read_only: bool) -> None:
        self.at, self.host, self.path, self.pin, self.read_only = at, host, path, pin, read_only


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a command line (its first), or None."""
    at = [i for i, a in enumerate(argv[:-1]) if a == flag]
    return argv[at[0] + 1] if at else None


def _enclosing(m: _Pinned, mounts: Sequence[_Pinned]) -> _Pinned | None:
    """The mount `m` is nested in (the deepest whose container path holds `m`'s), or None."""
    outers = [o for o in mounts if m.path.startswith(o.path.rstrip("/") + "/")]
    return max(outers, key=lambda o: len(o.path), default=None)


def _image_link(kind_of: Callable[[str], str], path: str, mounted: set[str]) -> str | None:
    """The first symbolic link on the way to `path` (itself included) in a container's root
    file system, as far as the names exist and up to a `mounted` path (what is below one is
    the mount's), or None. `kind_of` reads the file system (`_rootfs_kind`, `_layers_kind`,
    `_exported_kinds`): what a path is, "link", "dir" or anything else (no directory, or
    missing), never following a link; it is asked about each name on the way in turn, and
    only past directories. Paths are read as the engines read them: a `..` dropped from the
    text before any link is followed (`/x/../zz` is `/zz`, whatever `/x` is)."""
    path = _clean(path)
    mounted = {_clean(m) for m in mounted}
    seen = "/"
    for name in [p for p in path.split("/") if p]:
        seen = os.path.join(seen, name)
        kind = kind_of(seen)
        if kind == "link":
            return seen
        if kind != "dir" or seen in mounted:
            return None
    return None


def _clean(path: str) -> str:
    return os.path.normpath("/" + path.lstrip("/"))


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link"
    return "dir" if stat.S_ISDIR(st.st_mode) else "other"


def _rootfs_kind(rootfs: str) -> Callable[[str], str]:
    """The reader of a mounted root file system (podman's `mount`). An lstat from its top:
    asked in turn (see `_image_link`), everything on the way is a directory, no link."""

    def kind_of(path: str) -> str:
        try:
            return _kind(os.lstat(os.path.join(rootfs, path.lstrip("/"))))
        except OSError:
            return "missing"

    return kind_of


def _layers_kind(layers: Sequence[str]) -> Callable[[str], str]:
    """The reader of a root file system not mounted, from the directories of its overlay
    layers (docker's overlay2: the container's own layer, then its `-init` layer and the
    image's, the uppermost first), merged as overlayfs merges them: the uppermost layer that
    holds a name decides what it is; a whiteout there (a character device 0/0) hides it; a
    directory is merged with the directories of that name below it, down to the first
    opaque one (`trusted.overlay.opaque`) or the first layer where the name is no directory."""

    def kind_of(path: str) -> str:
        dirs, kind = list(layers), "dir"
        for name in [p for p in path.split("/") if p]:
            if kind != "dir":
                return "missing"
            below: list[str] = []
            kind = "missing"
            for top in dirs:
                at = os.path.join(top, name)
                try:
                    st = os.lstat(at)
                except OSError:
                    continue  # not in this layer: the next one down may hold it
                if not stat.S_ISDIR(st.st_mode):
                    if not below and not (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
                        kind = _kind(st)
                    break
                below.append(at)
                kind = "dir"
                if _opaque(at):
                    break
            dirs = below
        return kind

    return kind_of


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _exported_kinds(tar_stream: Any, paths: Sequence[str]) -> Callable[[str], str]:
    """The reader of a root file system exported as a tar (docker's `export`, for storage
    drivers other than overlay2): what each name on the way to `paths` is, read from the
    whole stream (a name may come anywhere in it)."""
    import tarfile  # only this fallback pays for it

    names = [_clean(p).strip("/").split("/") for p in paths]  # as `_image_link` asks
    wanted = {"/".join(n[:k]) for n in names for k in range(1, len(n) + 1)}
    links: set[str] = set()  # every symbolic link: a hard link to one is one too
    kinds: dict[str, str] = {}
    with tarfile.open(fileobj=tar_stream, mode="r|") as tar:
        for entry in tar:
            name = os.path.normpath(entry.name).lstrip("/")
            if entry.issym():
                links.add(name)
            if name not in wanted:
                continue
            if entry.islnk():
                target = os.path.normpath(entry.linkname).lstrip("/")
                kinds[name] = "link" if target in links else "other"
            else:
                kinds[name] = "link" if entry.issym() else "dir" if entry.isdir() else "other"
    return lambda path: kinds.get(path.strip("/"), "missing")


class Container:
    """One task's container, driven through its engine's command line (podman or docker).

    `launch["container"]` (written by the executor, see `container.py`): `binary`, `name`,
    `image`, `create` (the whole create command), `start` (the attached start command),
    `engine_env` (the environment the engine needs), `cgroup_version`, `bandwidth_bit_s`;
    where the engine has no cgroup for it (rootless podman on cgroup v1: `cgroup_version`
    "none"), `pin_cores` (set as the affinity of the engine's `init`, which the container's
    processes inherit), `rlimit_data` (bytes, set on the container's process before it
    execs the task) and `notice` (what is not enforced, for the log).
    The container is created and initialised before its process starts, so its OOM watch and
    its traffic shaping are in place before the task's first instruction.
    """

    def __init__(self, spec: dict[str, Any], cwd: str | None = None) -> None:
        self.spec = spec
        # Where the engine runs: conmon leaves files in its working directory (an `oom` file
        # after an OOM kill, with podman 4.3 on cgroup v1), so never the service's.
        self.cwd = cwd
        self.binary = str(spec["binary"])
        self.name = str(spec["name"])
        self.env = {str(k): str(v) for k, v in (spec.get("engine_env") or {}).items()}
        self.oom_fd = -1
        self.oom_cgroup: str | None = None
        self.oomed = False
        self.signalled = False
        self.killed = False  # we sent SIGKILL ourselves
        self.stopper: Any = None  # the `stop -t GRACE` running in the background
        self.pin_cores = [int(c) for c in spec.get("pin_cores") or ()]
        # Memory held by a per-process rlimit, not a cgroup (bytes; 0: none): a failed
        # allocation is the sign of going over it.
        self.rlimit_data = int(spec.get("rlimit_data") or 0)
        # A user's container under root's engine has its host paths pinned (see Pins).
        owner = spec.get("owner")
        self.pins: Pins | None = None
        if owner and os.geteuid() == 0:
            groups = frozenset(int(g) for g in spec.get("owner_groups") or (owner[1],))
            self.pins = Pins(self.name, int(owner[0]), groups)

    def engine(
        self, *args: str, timeout_s: float = 60.0, cores: Sequence[int] = ()
    ) -> tuple[int, str, str]:
        import subprocess  # only container tasks pay for it

        def pin() -> None:  # inherited by conmon, the runtime and the container's init
            os.sched_setaffinity(0, cores)

        try:
            r = subprocess.run(
                [self.binary, *args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=self.env,
                cwd=self.cwd,
                check=False,
                preexec_fn=pin if cores else None,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 125, "", str(exc)
        return r.returncode, r.stdout, r.stderr

    def prepare(self, log: Any) -> dict[str, Any]:
        """Creates and initialises the container; the launch its attached client runs with.
        Raises _ExecFailed with one line (naming the image when it is the image's fault)."""
        try:
            return self.create(log)
        except BaseException:
            self.unpin()
            raise

    def create(self, log: Any) -> dict[str, Any]:
        if self.pins is not None:
            self.pin_mounts(self.make_dirs())
        else:
            self.mount_resolved(self.make_dirs())
        if self.spec.get("notice"):
            log(str(self.spec["notice"]))
        image = str(self.spec.get("image") or "")
        if image and self.engine("image", "inspect", "--format", "{{.Id}}", image)[0] != 0:
            log(f"image {image} is not on this node: pulling it (if the pull policy allows)")
        code, _, err = self.engine(*self.spec["create"][1:], timeout_s=3600.0)
        if code != 0:
            message, image_missing = self.create_failure(err)
            raise _ExecFailed(125, message, "unrunnable" if image_missing else "exited")
        if self.pins is not None:
            self.refuse_image_links()
        if self.spec.get("engine") == "docker":
            # Docker has no `init`: the container starts with its attached client, and docker
            # reports its OOM kills itself (bandwidth is refused for it at launch).
            return self.client_launch()
        code, _, err = self.engine("init", self.name, cores=self.pin_cores)
        if code != 0:
            self.remove()
            raise _ExecFailed(125, f"container {self.name} could not start: {_last(err)}")
        self.unpin()  # its mounts are in the container now
        _, out, _ = self.engine("inspect", "--format", "{{.State.Pid}}", self.name)
        pid = int(out.strip() or 0) if out.strip().isdigit() else 0
        if pid > 0 and self.rlimit_data:
            # The container's process waits to exec the task's command: what it execs keeps
            # the limit (ours to lower: rootless, that process is our own uid).
            try:
                limit = (self.rlimit_data, self.rlimit_data)
                resource.prlimit(pid, resource.RLIMIT_DATA, limit)
            except OSError as exc:
                self.remove()
                raise _ExecFailed(
                    125, f"cannot limit the memory of {self.name}: {exc.strerror or exc}"
                ) from None
        if pid > 0:
            self.watch_oom(pid)
            rate = self.spec.get("bandwidth_bit_s")
            if rate:
                self.shape(pid, int(rate), log)
        return self.client_launch()

    def client_launch(self) -> dict[str, Any]:
        """The launch its attached client runs with (see `self_launch_defaults`)."""
        return {
            **self_launch_defaults(),
            "container": self.spec,
            "command": list(self.spec["start"]),
            "env": self.env,
            "workdir": self.cwd,
        }

    def pin_mounts(self, resolved: dict[str, str]) -> None:
        """Each host path `create` mounts replaced by its pin (see Pins): the directories made
        (`make_dirs`) by where they resolved, which must be the user's own; one the user may
        not write mounted read-only. A mount inside another one is put in that one's pin by
        the supervisor (`Pins.nest`), not left to the engine."""
        assert self.pins is not None
        own = set(resolved.values())
        create = self.spec["create"]
        mounts: list[_Pinned] = []
        for i in range(len(create) - 1):
            if create[i] != "--volume":
                continue
            host, _, rest = create[i + 1].partition(":")
            host = resolved.get(host, host)
            pinned, writable = self.pins.pin(host, own=host in own)
            read_only = rest.endswith(":ro") or not writable
            inner = rest.removesuffix(":ro")
            create[i + 1] = f"{pinned}:{inner}" + (":ro" if read_only else "")
            mounts.append(_Pinned(i, host, os.path.normpath(inner), pinned, read_only))
        if (workdir := self.nested_workdir(mounts)) is not None:
            mounts.append(workdir)
        nested: set[int] = set()
        holders: set[int] = set()  # the mounts something is nested in
        # The deepest first: a pin holds what is nested in it before it is nested itself.
        for m in sorted(mounts, key=lambda m: m.path.count("/"), reverse=True):
            if (outer := _enclosing(m, mounts)) is None:
                continue
            rel = os.path.relpath(m.path, outer.path)
            self.make_mount_point(os.path.join(outer.host, rel), os.path.isdir(m.pin))
            self.pins.nest(m.pin, outer.pin, rel, outer.host, m.read_only)
            nested |= {m.at, m.at + 1} if m.at >= 0 else set()
            holders.add(outer.at)
        if self.spec.get("engine") == "docker":
            # Docker (25 on) makes all of a `:ro` mount read-only, what is nested in it too:
            # such a pin is made read-only here instead, itself alone.
            for m in mounts:
                if m.at >= 0 and m.at in holders and m.at not in nested and m.read_only:
                    self.pins.make_read_only(m.pin, m.host)
                    create[m.at + 1] = create[m.at + 1].removesuffix(":ro")
        self.spec["create"] = [a for k, a in enumerate(create) if k not in nested]

    def nested_workdir(self, mounts: list[_Pinned]) -> _Pinned | None:
        """The working directory pinned, when it is inside a mount but not mounted itself (it
        was no directory when `create` was made): the runtime would make it as root, through
        whatever links the user put on its way. Made by the user instead, and nested like a
        mount (`at` -1: no `--volume` of its own)."""
        assert self.pins is not None
        workdir = _flag_value(self.spec["create"], "--workdir")
        if workdir is None:
            return None
        path = os.path.normpath(workdir)
        m = _Pinned(-1, "", path, "", False)
        if any(o.path == path for o in mounts) or (outer := _enclosing(m, mounts)) is None:
            return None
        host = os.path.join(outer.host, os.path.relpath(path, outer.path))
        self.make_mount_point(host, True)
        pinned, writable = self.pins.pin(host, own=False)
        return _Pinned(-1, host, path, pinned, outer.read_only or not writable)

    def refuse_image_links(self) -> None:
        """Fails the launch when a symbolic link of the image is on the way to where a host
        path is mounted or to the working directory: the runtime follows it inside the
        container, as root, into whatever is mounted where it leads (a writable volume
        holding a directory its user may not write), and makes the mount point or the
        working directory there. Read from the created container's root file system, which
        nothing else changes before it is initialised (podman) or started (docker)."""
        create = self.spec["create"]
        mounted = {create[i + 1].split(":")[1] for i in range(len(create) - 1)
                   if create[i] == "--volume"}  # fmt: skip
        paths = sorted(mounted)
        if (workdir := _flag_value(create, "--workdir")) is not None:
            paths.append(workdir)
        try:
            links = self.image_links(paths, mounted)
        except _ExecFailed:
            self.remove()
            raise
        if links:
            self.remove()
            path, link = links[0]
            image = self.spec.get("image", "?")
            raise _ExecFailed(
                126,
                f"image {image}: {link} is a symbolic link on the way to {path}, which the "
                "engine would follow as root: refused",
            )

    def image_links(self, paths: list[str], mounted: set[str]) -> list[tuple[str, str]]:
        """Each of `paths` with the image's link on its way (see `_image_link`). Podman mounts
        the container's root file system for reading. Docker has no such command: under
        overlay2 (its default) the container's layer directories are read where `inspect`
        says they are; under another storage driver the file system is exported whole."""
        if self.spec.get("engine") != "docker":
            code, out, err = self.engine("mount", self.name)
            if code != 0:
                raise _ExecFailed(125, f"container {self.name} could not be read: {_last(err)}")
            kind_of = _rootfs_kind(out.strip())
            links = [(p, link) for p in paths if (link := _image_link(kind_of, p, mounted))]
            self.engine("umount", self.name)
            return links
        layers = self.overlay_layers()
        kind_of = _layers_kind(layers) if layers is not None else self.exported_kinds(paths)
        return [(p, link) for p in paths if (link := _image_link(kind_of, p, mounted))]

    def overlay_layers(self) -> list[str] | None:
        """The layer directories of a docker container under overlay2, the uppermost first;
        None under another storage driver."""
        code, out, err = self.engine("container", "inspect", "--format", "{{json .GraphDriver}}",
                                     self.name)  # fmt: skip
        if code != 0:
            raise _ExecFailed(125, f"container {self.name} could not be read: {_last(err)}")
        try:
            driver = json.loads(out) or {}
        except ValueError:
            driver = {}
        data = driver.get("Data") or {}
        # Else (vfs, btrfs, zfs, containerd's snapshotters) the file system is exported.
        if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
            return None
        layers = [str(data["UpperDir"]), *str(data.get("LowerDir") or "").split(":")]
        layers = [d for d in layers if d]
        for d in layers:  # root's: not looked up through a link of anyone's
            try:
                is_dir = stat.S_ISDIR(os.lstat(d).st_mode)
            except OSError as exc:
                is_dir, d = False, f"{d}: {exc.strerror}"
            if not is_dir:
                raise _ExecFailed(125, f"container {self.name} could not be read: {d}")
        return layers

    def exported_kinds(self, paths: list[str]) -> Callable[[str], str]:
        """`_exported_kinds` of the container's `export`."""
        import subprocess
        import tarfile

        proc = subprocess.Popen([self.binary, "export", self.name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env, cwd=self.cwd)  # fmt: skip
        try:
            kind_of = _exported_kinds(proc.stdout, paths)
        except (OSError, tarfile.TarError) as exc:
            proc.kill()
            raise _ExecFailed(125, f"container {self.name} could not be read: {exc}") from None
        finally:
            assert proc.stdout is not None
            proc.stdout.close()
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            proc.wait()
        if proc.returncode != 0:
            raise _ExecFailed(125, f"container {self.name} could not be read: {_last(err)}")
        return kind_of

    def make_mount_point(self, path: str, is_dir: bool) -> None:
        """A missing mount point inside a mounted host directory made by the task's user
        (the engine would make it as root); one the user cannot make fails the launch."""
        if os.path.lexists(path):
            return
        assert self.pins is not None
        make = ["mkdir", "-p", "--", path] if is_dir else ["touch", "--", path]
        why = _run_as(self.spec["owner"], sorted(self.pins.groups), make)
        if why is not None:
            raise _ExecFailed(126, f"cannot make {path} to mount on: {why}")

    def unpin(self) -> None:
        if self.pins is not None:
            self.pins.release()

    def mount_resolved(self, resolved: dict[str, str]) -> None:
        """`create` mounts each made directory from where it resolved when it was checked
        (`make_dirs`), not through the links on its way, which its user may change since."""
        create = self.spec["create"]
        for path, real in resolved.items():
            create[:] = [f"{real}:{path}" if a == f"{path}:{path}" else a for a in create]

    def make_dirs(self) -> dict[str, str]:
        """The directories the container mounts that must exist first (its checkpoint
        directory); one that exists is left as it is. For a task run as a user they are made
        by that user (`mkdir` run with its ids, the leaf 0700): missing parents in its home
        are its own too, never root's, and a link it placed is followed with its rights alone.
        Else the service makes them, 0755. Either way the directory must then be a directory
        of the task's user (of the service's, without one) and no link (see `_own_dir`), and
        so must the directory it resolves to. Returns each one's resolved path."""
        owner = self.spec.get("owner")
        uid = int(owner[0]) if owner else os.geteuid()
        resolved: dict[str, str] = {}
        for path in self.spec.get("make_dirs") or ():
            if not os.path.lexists(path):
                _make_dir(path, owner)
            resolved[path] = _own_resolved(path, uid)
        return resolved

    def create_failure(self, err: str) -> tuple[str, bool]:
        """The one line that says why `create` failed, and whether the image is missing."""
        image = self.spec.get("image", "?")
        line = _last(err).removeprefix("Error: ")
        low = err.lower()
        words = ("image not known", "manifest unknown", "pull", "no such image",
                 "unable to find image", "repository", "name unknown")  # fmt: skip
        if any(w in low for w in words):
            return f"image {image}: not present on this node and could not be pulled ({line})", True
        return f"container for image {image} could not be created: {line}", False

    def watch_oom(self, pid: int) -> None:
        """Finds the container's memory cgroup, whose OOM-kill counter `oom_seen` reads while
        it runs. Under cgroup v1 an eventfd on its memory.oom_control is registered as well:
        the cgroup goes with the container, and v1 counts its kills in no parent, so a kill
        just before the end is known only through the eventfd (which the kernel also signals
        when the cgroup is removed: `end` tells the two apart by the exit). A container
        without a cgroup of its own is in the service's: nothing there is its OOM."""
        if self.spec.get("cgroup_version") == "none":
            return
        try:
            with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                self.oom_cgroup = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
                try:
                    ctl = os.open(os.path.join(self.oom_cgroup, "memory.oom_control"), os.O_RDONLY)
                    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                    with open(os.path.join(self.oom_cgroup, "cgroup.event_control"), "w") as f:
                        f.write(f"{efd} {ctl}")
                    self.oom_fd = efd
                except OSError:
                    pass
                return
            if controllers == "" and self.spec.get("cgroup_version") == "v2":
                self.oom_cgroup = os.path.join("/sys/fs/cgroup", path.lstrip("/"))

    def oom_seen(self) -> bool:
        """Whether the kernel OOM-killed in the container's cgroup (while it still exists)."""
        if not self.oomed and self.oom_cgroup and os.path.isdir(self.oom_cgroup):
            self.oomed = oom_kills(self.oom_cgroup) > 0
        return self.oomed

    def oom_signalled(self) -> bool:
        """The v1 eventfd fired: an OOM, or the cgroup's removal."""
        if self.oom_fd >= 0:
            with contextlib.suppress(OSError):
                if os.eventfd_read(self.oom_fd) > 0:
                    self.signalled = True
        return self.signalled

    def shape(self, pid: int, rate_bit_s: int, log: Any) -> None:
        """Egress shaping of the container's interface (a token bucket, as the CNI bandwidth
        plugin sets): what the container sends is held to the rate; what it receives is not."""
        import subprocess

        burst = max(rate_bit_s // 8 // 100, 16 * 1024)  # 10 ms at the rate, at least 16 KiB
        nsenter = str(self.spec.get("nsenter") or "nsenter")
        tc = str(self.spec.get("tc") or "tc")
        # Written once: the same words a CNI bandwidth plugin would give tc.
        qdisc = f"tbf rate {rate_bit_s}bit burst {burst} latency 50ms".split()
        argv = [nsenter, "-t", str(pid), "-n", tc, "qdisc", "replace", "dev", "eth0", "root"]
        argv += qdisc
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            ok, why = r.returncode == 0, _last(r.stderr)
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, why = False, str(exc)
        if not ok:
            self.remove()
            raise _ExecFailed(125, f"cannot limit the bandwidth of {self.name}: {why}")
        log(f"egress shaped to {rate_bit_s} bit/s (tc tbf on eth0)")

    def signal(self, sig: int, grace_s: float) -> None:
        import subprocess

        if sig == signal.SIGTERM:
            if self.stopper is None:
                # stop: SIGTERM (or the image's stop signal), the grace, then SIGKILL.
                with contextlib.suppress(OSError):
                    self.stopper = subprocess.Popen(
                        [
                            self.binary,
                            "stop",
                            "--time",
                            str(max(0, int(grace_s + 0.999))),
                            self.name,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env=self.env,
                        cwd=self.cwd,
                    )
            return
        self.killed = self.killed or sig == signal.SIGKILL
        self.engine("kill", "--signal", signal_name(sig).removeprefix("SIG"), self.name)

    def end(self, client_code: int) -> tuple[int, bool]:
        """The container's own exit code (a signal's death as -N, like a host task's) and
        whether it was OOM-killed; then it is removed."""
        code, out, _ = self.engine(
            "inspect", "--format", "{{.State.ExitCode}} {{.State.OOMKilled}}", self.name
        )
        words = out.split() if code == 0 else []
        exit_code = int(words[0]) if words and words[0].lstrip("-").isdigit() else client_code
        # A SIGKILL nobody here sent, to a container whose memory cgroup signalled: the OOM
        # killer's (a container that merely ended signals too, but was not SIGKILLed).
        unexplained_kill = bool(words) and exit_code == 128 + signal.SIGKILL and not self.stopper
        oom = (
            (len(words) > 1 and words[1] == "true")
            or self.oom_seen()
            or (unexplained_kill and not self.killed and self.oom_signalled())
        )
        if self.stopper is not None:
            with contextlib.suppress(Exception):
                self.stopper.wait(timeout=5)
        self.remove()
        if 128 < exit_code < 128 + 65:
            exit_code = -(exit_code - 128)
        return exit_code, oom

    def remove(self) -> None:
        # Podman's `rm --force` would first wait out the stop timeout; docker's kills at once.
        at_once = [] if self.spec.get("engine") == "docker" else ["--time", "0"]
        self.engine("rm", "--force", *at_once, self.name)
        self.unpin()


def self_launch_defaults() -> dict[str, Any]:
    """What the attached client of a container runs with: no host cgroup, pinning or rlimit
    of its own (the container has them), in the engine's working directory (`client_launch`),
    not the task's."""
    return {"cgroup": None, "cores": [], "mechanism": "none", "mem_limit_mib": 0, "workdir": None}


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def main(argv: list[str]) -> int:
    task_dir = argv[0]
    sigs = _Signals()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def on_term(signum: int, frame: object) -> None:
        sigs.stops += 1

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the loop via the fd
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The executor starts us with SIGTERM blocked: a stop sent during start-up waits here.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])

    lock_fd = os.open(os.path.join(task_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, f"{os.getpid()} {start_time(os.getpid())}\n".encode(), 0)
    if os.path.exists(os.path.join(task_dir, EXIT)) or os.path.exists(
        os.path.join(task_dir, ABANDONED)
    ):
        return 0  # already run, or given up by the executor: never start it (again)
    launch = read_json(os.path.join(task_dir, LAUNCH))
    if launch is None:
        print(f"no {LAUNCH} in {task_dir}", file=sys.stderr)
        return 2
    return Supervisor(task_dir, launch, wake_r, sigs).run()


# What the fork server sends a supervisor it forked once its pid is answered: the go to run.
GO = b"g"


def fork_server() -> int:
    """`supervisor.py --fork-server`: starts supervisors by forking itself, so a launch costs a
    fork (about a millisecond) instead of a Python interpreter's start (tens of them).

    Reads task directories on stdin, one per line; for each forks a supervisor (its own session,
    output to the task's `supervisor.log`, SIGTERM blocked as `main` expects) and answers
    "PID START" on stdout, or "ERR message". A supervisor runs only once its answer is out
    (`GO`): killed in between, the server leaves none running that the executor does not
    watch. Ends at EOF, that is when the executor closes the pipe or dies; the supervisors it
    forked live on. Children are reaped by the kernel (SIGCHLD ignored): they are watched
    through pidfds or /proc, never waited for by this process.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    requests = sys.stdin.buffer
    replies = sys.stdout.buffer
    for line in requests:
        task_dir = line.decode("utf-8", "surrogateescape").rstrip("\n")
        try:
            # The child waits for `go` until its start time is read: until then its pid
            # cannot have been reused, since it cannot have ended.
            go_r, go_w = os.pipe()
            pid = os.fork()
        except OSError as exc:
            replies.write(f"ERR {exc.strerror or exc}\n".encode())
            replies.flush()
            continue
        if pid == 0:
            _forked_supervisor(task_dir, go_r, go_w)
        os.close(go_r)
        start = start_time(pid)
        try:
            replies.write(f"{pid} {start or 0}\n".encode())
            replies.flush()
            # And it runs the task only once its pid is answered: killed before that, this
            # server leaves the executor without it, and the supervisor it asks for next
            # would wait on the task's lock behind an unwatched one (deaf to a stop).
            os.write(go_w, GO)
        finally:
            os.close(go_w)
    return 0


def _forked_supervisor(task_dir: str, go_r: int, go_w: int) -> None:
    """In a child of the fork server: become a supervisor for `task_dir`. Never returns."""
    code = 3
    try:
        os.close(go_w)
        go = os.read(go_r, 1)  # once the server has read our start time and answered it
        os.close(go_r)
        if go != GO:  # the server died before answering: nobody knows of us
            code = 0
            return
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(os.path.join(task_dir, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        code = main([task_dir])
    except BaseException:  # noqa: BLE001 - whatever happens, it goes to the log, then exit
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--fork-server"]:
        sys.exit(fork_server())
    if sys.argv[1:] == ["--probe-shm"]:
        sys.exit(probe_shm())
    sys.exit(main(sys.argv[1:]))

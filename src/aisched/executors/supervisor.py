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

The task's log, and what a full disk costs it, is `task_log.py`'s. `exit.json` is retried
until it is written: a task's end is never lost to a full disk.

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
kin), `supervisor_pins.py` (a user's host paths, pinned for root's container engine),
`supervisor_shm.py` (a job attempt's private /dev/shm), `supervisor_container.py` (a
container task's engine commands) and `task_log.py` (the task's capped log). What is left
here is the supervisor's own flow: the child, its watch and its end, and the fork server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import select
import signal
import sys
import time

# Without importing typing (start-up time counts): mypy treats this name as always true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

if not __package__:
    # Run as a script (with `-I -S`), the package is not on the import path: the directory
    # that holds it is appended (never prepended: nothing may shadow the standard library).
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from aisched.executors.processes import (  # noqa: E402
    MIB,
    become_subreaper,
    descendants,
    describe_code,
    kill_leftovers,
    kill_quietly,
    killpg_quietly,
    oom_kills,
    remove_task_cgroups,
    signal_cgroup,
    start_time,
    tree_memory_bytes,
)
from aisched.executors.supervisor_container import Container  # noqa: E402
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
    NOT_FOUND,
    STARTED,
    STOP,
    ExecFailed,
    become,
    note,
    own_checkpoint_dir,
    read_json,
    write_json_atomic,
)
from aisched.executors.task_log import LOG_MAX_BYTES, LOG_MAX_FILES, CappedLog  # noqa: E402

# How often memory is checked (group RSS under an rlimit, the OOM counter under a cgroup).
MEMORY_CHECK_S = 0.5
# Words a program prints when an allocation fails, in lower case: under an rlimit that is how
# a task that went over its limit usually ends (malloc fails, nothing is killed). Python, the
# C library (ENOMEM), C++, PyTorch's CPU allocator, Rust, Go and coreutils or busybox.
ALLOCATION_FAILURES = (
    b"memoryerror",
    b"cannot allocate memory",
    b"std::bad_alloc",
    b"can't allocate memory",
    b"memory allocation of",
    b"out of memory",
    b"memory exhausted",
)
# A GPU's memory, which no rlimit bounds: a line saying it ran out is not about the limit
# (PyTorch's `torch.OutOfMemoryError: CUDA out of memory`).
GPU_OUT_OF_MEMORY = b"cuda out of memory"
# How much output is copied per read of the pipe, and per pass of the watch loop at most (it
# goes back to its stops and timers in between, however fast the task writes); the pipe's size
# asked for (fewer, larger reads for a task that writes a lot); how often a write
# of exit.json that failed (ENOSPC, EIO) is tried again.
PIPE_READ = 1 << 20
COPY_PER_PASS = 4 << 20
PIPE_SIZE = 1 << 20
EXIT_RETRY_S = 1.0


# --- the supervisor --------------------------------------------------------------------------


class _Signals:
    """What the signal handlers saw; the main loop acts on it (handlers only set fields)."""

    __slots__ = ("stops",)

    def __init__(self) -> None:
        self.stops = 0


def _exec_failure(stage: str, exc: BaseException, command: list[str], workdir: str | None) -> str:
    """`CODE\\nMESSAGE` for a child that could not exec (127: not found, 126: cannot run)."""
    name = command[0] if command else "(empty command)"
    if isinstance(exc, ExecFailed):
        return f"{exc.code}\n{exc.message}"
    if stage == "workdir":
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"126\ncannot run {name}: working directory {workdir}: {why}"
    if stage == "exec" and isinstance(exc, FileNotFoundError):
        what = "no such file" if "/" in name else "command not found"
        return f"{NOT_FOUND}\n{what}: {name}"
    if stage == "exec" and isinstance(exc, PermissionError):
        return f"126\ncannot run {name}: permission denied"
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
    return f"126\ncannot run {name}: {stage}: {why}"


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
            # As the user: a directory another user placed (or could swap) is refused.
            own_checkpoint_dir(path, os.geteuid())
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
                    note(f"cannot write {EXIT}: the task directory is gone")
                    break
                note(f"cannot write {EXIT} ({exc.strerror or exc}); retrying")
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
        self.pin_to_task_cores()
        if self.container is None:  # a container's processes are its engine's to hold
            become_subreaper()
        try:
            self.spawn()
        except ExecFailed as failed:
            self.log(failed.message)
            return self.finish(failed.kind, failed.code, failed.message)
        return self.watch()

    def pin_to_task_cores(self) -> None:
        """Run on the task's cores, as its child will: copying the task's output costs this
        process CPU in proportion to what the task writes, which must come out of the task's
        cores, never another task's. Not by joining the task's cgroups: the memory one would
        let the OOM killer take the supervisor, the pids one would count its forks against the
        task, and it removes them when the task ends. The task cannot widen this affinity: the
        supervisor is not its user's (or, run as the task's own user, it bounds nothing)."""
        cores = self.launch.get("cores")
        if cores:
            with contextlib.suppress(OSError):  # the child's own pinning then says why
                os.sched_setaffinity(0, [int(c) for c in cores])

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
        if os.geteuid() == 0:
            # Only as root, whom no pipe allowance binds: another user's larger pipes would
            # count against the allowance that user's own pipes (its tasks') come out of.
            with contextlib.suppress(OSError):
                fcntl.fcntl(out_r, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
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
            # Only exec's own "not found" gives NOT_FOUND here (the checks before it give 126).
            raise ExecFailed(
                int(code), message, "unrunnable" if int(code) == NOT_FOUND else "exited"
            )
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
            raise ExecFailed(
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
        # What left the task's group (a daemon that called setsid) as well: by its cgroup, and
        # under this supervisor, its subreaper, where it stays however it left.
        if self.cgroup:
            signal_cgroup(self.cgroup, sig, skip_group=self.child)
        for p in descendants(os.getpid()):
            if p.pgid != self.child:  # the group had it: a second SIGTERM would reach it twice
                kill_quietly(p.pid, sig)

    def memory_exceeded(self) -> str | None:
        """A message when the task went over its memory limit and must be killed."""
        if self.container is not None:
            return self.oom_message() if self.container.oom_seen() else None
        if self.mechanism == "rlimit" and self.limit_mib:
            # Every process of the task, as it is ours, and the memory files it holds.
            held = tree_memory_bytes(os.getpid())
            if held > self.limit_mib * MIB:
                return (
                    f"killed: exceeded its memory limit of {self.limit_mib} MiB "
                    f"(its processes held {held // MIB} MiB)"
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
        # Whether a process of ours may have ended: at first, then after each signal (the
        # wakeup fd: every SIGCHLD, a stop) or timeout. A pass that only copied output skips
        # the wait calls, which a task writing without pause would otherwise pay per read.
        check_children = True
        while True:
            # 1. Exited? WNOWAIT keeps the zombie, so its pid (and group id) stay the task's
            #    until the group has been killed. Orphans given to us are reaped meanwhile.
            if check_children:
                if os.waitid(os.P_PID, self.child, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    break
                if self.container is None:
                    self.reap_orphans()
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
            check_children = not ready or self.wake_r in ready
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 512)
            if self.out_r in ready:
                self.copy_output()
        return self.reap(seen_stops > 0, killed_after_grace, oom)

    def reap_orphans(self) -> None:
        """Reap the task's processes that ended after their parent did (this supervisor, their
        subreaper, was given them): a zombie holds its pid until it is reaped."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == self.child:  # the task's own end: `watch` reads it
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def copy_output(self, *, drain: bool = False) -> None:
        """Copy what the task wrote into its log: what the pipe holds now, up to
        `COPY_PER_PASS`, or (`drain`) all there is now."""
        copied = 0
        while self.out_r >= 0 and (drain or copied < COPY_PER_PASS):
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
            copied += len(data)

    def reap(self, stopped: bool, killed_after_grace: bool, oom: str | None) -> int:
        logged_oom = oom is not None
        # Orphans of the task first: the leader's zombie still holds the group id. (A
        # container's processes are not ours: `end` removes the container.)
        if self.container is None:
            self.kill_task(signal.SIGKILL)
        _, status = os.waitpid(self.child, 0)
        code = os.waitstatus_to_exitcode(status)
        unknown = ""  # why the task's end is unknown (see `Container.end`)
        if self.container is not None:
            ended, oom_killed, unknown = self.container.end(code)
            code = code if ended is None else ended
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
        if unknown:
            self.log(unknown)
            if stopped:  # asked for, and done: how it ended matters no more than a kill's
                return self.finish("stopped", None, f"stopped: {unknown}")
            return self.finish("lost", None, unknown)
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
        lines = [ln for ln in tail.lower().splitlines() if GPU_OUT_OF_MEMORY not in ln]
        if any(word in ln for ln in lines for word in ALLOCATION_FAILURES):
            return (
                f"failed to allocate memory beyond its limit of {self.limit_mib} MiB "
                "(data-segment rlimit)"
            )
        return None


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

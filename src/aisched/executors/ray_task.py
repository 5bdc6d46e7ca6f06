"""One task's process on the Ray node the core chose: `TaskRunner`, held by that node's agent.

The node's agent (`ray_agent.py`, one long-lived Ray actor per node) makes a `TaskRunner` per
task once the task's reservation (its gang's placement group) is in place. The runner starts
the command as its own process group (stdout and stderr appended to the task's log), watches
it, and on `stop` runs the same SIGTERM, grace, SIGKILL sequence as the local executor's
supervisor, with the same exit kinds and messages.

A task with GPUs is watched on its node by the GPU-memory watchdog (`gpu_watchdog.py`, NVML where
the node has it; off, saying why, where it has not), with the same judgement and the same lines
in the task's log as the local executor: above its declared GPU memory, a task is reported once
in its log, or stopped (a STOPPED exit, after SIGTERM). The executor fetches the readings and
the lines for the scheduler's log with `gpu_memory`.

The runner pins a task to the cores in `spec["cores"]` (chosen by its node's agent): a host
task by CPU affinity, a container by its cpuset. A container outlives the process that drives
it, so each one gets a reaper: a small process of its own session that removes the container
if the agent's process dies (killed, or its node shut down) before the task's end did.

A task's end is also written, whole (`task_files.write_json_atomic`), to its exit record beside
its log (`exit_record_path`: `LOG.exit.json`, on the data directory's shared storage), with the
task's key and launch id, so a scheduler that restarts after the agent's memory is gone (its
node, or the whole Ray cluster, went down) still finds how the task ended instead of running it
again; as the local supervisor's `exit.json`, it is retried until written.

Invariants: the command is started at most once per runner, and never for a task whose exit
record exists (it ran and ended before); the exit record is written once the whole process
group has been killed, so a record means the task has ended; `wait` returns exactly one result,
after the whole process group has been killed and its record written; the process gets exactly
the environment it was given (not the Ray worker's: Ray's own CUDA_VISIBLE_DEVICES must not
leak into it). The process is started from a thread that lives until it ends, with a
parent-death signal, so a task whose agent (or node) dies is killed with it instead of running
on unseen.

Standard library and aisched's standard-library modules only (NVML is imported, on the node,
only when the watchdog looks for it): it runs inside Ray worker processes, which import this
module by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from aisched.executors import container as ctr
from aisched.executors import (
    processes,
    ray_limits,
    ray_shm,
    supervisor_container,
    task_files,
    task_log,
)
from aisched.executors.base import LaunchError, TaskKey
from aisched.executors.cgroups import MemoryControlError
from aisched.executors.gpu_walls import GpuWallError, walled_env
from aisched.executors.gpu_watchdog import (
    GPU_CHECK_INTERVAL_S,
    GpuMemoryWatchdog,
    TaskGpuMemory,
    WatchedTask,
    over_limit,
    task_pids,
)
from aisched.executors.runas import account, account_env
from aisched.model.job import ContainerSpec, NetworkMode, Volume

PR_SET_PDEATHSIG = 1
# Made on the task's node: the watchdog of its GPU memory (`GpuMemoryWatchdog.with_nvml`, its
# action bound), or, in tests, one reading injected GPU memory.
MakeWatchdog = Callable[[], GpuMemoryWatchdog]

# The result of a task: {"kind": "exited"|"stopped", "exit_code": int|None, "message": str,
# "finished_at": float, "gpu_reports": [str]}; the kinds are those of `ExitKind`, and
# gpu_reports the watchdog's lines for the scheduler's log that `gpu_memory` did not hand out.
Result = dict[str, Any]

# A write of the exit record that failed (a full disk) is tried again this often.
EXIT_RETRY_S = 1.0


def exit_record_path(log_path: str) -> str:
    """Where the task whose log is `log_path` records its end (see the module docstring)."""
    return f"{log_path}.exit.json"


def recorded_exit(path: str, key: TaskKey, launch_id: str | None) -> Result | None:
    """The end recorded at `path` if it is this task's: its key, and its launch id when both
    sides have one (a record of another task or attempt is never taken as this one's)."""
    rec = task_files.read_json(path)
    if rec is None or rec.get("key") != [key[0], key[1], key[2]]:
        return None
    if launch_id and rec.get("launch") and rec.get("launch") != launch_id:
        return None
    return rec


def _describe(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by signal {-code} ({name})"
    return f"exited with code {code}"


def _account_here(user: str | None, uid: int | None = None) -> dict[str, Any] | None:
    """The account to start a task of `user` (submitted by `uid`) as, on this node: switched
    to when this worker is root, and only where the name is that uid here too; a worker that
    is not root runs only its own user's tasks and refuses the others (never runs them as
    itself)."""
    if user is None:
        return None
    if os.geteuid() == 0:
        return account(user, uid)
    me = pwd.getpwuid(os.geteuid()).pw_name
    if user != me:
        raise LaunchError(
            f"this Ray worker runs as {me} and cannot start a task as {user}; "
            "run the Ray workers as root to run each user's tasks as that user"
        )
    return None


def _as_user_setup(
    acct: dict[str, Any],
    workdir: str | None,
    checkpoint_dir: str | None,
    shm: ray_shm.TaskShm | None = None,
) -> Callable[[], None]:
    """What the child does to become the task's user (its private /dev/shm entered first, as
    root), and then as that user, before exec."""

    def setup() -> None:
        ray_shm.entered(shm)
        task_files.become(acct)
        _die_with_parent()
        if checkpoint_dir:
            os.makedirs(checkpoint_dir, mode=0o700, exist_ok=True)
            # As the user: a directory another user placed (or could swap) is refused.
            task_files.own_checkpoint_dir(checkpoint_dir, int(acct["uid"]))
        if workdir:
            os.chdir(workdir)

    return setup


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it (alive as long as the
    agent is) goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _pinned(cores: tuple[int, ...], then: Callable[[], None]) -> Callable[[], None]:
    """A preexec_fn that pins the child to `cores` (none: unpinned), then runs `then`."""

    def setup() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        then()

    return setup


# Run as `python -I -S -c REAPER AGENT_PID ENGINE ARGS...`: forks off the reaper, which prints
# its pid and, once the agent's process is gone, runs `ENGINE ARGS...` (the container's
# removal). Not a child of the agent: Ray kills a dead worker's children, and the reaper must
# outlive it. The runner kills it (SIGTERM) when the task ended normally.
REAPER = """
import os, select, subprocess, sys
pid, argv = int(sys.argv[1]), sys.argv[2:]
if os.fork():
    os._exit(0)
os.setsid()
print(os.getpid(), flush=True)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
try:
    fd = os.pidfd_open(pid)
    select.select([fd], [], [])
except ProcessLookupError:
    pass
subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
"""


_ENGINES: list[ctr.Engine] = []


class Latch:
    """A one-shot event (set once, never cleared) that also calls back whoever asked with
    `then`, once set: the agent's event loop awaits a runner's start and end through it,
    without a thread of its own per task."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] | None = []  # None: set, called back

    def set(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks or [], None
        for callback in callbacks:
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def then(self, callback: Callable[[], None]) -> None:
        """`callback()` once set: at once if it is (in this thread), else in the thread that
        sets it, so it must be short and must not raise."""
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        callback()


def _node_engine() -> ctr.Engine:
    """This node's container engine, probed once per worker process."""
    if not _ENGINES:
        _ENGINES.append(ctr.detect_engine())
    return _ENGINES[0]


class TaskRunner:
    """One task's process. `spec` keys: command, env, workdir, log_path, grace_period_s, and
    for the GPU-memory watchdog (all optional): key ([job, attempt, task]), gpus, gpu_mem_mib
    (declared, over all its GPUs; 0: none) and gpu_check_s. `gpu_watchdog` makes the watchdog
    on the node; None: the task's GPU memory is not watched."""

    def __init__(self, spec: dict[str, Any], gpu_watchdog: MakeWatchdog | None = None) -> None:
        self.spec = spec
        self.make_watchdog = gpu_watchdog
        self.gpu_state: str | None = None  # the watchdog's state, once it has started
        self.gpu_usage: TaskGpuMemory | None = None  # its last reading
        self.gpu_reports: list[str] = []  # lines for the scheduler's log, not fetched yet
        self.lock = threading.Lock()
        self.started = Latch()
        self.done = Latch()
        self.proc: subprocess.Popen[bytes] | None = None
        self.result: Result | None = None
        self.start_error: Result | None = None
        self.begun = False  # its start thread was made
        self.stop_requested = False
        self.killed_after_grace = False
        self.kill_at: float | None = None
        self.log_fd = -1
        self.out: task_log.CappedLog | None = None  # the task's log, capped and rotated
        self.out_lock = threading.Lock()  # the output copier and aisched's own lines
        self.copier: threading.Thread | None = None
        self.grace_s = float(spec.get("grace_period_s") or 0.0)
        # A task with an image: its container on this node, driven as the local supervisor
        # drives one (create, init, shape, attach; stop, kill, end).
        self.container: supervisor_container.Container | None = None
        self.reaper = 0  # the pid of the container's reaper, while it has one
        # Its exit record exists already (it ended before this runner), or must not be written
        # (its directory is not root's alone).
        self.recorded = False
        self.cores = tuple(int(c) for c in spec.get("cores") or ())
        self.cgroups: ray_limits.TaskCgroups | None = None  # a host task's, once made
        self.shm: ray_shm.TaskShm | None = None  # a user's host task's hold on its /dev/shm

    # --- called by the executor, through the agent ------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start the command (once) and wait until it is started; `start_result`."""
        self.begin()
        self.started.wait()
        return self.start_result()

    def begin(self) -> None:
        """Start the command (once) without waiting: `started` is set once it is started, or
        could not be. The thread that starts it lives until it ends (see the module
        docstring)."""
        with self.lock:
            if self.begun:
                return
            self.begun = True
        threading.Thread(target=self._run, name="aisched-task", daemon=True).start()

    def start_result(self) -> dict[str, Any]:
        """Once `started` is set: {"pid"}, or {"exit": Result} when the command could not be
        executed (127: not found, 126: cannot run), like the local executor."""
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

    def gpu_memory(self) -> dict[str, Any]:
        """What the GPU-memory watchdog knows: {"state": why it is on or off (None: not
        started), "usage": its last `TaskGpuMemory` (None: no reading), "reports": the lines
        for the scheduler's log since the last call}."""
        with self.lock:
            reports, self.gpu_reports = self.gpu_reports, []
            return {"state": self.gpu_state, "usage": self.gpu_usage, "reports": reports}

    def stop(self, grace_period_s: float) -> None:
        """SIGTERM to the task's process group now, SIGKILL after the grace period (a later
        stop may shorten the grace, never extend it). Idempotent."""
        with self.lock:
            if self.done.is_set():
                return
            first = not self.stop_requested
            self.stop_requested = True
            self.grace_s = max(0.0, grace_period_s)
            deadline = time.monotonic() + max(0.0, grace_period_s)
            self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)
            proc = self.proc
        if proc is None:  # not started yet: the start sees stop_requested and gives up
            return
        if first:
            self._log(f"stop requested: SIGTERM, then SIGKILL after {max(0.0, grace_period_s):g} s")
            self._signal(proc, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(proc,), daemon=True).start()

    # --- inside the agent -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._spawn()
        finally:
            self.started.set()
        if self.proc is None:
            ray_limits.removed(self.cgroups)
            ray_shm.release(self.shm)
            self._finish(self.start_error)
            return
        if self.make_watchdog is not None and self.spec.get("gpus"):
            threading.Thread(
                target=self._watch_gpu_memory, args=(self.proc,), name="aisched-gpu", daemon=True
            ).start()
        code = self.proc.wait()
        oom, unknown = False, ""
        if self.container is not None:
            if self.copier is not None:  # the rest of its output (a leftover child may hold
                self.copier.join(2.0)  # the pipe open: it does not hold up the task's end)
            ended, oom, unknown = self.container.end(code)
            code = code if ended is None else ended
            if self.reaper > 0:  # removed by its end: nothing left to reap
                with contextlib.suppress(OSError):
                    os.kill(self.reaper, signal.SIGTERM)
        else:
            self._signal(self.proc, signal.SIGKILL)  # whatever the task left in its group
            oom = self.cgroups is not None and self.cgroups.oom_killed()
            ray_limits.removed(self.cgroups)  # and in its cgroups (a child that left its group)
            ray_shm.release(self.shm)  # none of its processes is left to hold it
            if self.copier is not None:
                self.copier.join(2.0)
        with self.lock:
            stopped, after_grace = self.stop_requested, self.killed_after_grace
        if unknown:
            self._log(unknown)
            kind = "stopped" if stopped else "lost"
            msg = f"stopped: {unknown}" if stopped else unknown
            self._finish({"kind": kind, "exit_code": None, "message": msg})
        elif oom and code != 0:
            limit = int(
                self.spec.get("mem_limit_mib")
                or (self.spec.get("container") or {}).get("mem_limit_mib")
                or 0
            )
            msg = f"killed: exceeded its memory limit of {limit} MiB"
            self._log(msg)
            self._finish({"kind": "oom", "exit_code": code, "message": msg})
        elif stopped and after_grace:
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
        key = self._key()
        log_dir = os.path.dirname(spec["log_path"]) or "."
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as exc:
            msg = f"cannot open the log {spec['log_path']}: {exc.strerror}"
            self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
            return
        if os.geteuid() == 0 and (other := task_files.not_roots_alone(log_dir)) is not None:
            msg = (
                f"cannot open the log {spec['log_path']}: {other} is not root's alone on this "
                "node (another user could put a link where root writes): refused"
            )
            self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
            self.recorded = True  # nor is its exit record written there
            return
        if key is not None:
            ended = recorded_exit(exit_record_path(spec["log_path"]), key, spec.get("launch"))
            if ended is not None:  # it ran and ended before (under an agent now gone): never again
                self.recorded = True
                self.start_error = {
                    k: ended.get(k) for k in ("kind", "exit_code", "message", "finished_at")
                }
                return
        try:
            # Capped and rotated as on one machine (the supervisor's CappedLog): the task's
            # output goes through a pipe that `_copy_output` drains into it.
            self.out = task_log.CappedLog(
                spec["log_path"],
                int(spec.get("log_max_bytes", task_log.LOG_MAX_BYTES)),
                int(spec.get("log_max_files", task_log.LOG_MAX_FILES)),
            )
            self.log_fd = self.out.fd
        except OSError as exc:
            msg = f"cannot open the log {spec['log_path']}: {exc.strerror}"
            self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
            return
        env = {str(k): str(v) for k, v in spec["env"].items()}
        try:
            acct = _account_here(spec.get("user"), spec.get("uid"))
        except LaunchError as exc:
            self.start_error = {"kind": "exited", "exit_code": 126, "message": str(exc)}
            return
        workdir = spec.get("workdir") or None
        if not spec.get("container"):
            # Its memory, processes and cores bounded in cgroups of its own (ray_limits).
            uid = acct["uid"] if acct is not None else os.geteuid()
            try:
                self.cgroups = ray_limits.make_task_cgroups(spec, uid, self.cores)
            except (OSError, MemoryControlError, GpuWallError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                msg = f"cannot make the task's cgroups on this node: {why}"
                self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
                return
            if self.cgroups.note:
                self._log(self.cgroups.note)
            if self.cgroups.gpu_note:
                self._log(f"on this node: {self.cgroups.gpu_note}")
            if self.cgroups.walled:  # CUDA numbers what it can open from 0
                env = walled_env(env, [int(g) for g in spec.get("gpus") or ()])
            if acct is not None:
                held = ray_shm.join(spec, acct)
                if isinstance(held, str):
                    self._log(held)
                else:
                    self.shm = held
        as_user: dict[str, Any] = {
            "cwd": workdir,
            "preexec_fn": _pinned(
                self.cores, ray_limits.joined_then(self.cgroups, _die_with_parent)
            ),
        }
        if acct is not None:
            env = account_env(env, acct)
            os.fchown(self.log_fd, acct["uid"], acct["gid"])
            # The child joins its cgroups as root, then becomes the user; the task's own
            # directories are entered (and its checkpoint directory made) after, as the user.
            as_user = {
                "umask": 0o022,
                "preexec_fn": _pinned(
                    self.cores,
                    ray_limits.joined_then(
                        self.cgroups,
                        _as_user_setup(acct, workdir, env.get("AISCHED_CHECKPOINT_DIR"), self.shm),
                    ),
                ),
            }
        with self.lock:
            if self.stop_requested:
                msg = "stopped before it started"
                self.start_error = {"kind": "stopped", "exit_code": None, "message": msg}
                return
            if spec.get("container"):
                # The engine's client runs as this worker; the container as the task's user.
                started = self._container_start(env, user=acct)
                if started is None or self.container is None:
                    return
                command, env = started, dict(self.container.env)
                as_user = {"cwd": self.container.cwd, "preexec_fn": _die_with_parent}
            out_r, out_w = os.pipe()
            try:
                self.proc = subprocess.Popen(
                    command,
                    env=env,
                    **as_user,
                    stdin=subprocess.DEVNULL,
                    stdout=out_w,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self.copier = threading.Thread(
                    target=self._copy_output, args=(out_r,), name="aisched-task-output", daemon=True
                )
                self.copier.start()
                return
            except subprocess.SubprocessError:  # preexec_fn failed: a directory, as the user
                code, msg = (
                    126,
                    (
                        f"cannot run {name} as {spec.get('user')}: its working directory "
                        f"{workdir} or checkpoint directory cannot be entered or made as that "
                        "user, or the checkpoint directory is not that user's alone"
                    ),
                )
            except FileNotFoundError as exc:
                workdir = spec.get("workdir")
                if workdir and not os.path.isdir(workdir):
                    why = exc.strerror or "not found"
                    code, msg = 126, f"cannot run {name}: working directory {workdir}: {why}"
                else:
                    what = "no such file" if "/" in name else "command not found"
                    code, msg = task_files.NOT_FOUND, f"{what}: {name}"
            except PermissionError:
                code, msg = 126, f"cannot run {name}: permission denied"
            except OSError as exc:
                code, msg = 126, f"cannot run {name}: {exc.strerror or exc}"
            finally:
                os.close(out_w)
                if self.proc is None:
                    os.close(out_r)
        self._log(msg)
        kind = "unrunnable" if code == task_files.NOT_FOUND else "exited"  # as the supervisor
        self.start_error = {"kind": kind, "exit_code": code, "message": msg}

    def _container_start(
        self, env: dict[str, str], user: dict[str, Any] | None
    ) -> list[str] | None:
        """Creates and prepares the task's container on this node, with the task's `env`, as
        `user` (an account: name, uid, gid, groups, home; None: the image's default user);
        the command of its attached client, or None with `start_error` set (one line, naming
        the image)."""
        spec = self.spec
        c = spec["container"]
        image = str(c["image"])
        job_id, attempt, task = spec["key"]
        # Resolved once: what is checked is what is mounted (see ctr.resolve_volumes).
        given = ContainerSpec(
            image,
            network=NetworkMode(c["network"]),
            bandwidth_bit_s=c.get("bandwidth_bit_s"),
            shm_mib=c.get("shm_mib"),
            volumes=tuple(Volume(str(h), str(p), bool(ro)) for h, p, ro in c["volumes"]),
            workdir_in_image=bool(c.get("workdir_in_image", False)),
        )
        cspec = ctr.resolve_volumes(given)
        if user is not None:
            # As on one machine: the engine mounts with its own privileges, so a user's job
            # mounts only what that user could read on this node.
            why = ctr.mount_refusal(
                str(user["name"]),
                given,
                cspec,
                spec.get("workdir"),
                env.get("AISCHED_CHECKPOINT_DIR"),
            )
            if why is not None:
                msg = f"task {job_id}/{attempt}/{task}: {why}"
                self._log(msg)
                self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
                return None
        try:
            engine = _node_engine()
        except ctr.EngineError as e:
            msg = f"image {image}: container tasks cannot run on this node: {e}"
            self._log(msg)
            self.start_error = {"kind": "exited", "exit_code": 125, "message": msg}
            return None
        parent = None
        if engine.takes_cgroup_parent:
            try:
                uid = int(user["uid"]) if user is not None else os.geteuid()
                parent = ray_limits.container_parent(spec, uid)
            except (OSError, MemoryControlError) as exc:
                cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                msg = f"image {image}: cannot make its user's pids cgroup on this node: {cause}"
                self._log(msg)
                self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
                return None
        env_file = f"{spec['log_path']}.container.env"
        t = ctr.ContainerTask(
            instance=str(c["instance"]),
            job_id=str(job_id),
            attempt=int(attempt),
            task=str(task),
            command=tuple(str(w) for w in spec["command"]),
            env=env,
            workdir=spec.get("workdir"),
            cores=self.cores,
            milli_cpu=int(c.get("milli_cpu") or 0),
            mem_limit_mib=int(c.get("mem_limit_mib") or 0),
            gpus=tuple(int(g) for g in spec.get("gpus") or ()),
            checkpoint_dir=env.get("AISCHED_CHECKPOINT_DIR"),
            env_file=env_file,
            user=user,
            cgroup_parent=parent,
        )
        try:
            text = ctr.env_file_text(ctr.task_env(cspec, t, engine))
            create = ctr.create_args(cspec, t, engine)
        except ctr.ContainerArgsError as e:
            msg = f"task {job_id}/{attempt}/{task}: {e}"
            self._log(msg)
            self.start_error = {"kind": "exited", "exit_code": 126, "message": msg}
            return None
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        name = ctr.container_name(t.instance, t.job_id, t.attempt, t.task)
        engine_dir = f"{spec['log_path']}.engine"  # conmon leaves files where it runs
        os.makedirs(engine_dir, mode=0o700, exist_ok=True)
        self.container = supervisor_container.Container(
            {
                "binary": engine.binary,
                "engine": engine.name,
                "name": name,
                "image": image,
                "create": create,
                "start": ctr.start_args(engine, name),
                "engine_env": ctr.engine_env(os.environ),
                # As the local executor's (supervisor_container.Container): "none" without a
                # cgroup.
                "cgroup_version": engine.cgroup_version if engine.cgroup_limits else "none",
                "pin_cores": [] if engine.cgroup_limits else list(t.cores),
                "rlimit_data": 0 if engine.cgroup_limits else t.mem_limit_mib << 20,
                "notice": ctr.unapplied_limits(t, engine),
                "bandwidth_bit_s": c.get("bandwidth_bit_s"),
                "make_dirs": [t.checkpoint_dir] if t.checkpoint_dir else [],
                "owner": None if user is None else [int(user["uid"]), int(user["gid"])],
                "owner_groups": [] if user is None else [int(g) for g in user["groups"]],
                "nsenter": shutil.which("nsenter", path=ctr.SYSTEM_PATH) or "nsenter",
                "tc": shutil.which("tc", path=ctr.SYSTEM_PATH) or "tc",
            },
            cwd=engine_dir,
        )
        try:
            launch = self.container.prepare(self._log)
        except task_files.ExecFailed as failed:
            self._log(failed.message)
            self.start_error = {
                "kind": failed.kind,
                "exit_code": failed.code,
                "message": failed.message,
            }
            self.container = None
            return None
        self.reaper = self._start_reaper(engine, name)
        return [str(w) for w in launch["command"]]

    def _start_reaper(self, engine: ctr.Engine, name: str) -> int:
        """The pid of the container's reaper (see REAPER); 0 if it cannot start (the task
        runs; only an agent's death would then leave its container behind)."""
        assert self.container is not None
        at_once = [] if engine.name == "docker" else ["--time", "0"]
        argv = [sys.executable, "-I", "-S", "-c", REAPER, str(os.getpid()), engine.binary]
        argv += ["rm", "--force", *at_once, name]
        try:
            r = subprocess.run(
                argv,
                env=self.container.env,
                cwd=self.container.cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            return int(r.stdout.strip())
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            self._log(f"no reaper for container {name}: {exc}")
            return 0

    def _watch_gpu_memory(self, proc: subprocess.Popen[bytes]) -> None:
        """Until the task ends: read its GPU memory every gpu_check_s, and report or stop it
        when above what it declared (`over_limit`, as the local executor does)."""
        assert self.make_watchdog is not None
        spec = self.spec
        try:
            wd = self.make_watchdog()
        except Exception as exc:  # a node whose NVML misbehaves: the task runs unwatched
            with self.lock:
                self.gpu_state = f"inactive: {type(exc).__name__}: {exc}"
            return
        with self.lock:
            self.gpu_state = wd.state.reason
        if not wd.active:
            return
        job, attempt, task = spec.get("key") or ("?", 0, "?")
        key: TaskKey = (str(job), int(attempt), str(task))
        gpus = tuple(int(g) for g in spec["gpus"])
        limit = int(spec.get("gpu_mem_mib") or 0)
        every_s = float(spec.get("gpu_check_s") or GPU_CHECK_INTERVAL_S)
        reported: set[TaskKey] = set()
        while not self.done.is_set():
            try:
                pids = task_pids(proc.pid, processes.all_procs())
                usage = wd.measure([WatchedTask(key, gpus, limit, pids)])
            except Exception as exc:  # one bad reading must not end the watch
                self._log(f"GPU-memory watchdog: cannot read: {exc}")
                usage = []
            actions = over_limit(usage, wd.action, reported)
            with self.lock:
                if self.result is not None:
                    return  # ended while being read
                self.gpu_usage = usage[0] if usage else None
                self.gpu_reports.extend(a.service_log for a in actions)
            for a in actions:
                if a.task_log is not None:
                    self._log(a.task_log)
                if a.stop and not self.stop_requested:  # once: a stop is under way
                    self.stop(float(spec.get("grace_period_s") or 0.0))
            self.done.wait(every_s)

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
        if self.container is not None:
            # Through the engine: the attached client ends when the container does.
            self.container.signal(sig, self.grace_s)
            return
        # The group id is the leader's pid, which stays ours until the leader is reaped.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def _log(self, line: str) -> None:
        with self.out_lock:
            if self.out is not None:
                self.out.write(f"aisched: {line}\n".encode())

    def _copy_output(self, fd: int) -> None:
        """The task's stdout and stderr into its capped log, until every writer closed them."""
        try:
            while chunk := os.read(fd, 1 << 16):
                with self.out_lock:
                    if self.out is not None:
                        self.out.write(chunk)
        finally:
            os.close(fd)

    def _finish(self, result: Result | None) -> None:
        assert result is not None
        with self.lock:
            # The watchdog's lines not fetched yet go with the result, so none is lost when
            # the task ends (is stopped) before the executor asks again.
            finished_at = result.get("finished_at") or time.time()
            result = {**result, "finished_at": finished_at, "gpu_reports": self.gpu_reports}
            self.gpu_reports = []
            self.result = result
        with self.out_lock:
            if self.out is not None:
                with contextlib.suppress(OSError):
                    os.close(self.out.fd)
                self.out = None
            self.log_fd = -1
        if not self.recorded:
            self._record(result)
        self.done.set()

    def _key(self) -> TaskKey | None:
        key = self.spec.get("key")
        return None if not key else (str(key[0]), int(key[1]), str(key[2]))

    def _record(self, result: Result) -> None:
        """Writes the task's exit record (see the module docstring): retried until written, as
        the local supervisor's exit.json, unless its directory is gone (no one will read it)."""
        key = self._key()
        if key is None:
            return
        path = exit_record_path(self.spec["log_path"])
        record = {k: result.get(k) for k in ("kind", "exit_code", "message", "finished_at")}
        record |= {"key": list(key), "launch": self.spec.get("launch")}
        while True:
            try:
                task_files.write_json_atomic(path, record)
                return
            except OSError as exc:
                if not os.path.isdir(os.path.dirname(path) or "."):
                    return
                why = exc.strerror or exc
                print(f"aisched: cannot write {path} ({why}); retrying", file=sys.stderr)
                with contextlib.suppress(OSError):
                    os.unlink(f"{path}.tmp{os.getpid()}")
                time.sleep(EXIT_RETRY_S)

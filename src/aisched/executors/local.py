"""The local executor: tasks as processes on this machine, each under its own supervisor.

`launch` writes the request to `<state_dir>/<job>/<attempt>/<task>/launch.json`, creates the
task's memory cgroup (when that is the mechanism), and starts `supervisor.py` in a new session
(forked by a warm fork server, `forkserver.py`, or else spawned as a new interpreter);
a task whose job names an image gets, instead of a host cgroup, a container that its
supervisor creates and attaches to (`container.py` builds its command line);
the supervisor starts the task, enforces its limits, runs the SIGTERM-grace-SIGKILL of a stop,
and records the end in `exit.json` (see `supervisor.py`). One watcher thread waits on a pidfd
per supervisor (or, where pidfds are missing, polls every 0.1 s) and turns each supervisor's
end into one `TaskExited`: the recorded one, or LOST after killing whatever the task left when
the supervisor died without a record.

Invariants:
- a task directory is launched at most once; its supervisor runs the task at most once;
- every launched or adopted task yields exactly one `TaskExited` (through `poll`, or returned
  by `adopt` when it ended while nobody watched);
- a process is only signalled after its identity (pid and start time, or a pidfd) is checked,
  so a reused pid is never hit;
- the scheduler may die at any moment (SIGKILL included): tasks keep running under their
  supervisors, and a new executor `adopt`s them from their handles (or from the task directory
  alone when the handle's data was never stored).

It never decides what runs where (the core does) and never touches the scheduler's database.
Linux only.

The exit watcher is a module of its own (`exit_watch.py`, a base class of `LocalExecutor`), as
is the container command line (`container.py`). What is left here (about 700 lines, over the
house's ~600) is kept together on purpose: launch, stop, adopt and a container task's launch
all follow the task directory's protocol under the executor's one lock, and each check of one
(a task launched twice, a reused pid, a supervisor still starting) is the other's guarantee.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aisched.executors import container as ctr
from aisched.executors import processes, supervisor_pins, supervisor_shm, task_files, task_log
from aisched.executors import supervisor as sup
from aisched.executors.base import (
    AdoptState,
    ExecutorInfo,
    LaunchError,
    LaunchRefused,
    TaskExited,
    TaskHandle,
    TaskKey,
    TaskLaunch,
    least_used_cores,
)
from aisched.executors.cgroups import (
    GPU_WALLS,
    MemoryControl,
    TaskBounds,
    bound_cgroups,
    cgroup_name,
    choose_memory_control,
    choose_task_bounds,
    container_cgroup_parent,
    create_bounds,
    create_task_cgroup,
    release_base,
    release_bounds,
)
from aisched.executors.discovery import discover_node, nvml_device_files
from aisched.executors.engine_probe import EngineProbe
from aisched.executors.exit_watch import ExitWatching, Watched, lost_exit, pidfd_works
from aisched.executors.forkserver import ForkServer, ForkServerError
from aisched.executors.gpu_walls import GpuDevices, gpu_devices, walled_env
from aisched.executors.gpu_watchdog import (
    GPU_CHECK_INTERVAL_S,
    GpuMemoryWatchdog,
    TaskGpuMemory,
    WatchedTask,
    over_limit,
    task_pids,
)
from aisched.executors.instance import instance_tag
from aisched.executors.runas import account, account_env
from aisched.model.cluster import Node
from aisched.model.job import ContainerSpec

log = logging.getLogger(__name__)

SUPERVISOR_SCRIPT = os.path.abspath(sup.__file__)
# How long adopt waits for a supervisor that holds its lock to say who it is (it does so
# right after taking the lock; this only covers a scheduler restarted within milliseconds).
ADOPT_IDENTIFY_S = 5.0
# The first step of a launch that may fail, as its error names it (`_launch_error`).
MEMORY_STEP = "make its memory cgroup"


def _check_name(what: str, value: str) -> None:
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise LaunchError(f"{what}: {value!r} cannot name a task directory")


class LocalExecutor(ExitWatching):
    """Runs tasks as processes on this machine (see the module docstring).

    `node`: the machine as the core sees it (`discover_node()` when None). `mem_mechanism`:
    auto | cgroup-v2 | cgroup-v1 | rlimit | none (a forced one that is unavailable raises
    `MemoryControlError`); `cgroup_parent`: an existing cgroup to create task cgroups in.
    `use_pidfd`: None picks pidfds where the kernel has them; False forces polling.
    `gpu_device_files`: each GPU's device file, for the GPU walls (`gpu_walls.py`; None:
    NVML's); a file that is not a GPU's character device raises `GpuWallError`.
    `fork_server`: fork supervisors from a warm process (False: spawn each one).
    `container_runtime`, `oci_runtime`, `image_pull`, `container_pids_limit`: how tasks that
    name an image run (`container.py`); the engine is probed on the first such task, or when
    `detect_containers` is called (the service does, at start), and after a failed probe again
    (`engine_probe.py`).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        node: Node | None = None,
        *,
        mem_mechanism: str = "auto",
        cgroup_parent: str | None = None,
        use_pidfd: bool | None = None,
        fork_server: bool = True,
        notes: Sequence[str] = (),
        gpu_watchdog: GpuMemoryWatchdog | None = None,
        container_runtime: str = "auto",
        oci_runtime: str = "auto",
        image_pull: str = "missing",
        container_pids_limit: int = ctr.DEFAULT_PIDS_LIMIT,
        task_pids_limit: int = ctr.DEFAULT_PIDS_LIMIT,
        user_pids_limit: int = 4 * ctr.DEFAULT_PIDS_LIMIT,
        log_max_bytes: int = task_log.LOG_MAX_BYTES,
        log_max_files: int = task_log.LOG_MAX_FILES,
        shm_max_mib: int = 0,
        gpu_device_files: Sequence[str] | None = None,
    ) -> None:
        self._log_cap = (log_max_bytes, log_max_files)  # the supervisor caps each task's log
        self._state = Path(state_dir).resolve()
        self._state.mkdir(parents=True, exist_ok=True)
        # Names this executor's cgroups and containers, so that two schedulers (or a state
        # directory and the one it replaced) never touch each other's. InstanceTagError.
        self._instance = instance_tag(self._state)
        if node is None:
            node, found = discover_node()
            notes = (*notes, *found)
        self._node = node
        self._mem: MemoryControl = choose_memory_control(mem_mechanism, cgroup_parent)
        self._gpu_devices, gpu_note = _gpu_devices(node, gpu_device_files)
        every_gpu = self._gpu_devices.every_gpu if self._gpu_devices else ()
        self._bounds = choose_task_bounds(self._mem, every_gpu)
        self._gpu_note = gpu_note or self._bounds.gpu_note
        self._pids_limit = task_pids_limit
        self._user_pids_limit = user_pids_limit
        self._cores = tuple(sorted(os.sched_getaffinity(0)))
        self._shm_max_mib = shm_max_mib
        self._shm_off, self._shm_note = self._private_shm()
        self._pidfd = pidfd_works() if use_pidfd is None else use_pidfd and pidfd_works()
        self._notes = (
            *notes,
            *self._mem.notes,
            *self._bounds.notes,
            "exits seen through pidfds" if self._pidfd else "exits seen by polling every 0.1 s",
        )
        if gpu_watchdog is not None:
            self._notes = (*self._notes, f"GPU-memory watchdog {gpu_watchdog.state.reason}")
        self._gpu_watchdog = gpu_watchdog
        self._gpu_checked_at = -math.inf
        self._gpu_reported: set[TaskKey] = set()
        self._lock = threading.Lock()
        self._watched: dict[TaskKey, Watched] = {}
        self._reap_only: list[Watched] = []
        self._by_fd: dict[int, Watched] = {}
        self._events: list[TaskExited] = []
        self._wakeup: Callable[[], None] | None = None
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll = select.epoll() if self._pidfd else None
        if self._epoll is not None:
            self._epoll.register(self._wake_r, select.EPOLLIN)
        self._fork_server: ForkServer | None = (
            ForkServer(SUPERVISOR_SCRIPT) if fork_server else None
        )
        self._thread = threading.Thread(target=self._watch_loop, name="aisched-exits", daemon=True)
        self._thread.start()
        # Container tasks: the engine is probed on first need (or by detect_containers), and
        # again after a failure has aged (`engine_probe`).
        self._engine = EngineProbe(
            lambda: ctr.detect_engine(
                container_runtime, oci_runtime, pull=image_pull, pids_limit=container_pids_limit
            ),
            self._sweep_containers,
        )

    # --- the protocol --------------------------------------------------------------------

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            name="local",
            memory_limit=self._mem.mechanism,
            cpu_affinity=True,
            notes=(*self._notes, *self._engine.notes),
            pinning="cpuset cgroup" if self._bounds.pins_cores else "cpu affinity",
        )

    def nodes(self) -> Sequence[Node]:
        return (self._node,)

    @property
    def memory_control(self) -> MemoryControl:
        """The memory-limit mechanism in use and where its cgroups live."""
        return self._mem

    @property
    def gpu_note(self) -> str | None:
        """Whether host tasks are walled off the GPUs they were not given, and how, for the
        start-up log (None: the node has no GPUs)."""
        return self._gpu_note

    @property
    def shm_note(self) -> str | None:
        """What host tasks of users get as /dev/shm, for the start-up log and `aisched nodes`
        (None: not root, so every task runs as the service's user with the host's)."""
        return self._shm_note

    @property
    def task_bounds(self) -> TaskBounds:
        """Where tasks' process counts and cores are bounded (`cgroups.TaskBounds`)."""
        return self._bounds

    def task_dir(self, key: TaskKey) -> Path:
        job_id, attempt, task = key
        _check_name("job id", job_id)
        _check_name("task", task)
        return self._state / job_id / str(attempt) / task

    def launch(self, req: TaskLaunch) -> TaskHandle:
        key = req.key
        if self._closed:
            raise LaunchError(f"task {_show(key)}: the executor is closed")
        if req.node != self._node.name:
            raise LaunchError(
                f"task {_show(key)}: node {req.node!r} is not this machine ({self._node.name!r})"
            )
        if not req.command or not req.command[0]:
            raise LaunchError(f"task {_show(key)}: command: empty")
        spec, owner = req.container, req.user
        for field, value in (
            ("attempt", req.attempt),
            ("milli_cpu", req.milli_cpu),
            ("mem_limit_mib", req.mem_limit_mib),
            ("grace_period_s", req.grace_period_s),
        ):
            if value < 0:
                raise LaunchError(f"task {_show(key)}: {field}: must be >= 0, got {value}")
        known = {g.index for g in self._node.gpus}
        if missing := [g for g in req.gpus if g not in known]:
            raise LaunchError(f"task {_show(key)}: gpus: {missing} not on node {req.node!r}")
        tdir = self.task_dir(key)
        with self._lock:
            if key in self._watched:
                raise LaunchError(f"task {_show(key)} is already running")
        if (tdir / task_files.LAUNCH).exists():
            raise LaunchError(
                f"task {_show(key)} was launched before on this node ({tdir} exists); "
                "a new run needs a new attempt number"
            )
        if (tdir / task_files.ABANDONED).exists():
            raise LaunchError(
                f"task {_show(key)} was given up by a scheduler that recovered it before this "
                "launch (another instance leads now); it must not start"
            )
        acct = account(req.user, req.uid)
        env = dict(req.env) if acct is None else account_env(req.env, acct, spec is not None)
        if spec is None and self._bounds.gpu_walls:  # CUDA numbers what it can open from 0
            env = walled_env(env, req.gpus)
        try:
            Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(req.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                if acct is not None:  # the user's output is the user's file
                    os.fchown(fd, acct["uid"], acct["gid"])
            finally:
                os.close(fd)
        except OSError as exc:
            raise LaunchError(
                f"task {_show(key)}: log_path: cannot write {req.log_path}: {exc.strerror or exc}"
            ) from None
        with self._lock:
            cores = self._pick_cores(req.milli_cpu)
        leaf = cgroup_name(self._instance, *key)
        # A container task's limits are the engine's, in a cgroup of the engine's own.
        cgroup = (
            os.path.join(self._mem.base, leaf)
            if self._mem.base is not None and spec is None
            else None
        )
        # Its process count and cores, in cgroups of their own under cgroup v1.
        uid = acct["uid"] if acct is not None else os.geteuid()
        bounded = (
            bound_cgroups(self._bounds, leaf, uid, self._user_pids_limit) if spec is None else []
        )
        tdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # 1. The request is durable before anything runs: after a crash, adopt finds it.
        doc: dict[str, Any] = {
            "key": list(key),
            "command": list(req.command),
            "env": env,
            "user": acct,
            # Made by the task once it is the user (never by root in the user's home).
            "make_dirs": [env["AISCHED_CHECKPOINT_DIR"]]
            if acct is not None and env.get("AISCHED_CHECKPOINT_DIR")
            else [],
            "workdir": req.workdir,
            "log_path": os.path.abspath(req.log_path),
            "log_max_bytes": self._log_cap[0],
            "log_max_files": self._log_cap[1],
            "cores": list(cores),
            "mem_limit_mib": req.mem_limit_mib,
            "mechanism": self._mem.mechanism,
            "cgroup": cgroup,
            "bound_cgroups": bounded,
            "grace_period_s": req.grace_period_s,
            "gpus": list(req.gpus),
            "gpu_mem_mib": req.gpu_mem_mib,
        }
        if spec is not None:
            doc = self._container_launch(req, spec, owner, cores, tdir, doc)
        elif acct is not None:
            doc.update(self._shm_launch(req, acct))
        task_files.write_json_atomic(str(tdir / task_files.LAUNCH), doc)
        step = MEMORY_STEP  # what a launch that fails names
        try:
            # 2. Its cgroup, with the limit, before the supervisor can fork into it.
            if cgroup is not None:
                create_task_cgroup(self._mem, leaf, req.mem_limit_mib)
            step = "make the cgroups that bound its processes, cores and devices"
            if spec is None:
                create_bounds(
                    self._bounds,
                    leaf,
                    cgroup,
                    self._pids_limit,
                    cores,
                    uid,
                    self._user_pids_limit,
                    self._gpu_devices.denied(req.gpus) if self._gpu_devices else (),
                )
            # 3. The supervisor, in its own session so it outlives us; SIGTERM blocked until
            #    its handler is in place, so an early stop is not lost.
            step = "start its supervisor"
            pid, start, own_child = self._start_supervisor(tdir)
        except OSError as exc:
            for made in (cgroup, *bounded):
                processes.remove_cgroup(made)
            shutil.rmtree(tdir, ignore_errors=True)
            why = _launch_error(step, exc)
            raise LaunchError(f"task {_show(key)}: cannot {step}: {why}") from None
        watched = Watched(
            key,
            str(tdir),
            pid,
            start,
            cores,
            cgroup,
            req.grace_period_s,
            own_child=own_child,
            gpus=tuple(req.gpus),
            gpu_mem_mib=req.gpu_mem_mib,
        )
        if own_child:
            self._watch(watched)
        else:
            self._watch_forked(watched)
        return TaskHandle(
            key=key,
            node=self._node.name,
            data={
                "dir": str(tdir),
                "supervisor_pid": pid,
                "supervisor_start": start,
                "cores": list(cores),
                "cgroup": cgroup,
                "memory_limit": self._mem.mechanism,
            },
        )

    def stop(self, key: TaskKey, grace_period_s: float | None = None) -> None:
        with self._lock:
            w = self._watched.get(key)
            if w is None:
                return
            grace = w.grace_period_s if grace_period_s is None else grace_period_s
            try:
                task_files.write_json_atomic(
                    os.path.join(w.dir, task_files.STOP),
                    {"grace_period_s": max(0.0, grace), "requested_at": time.time()},
                )
            except OSError as exc:
                # The stop still goes out: without the file the supervisor gives the task the
                # grace its launch named (a full disk must not leave a cancelled task running).
                log.warning("task %s: cannot write its stop request (%s); stopping it", key, exc)
            # Under the lock: the watcher closes pidfds and reaps under it too, so neither the
            # fd nor (for our own children) the pid can name another process here.
            # SIGCONT too: a supervisor stopped (SIGSTOP, a debugger let go) would take the
            # stop only once continued, and its task would run past its grace meanwhile.
            try:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    if w.pidfd is not None:
                        signal.pidfd_send_signal(w.pidfd, sig)
                    elif processes.is_alive(w.sup_pid, w.sup_start):
                        os.kill(w.sup_pid, sig)
            except ProcessLookupError:
                pass

    def poll(self) -> list[TaskExited]:
        wd = self._gpu_watchdog
        if wd is not None and wd.active:
            now = time.monotonic()
            if now - self._gpu_checked_at >= GPU_CHECK_INTERVAL_S:
                self._gpu_checked_at = now
                self.check_gpu_memory()
        with self._lock:
            out, self._events = self._events, []
        return out

    def check_gpu_memory(self) -> list[TaskGpuMemory]:
        """GPU memory of every watched task with GPUs (the watchdog's reading; [] without an
        active watchdog). A task above the GPU memory it declared is logged, and stopped when
        the watchdog's action is `stop` (its own log says why; under `report` its log gets
        one warning). `poll` calls this every
        GPU_CHECK_INTERVAL_S."""
        wd = self._gpu_watchdog
        if wd is None or not wd.active:
            return []
        with self._lock:
            watched = [w for w in self._watched.values() if w.gpus]
        tasks: list[WatchedTask] = []
        procs: list[processes.ProcStat] | None = None
        for w in watched:
            started = task_files.read_json(os.path.join(w.dir, task_files.STARTED)) or {}
            child = started.get("child_pid")
            if not isinstance(child, int):
                continue  # not started yet: nothing of it can hold GPU memory
            if procs is None:
                procs = processes.all_procs()
            # The task runs in its own process group, led by its first process.
            tasks.append(WatchedTask(w.key, w.gpus, w.gpu_mem_mib, task_pids(child, procs)))
        usage = wd.measure(tasks)
        for act in over_limit(usage, wd.action, self._gpu_reported):
            log.warning("%s", act.service_log)
            if act.task_log is not None:
                self._note_in_log(act.usage.key, f"aisched: {act.task_log}")
            if act.stop:
                self.stop(act.usage.key)
        return usage

    def _note_in_log(self, key: TaskKey, line: str) -> None:
        launch = task_files.read_json(os.path.join(self.task_dir(key), task_files.LAUNCH)) or {}
        path = launch.get("log_path")
        if isinstance(path, str):
            with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def adopt(self, handle: TaskHandle) -> tuple[AdoptState, TaskExited | None]:
        key = handle.key
        with self._lock:
            if key in self._watched:
                return AdoptState.RUNNING, None
        data = handle.data
        tdir = str(data.get("dir") or self.task_dir(key))
        launch = task_files.read_json(os.path.join(tdir, task_files.LAUNCH))
        if launch is None:
            # 0. No request yet. Another scheduler may still write it and start the task: a
            #    leader deposed while paused between committing a launch and making it. Give
            #    the task up under its lock first, so any supervisor started for it later
            #    runs nothing; a supervisor that took the lock in between is adopted.
            os.makedirs(tdir, mode=0o700, exist_ok=True)
            if not task_files.supervisor_alive_or_abandon(tdir):
                return AdoptState.LOST, lost_exit(key, f"no record of this task in {tdir}")
            launch = task_files.read_json(os.path.join(tdir, task_files.LAUNCH)) or {}
        cgroup: str | None = launch.get("cgroup")
        ident: tuple[int, int] | None = None
        if isinstance(data.get("supervisor_pid"), int) and isinstance(
            data.get("supervisor_start"), int
        ):
            ident = (data["supervisor_pid"], data["supervisor_start"])
        else:
            ident = task_files.read_lock_owner(tdir)

        # 1. Recorded: hand out the record. 2. Alive: watch it again. 3. Else make sure no
        #    supervisor can still start it, kill what is left, and call it lost. (A supervisor
        #    records the end before it exits, so "not alive" is checked before the record.)
        deadline = time.monotonic() + ADOPT_IDENTIFY_S
        while True:
            recorded = self._recorded(key, tdir)
            if recorded is None and ident is not None:
                if self._try_watch(key, tdir, ident, launch):
                    return AdoptState.RUNNING, None
                recorded = self._recorded(key, tdir)
            if recorded is not None:
                self._reap_later(key, tdir, ident)
                processes.remove_task_cgroups(launch)
                return AdoptState.EXITED, recorded
            if not task_files.supervisor_alive_or_abandon(tdir):
                break
            # Its lock is held by a supervisor the handle did not name (it writes who it is
            # right after taking the lock).
            owner = task_files.read_lock_owner(tdir)
            if owner is not None and owner != ident:
                ident = owner
            elif time.monotonic() > deadline:
                log.error("task %s: its supervisor holds its lock but cannot be identified", key)
                break
            else:
                time.sleep(0.005)
        recorded = self._recorded(key, tdir)
        if recorded is not None:
            return AdoptState.EXITED, recorded
        started = task_files.read_json(os.path.join(tdir, task_files.STARTED)) or {}
        processes.kill_leftovers(
            sup_pid=ident[0] if ident else None,
            sup_start=ident[1] if ident else None,
            child_pid=started.get("child_pid"),
            child_start=started.get("child_start"),
            cgroup=cgroup,
        )
        self._left_behind(launch)
        if not started:
            why = "it never started (the scheduler stopped while launching it)"
        else:
            why = "its supervisor is gone without a record; what was left of it was killed"
        return AdoptState.LOST, lost_exit(key, why)

    # --- a job's private /dev/shm ---------------------------------------------------------

    def _private_shm(self) -> tuple[str | None, str | None]:
        """(why host tasks of users cannot have a private /dev/shm, or None; the start-up
        note). Only a root executor runs tasks as users, and only root may mount; it first
        sweeps the tmpfs mounts that a killed supervisor or service left behind."""
        if os.geteuid() != 0:
            return "the service is not root", None
        for path in supervisor_shm.sweep_shm(str(self._state)):
            log.info("removed %s: no live task of its job holds it", path)
        if (why := supervisor_shm.shm_unavailable()) is not None:
            return why, f"{supervisor_shm.SHM_SHARED}: {why}"
        return None, (
            "/dev/shm of host tasks: a private tmpfs per job on this node, the size of its "
            "memory here, removed when its last task ends"
        )

    def _shm_launch(self, req: TaskLaunch, acct: dict[str, Any]) -> dict[str, Any]:
        """What a user's host task adds to its launch document: the attempt's private
        /dev/shm (`supervisor_shm.join_shm`), or the line its log gets when there is none."""
        if self._shm_off is not None:
            return {"shm_notice": f"{supervisor_shm.SHM_SHARED}: {self._shm_off}"}
        shm = supervisor_shm.shm_spec(
            str(self._state), req.job_id, str(req.attempt), req.mem_limit_mib,
            self._shm_max_mib, acct["uid"], acct["gid"],
        )  # fmt: skip
        return {"shm": shm}

    # --- containers ----------------------------------------------------------------------

    def container_name(self, key: TaskKey) -> str:
        """The engine's name of the task's container (if it runs in one)."""
        return ctr.container_name(self._instance, *key)

    def detect_containers(self) -> ctr.Engine | None:
        """Probes the container engine now, unless it was (the service does, at start), and
        removes this scheduler's ended containers whose task has its record. None, with a note
        saying why, when no engine can run containers here: host tasks are unaffected, and the
        engine is probed again once a container task comes after the failure has aged."""
        return self._engine.first()

    def _sweep_containers(self, engine: ctr.Engine) -> None:
        """Removes containers of ours that no supervisor looks after: their task has ended
        (its record is written) or its supervisor died (a supervisor that holds its lock is
        alive: adopt takes it back, container and all). Such a task is marked abandoned, so
        adopt reports it lost, as it would for a host task."""
        for name, job_id, attempt, task in ctr.list_containers(engine, self._instance):
            try:
                tdir = self.task_dir((job_id, attempt, task))
            except LaunchError:
                tdir = None
            if tdir is not None and tdir.is_dir():
                if (tdir / task_files.EXIT).exists():
                    pass
                elif task_files.supervisor_alive_or_abandon(str(tdir)):
                    continue
            log.info("removing container %s: no supervisor looks after it", name)
            ctr.remove_container(engine.binary, name)

    def _container_launch(
        self,
        req: TaskLaunch,
        spec: ContainerSpec,
        owner: str | None,
        cores: tuple[int, ...],
        tdir: Path,
        doc: dict[str, Any],
    ) -> dict[str, Any]:
        """The launch document of a container task: the host-side limits are the container's
        own, and `container` holds what the supervisor runs (see supervisor_container.Container)."""
        key = req.key
        engine = self._engine.engine()
        if isinstance(engine, str):
            off = LaunchRefused if self._engine.off else LaunchError  # else: probed again
            raise off(f"task {_show(key)}: image {spec.image}: {engine}")
        # A local user's job mounts only what that user could read; a job of a name that is
        # no local user runs as the service's own user, as its host tasks do.
        given, spec = spec, ctr.resolve_volumes(spec)
        local = owner is not None and owner != "root" and _local_user(owner)
        ckpt = req.env.get("AISCHED_CHECKPOINT_DIR")
        why = ctr.mount_refusal(owner, given, spec, req.workdir, ckpt) if local and owner else None
        if why is not None:
            raise LaunchRefused(f"task {_show(key)}: {why}")
        tools: dict[str, str] = {}
        if spec.bandwidth_bit_s is not None and engine.rootless:
            raise LaunchRefused(
                f"task {_show(key)}: bandwidth: needs a rootful engine (rootless podman may "
                "not change a container's traffic control)"
            )
        if spec.bandwidth_bit_s is not None and engine.name != "podman":
            raise LaunchRefused(
                f"task {_show(key)}: bandwidth: needs podman ({engine.name} cannot set up a "
                "container's network before it starts)"
            )
        if spec.bandwidth_bit_s is not None:
            for tool in ("nsenter", "tc"):
                found = shutil.which(tool, path=ctr.SYSTEM_PATH)
                if found is None:
                    raise LaunchError(
                        f"task {_show(key)}: bandwidth: {tool} is not installed on this node "
                        "(Debian: util-linux, iproute2)"
                    )
                tools[tool] = found
        parent = None
        if engine.takes_cgroup_parent:
            acct = doc.get("user")
            uid = int(acct["uid"]) if acct is not None else os.geteuid()
            try:
                parent = container_cgroup_parent(self._bounds, uid, self._user_pids_limit)
            except OSError as exc:
                raise LaunchError(
                    f"task {_show(key)}: cannot make its user's pids cgroup: {exc.strerror or exc}"
                ) from None
        env_file = str(tdir / "container.env")
        t = ctr.ContainerTask(
            instance=self._instance,
            job_id=req.job_id,
            attempt=req.attempt,
            task=req.task,
            command=tuple(req.command),
            env=doc["env"],
            workdir=req.workdir,
            cores=cores,
            milli_cpu=req.milli_cpu,
            mem_limit_mib=req.mem_limit_mib,
            gpus=tuple(req.gpus),
            checkpoint_dir=req.env.get("AISCHED_CHECKPOINT_DIR"),
            env_file=env_file,
            user=doc.get("user"),
            cgroup_parent=parent,
        )
        try:
            text = ctr.env_file_text(ctr.task_env(spec, t, engine))
            create = ctr.create_args(spec, t, engine)
        except ctr.ContainerArgsError as e:
            raise LaunchRefused(f"task {_show(key)}: {e}") from None
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        name = self.container_name(key)
        return {
            **doc,
            "mechanism": "container",
            "cgroup": None,
            "container": {
                "binary": engine.binary,
                "engine": engine.name,
                "name": name,
                "image": spec.image,
                "create": create,
                "start": ctr.start_args(engine, name),
                "engine_env": ctr.engine_env(os.environ),
                # "none": no cgroup of its own, nothing to watch for its OOM kills.
                "cgroup_version": engine.cgroup_version if engine.cgroup_limits else "none",
                "pin_cores": [] if engine.cgroup_limits else list(cores),
                "rlimit_data": 0 if engine.cgroup_limits else req.mem_limit_mib << 20,
                "notice": ctr.unapplied_limits(t, engine),
                "bandwidth_bit_s": spec.bandwidth_bit_s,
                "network": spec.network.value,
                # Made (as the user's, when it runs as one) before the container is created.
                "make_dirs": [t.checkpoint_dir] if t.checkpoint_dir else [],
                "owner": None if t.user is None else [int(t.user["uid"]), int(t.user["gid"])],
                "owner_groups": [] if t.user is None else [int(g) for g in t.user["groups"]],
                **tools,
            },
        }

    def _start_supervisor(self, tdir: Path) -> tuple[int, int, bool]:
        """(pid, start time, our own child?) of a new supervisor for `tdir`: forked by the fork
        server when it works, else spawned as a new interpreter."""
        if self._fork_server is not None:
            try:
                pid, start = self._fork_server.spawn(str(tdir))
                return pid, start, False
            except ForkServerError as exc:
                log.warning("%s; supervisors are spawned directly from now on", exc)
                self._fork_server.close()
                self._fork_server = None
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", SUPERVISOR_SCRIPT, str(tdir)],
            {},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (
                    os.POSIX_SPAWN_OPEN,
                    1,
                    str(tdir / task_files.LOG),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                    0o600,
                ),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
            setsigmask={signal.SIGTERM},
        )
        started = processes.start_time(pid)
        assert started is not None  # our unreaped child: /proc keeps it at least as a zombie
        return pid, started, True

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fork_server is not None:
            self._fork_server.close()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5.0)
        with self._lock:
            for fd in list(self._by_fd):
                self._forget_fd(fd)
        if self._epoll is not None:
            self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        release_base(self._mem)
        release_bounds(self._bounds)

    # --- cores ---------------------------------------------------------------------------

    def _left_behind(self, launch: dict[str, Any] | None) -> None:
        processes.remove_task_cgroups(launch or {})
        _remove_container(launch)
        _release_shm(launch)

    def _pick_cores(self, milli_cpu: int) -> tuple[int, ...]:
        """The cores for a task, counting the cores of every task watched (0 CPUs: not
        pinned, it inherits ours)."""
        in_use = (c for w in self._watched.values() for c in w.cores)
        return least_used_cores(self._cores, in_use, milli_cpu)


def _local_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _gpu_devices(node: Node, files: Sequence[str] | None) -> tuple[GpuDevices | None, str | None]:
    """The device numbers of the GPUs' files (None: nothing to wall), with the start-up line
    that says why there are none where the node has GPUs. Raises GpuWallError."""
    if files is not None:
        return gpu_devices(files, len(node.gpus)), None
    found = nvml_device_files() or []
    if not found:
        note = (
            f"{GPU_WALLS}: none (NVML found no GPU: node.gpu_device_files can name the "
            "declared GPUs' device files)"
        )
        return None, note if node.gpus else None
    # `node.gpus: N` of more: the others are no task's, so every task is denied them.
    return gpu_devices(found, len(node.gpus), len(found) - len(node.gpus)), None


def _remove_container(launch: dict[str, Any] | None) -> None:
    """A container task whose supervisor is gone: its container goes too (it may run on), and
    so do the pins of its user's paths that supervisor left (`supervisor_pins.Pins`)."""
    c = (launch or {}).get("container")
    if isinstance(c, dict) and c.get("binary") and c.get("name"):
        ctr.remove_container(str(c["binary"]), str(c["name"]))
        if os.geteuid() == 0:
            supervisor_pins.sweep_pins()


def _release_shm(launch: dict[str, Any] | None) -> None:
    """A task whose supervisor is gone: its job's /dev/shm goes too, unless a live task of the
    job still holds it."""
    shm = (launch or {}).get("shm")
    if isinstance(shm, dict):
        try:
            supervisor_shm.release_shm(shm)
        except OSError as exc:
            log.warning("cannot remove the /dev/shm of %s: %s", shm.get("dir"), exc)


def _launch_error(step: str, exc: OSError) -> str:
    """The OS's words for a failed launch step, with the file it failed on. A memory cgroup
    that cannot be made for EBUSY most likely means the kernel's memory cgroup ids (65,535,
    held by live cgroups only) are used up, by other software: a task's is removed as it
    ends."""
    words = exc.strerror or str(exc)
    if exc.filename is not None:
        words += f" ({exc.filename})"
    if step == MEMORY_STEP and exc.errno == errno.EBUSY:
        words += "; the kernel may have no memory cgroup left to give (65,535 at most)"
    return words


def _show(key: TaskKey) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"

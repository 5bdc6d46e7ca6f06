"""A Ray host task's memory, processes and cores, bounded on its node as on one machine.

The node's agent makes the task's cgroups with the local executor's own code (`cgroups.py`):
a memory cgroup with the task's limit, and its process count and cores bounded (pids and
cpuset cgroups under cgroup v1, with the per-user pids cgroup above them; files of the memory
cgroup under v2). The task's child joins them before it drops to the task's user and execs, so
everything the task starts counts. Where the node has no memory cgroup for the agent, the
child gets the task's limit as RLIMIT_DATA instead, and the task's log says so. What the node
allows is decided once per worker process (`node_controls`).

A killed agent (kill -9 of its Ray worker) removes nothing: its tasks' main processes die with
it (parent-death signal), but their cgroups stay, with whatever the tasks started that outlived
them (a daemon, a `cmd &`), still running while the scheduler, which lost the task, runs it
again. So each task holds a lock on a file of its cgroups' name in the node's state directory
for as long as they exist, and a worker process, before it makes the first cgroup of an
instance (a service), sweeps that instance's task cgroups whose lock no one holds: it kills
what is in them and removes them (`sweep_dead_task_cgroups`).

Standard library and aisched's standard-library modules only: it runs in Ray worker processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import resource
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aisched.executors import processes
from aisched.executors.cgroups import (
    MemoryControl,
    MemoryControlError,
    TaskBounds,
    bound_cgroups,
    cgroup_name,
    choose_memory_control,
    choose_task_bounds,
    container_cgroup_parent,
    create_bounds,
    create_task_cgroup,
    instance_prefix,
    list_task_cgroups,
)
from aisched.executors.container import DEFAULT_PIDS_LIMIT
from aisched.executors.gpu_walls import GpuDevices, GpuWallError, gpu_devices
from aisched.executors.task_files import lock_at_path, try_flock

# The node's state directory, root's alone (node-local: `NODE_STATE/<instance>/`), and the
# folder of the locks of an instance's task cgroups there.
NODE_STATE = "/run/aisched-ray"
OWNERS = ".cgroups"


# The node's GPUs' device files, comma-separated in GPU index order, for the GPU walls: in
# the environment of `ray start` on a node whose GPUs NVML does not list (else NVML's).
GPU_FILES_ENV = "AISCHED_GPU_DEVICE_FILES"


@dataclass(frozen=True, slots=True)
class NodeControls:
    mem: MemoryControl
    bounds: TaskBounds
    gpus: GpuDevices | None = None  # the node's GPUs' device numbers (None: no device files)


_CONTROLS: dict[str, NodeControls] = {}


def node_controls(mechanism: str) -> NodeControls:
    """How this node bounds tasks with the memory `mechanism` asked for (probed once per
    worker process). Raises MemoryControlError when a forced mechanism is not available, and
    GpuWallError when the node's GPU device files are not character devices."""
    if mechanism not in _CONTROLS:
        mem = choose_memory_control(mechanism)
        gpus = _node_gpus()
        bounds = choose_task_bounds(mem, gpus.every_gpu if gpus is not None else ())
        _CONTROLS[mechanism] = NodeControls(mem, bounds, gpus)
    return _CONTROLS[mechanism]


def _node_gpus() -> GpuDevices | None:
    listed = os.environ.get(GPU_FILES_ENV)
    if listed is not None:
        files = [f for f in listed.split(",") if f]
    else:
        from aisched.executors.discovery import nvml_device_files  # NVML: not stdlib-only

        files = nvml_device_files() or []
    return gpu_devices(files, len(files), source=GPU_FILES_ENV) if files else None


@dataclass(frozen=True, slots=True)
class TaskCgroups:
    """The cgroups one task joins, and what its child sets where there is no memory cgroup."""

    memory: str | None  # its memory cgroup, whose OOM kills are read at its end
    joined: tuple[str, ...]  # every cgroup its child joins
    rlimit_bytes: int  # RLIMIT_DATA for its processes (0: none)
    note: str | None  # for its log: its memory limit is not a cgroup's
    owner: Owner | None = None  # held while they exist (None: no sweep on this node)
    walled: bool = False  # its cgroups deny the GPUs it was not given (gpu_walls.py)
    gpu_note: str | None = None  # for its log: the node has GPU files, but no walls

    def join(self) -> None:
        """In the child, before it drops to the task's user (the cgroups are root's)."""
        for cgroup in self.joined:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if self.rlimit_bytes:
            # RLIMIT_DATA, not RLIMIT_AS: CUDA reserves huge (unbacked) address ranges.
            resource.setrlimit(resource.RLIMIT_DATA, (self.rlimit_bytes, self.rlimit_bytes))

    def oom_killed(self) -> bool:
        return processes.oom_kills(self.memory) > 0

    def remove(self) -> None:
        """Kills what is left in them, and removes them; then lets go of their lock."""
        for cgroup in self.joined:
            processes.remove_cgroup(cgroup)
        if self.owner is not None:
            self.owner.release(self.joined)


def task_names(spec: dict[str, Any]) -> tuple[str, str, str, str]:
    """(instance, job, attempt, task) of the task of `spec`, which its things on the node are
    named by. Without an instance or a key (a runner made by hand), its log names it."""
    log = str(spec["log_path"])
    instance = str(spec.get("instance") or hashlib.sha256(log.encode()).hexdigest()[:10])
    job, attempt, task = spec.get("key") or ("task", 0, os.path.basename(log))
    return instance, str(job), str(attempt), str(task)


def make_task_cgroups(spec: dict[str, Any], uid: int, cores: tuple[int, ...]) -> TaskCgroups:
    """The cgroups of the host task of `spec` (its key, instance, mem_limit_mib, and the
    executor's memory_limit, task_pids_limit and user_pids_limit) run as `uid` on `cores`,
    made with their bounds, and their lock held (after the first sweep of the instance by this
    process). Raises OSError, or MemoryControlError (a forced mechanism that this node does
    not have)."""
    controls = node_controls(str(spec.get("memory_limit") or "auto"))
    instance, job, attempt, task = task_names(spec)
    name = cgroup_name(instance, job, int(attempt), task)
    owners = swept_owners(instance, controls)
    owner = Owner.take(owners, name) if owners is not None else None
    try:
        return dataclasses.replace(_make(controls, spec, name, uid, cores), owner=owner)
    except BaseException:
        if owner is not None:
            owner.release(())
        raise


def container_parent(spec: dict[str, Any], uid: int) -> str | None:
    """The `--cgroup-parent` of the container task of `spec` run as `uid` on this node: its
    user's pids cgroup, as on one machine (`cgroups.container_cgroup_parent`). Raises OSError,
    or MemoryControlError."""
    controls = node_controls(str(spec.get("memory_limit") or "auto"))
    user_pids_max = int(spec.get("user_pids_limit") or 4 * DEFAULT_PIDS_LIMIT)
    return container_cgroup_parent(controls.bounds, uid, user_pids_max)


def _make(
    controls: NodeControls, spec: dict[str, Any], name: str, uid: int, cores: tuple[int, ...]
) -> TaskCgroups:
    mem_mib = int(spec.get("mem_limit_mib") or 0)
    memory = create_task_cgroup(controls.mem, name, mem_mib)
    user_pids_max = int(spec.get("user_pids_limit") or 4 * DEFAULT_PIDS_LIMIT)
    walled = controls.gpus is not None and controls.bounds.gpu_walls
    mine = [int(g) for g in spec.get("gpus") or ()]
    deny = controls.gpus.denied(mine) if controls.gpus is not None and walled else ()
    try:
        create_bounds(
            controls.bounds,
            name,
            memory,
            int(spec.get("task_pids_limit") or DEFAULT_PIDS_LIMIT),
            cores,
            uid,
            user_pids_max,
            deny,
        )
    except OSError:
        processes.remove_cgroup(memory)
        raise
    bounded = bound_cgroups(controls.bounds, name, uid, user_pids_max)
    joined = tuple(c for c in (memory, *bounded) if c)
    rlimit = mem_mib << 20 if controls.mem.mechanism == "rlimit" else 0
    note = None
    if memory is None and mem_mib:
        how = f"RLIMIT_DATA of {mem_mib} MiB per process" if rlimit else "not enforced"
        note = f"memory limit on this node: {how} ({'; '.join(controls.mem.notes)})"
    gpu_note = controls.bounds.gpu_note if controls.gpus is not None and not walled else None
    return TaskCgroups(memory, joined, rlimit, note, walled=walled, gpu_note=gpu_note)


# --- what a killed agent left ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owner:
    """A task's hold on the lock of its cgroups' name (`OWNERS`): while it is held, no sweep
    touches them. An agent that dies lets go of every lock it held."""

    path: str
    fd: int

    @staticmethod
    def take(owners: str, name: str) -> Owner:
        """Waits for the lock (a sweep of a leftover of the name may hold it), on the file
        that is at the path once it has it: a sweep unlinks the one it removed the cgroups
        of. Raises OSError."""
        path = os.path.join(owners, name)
        return Owner(path, lock_at_path(path, os.O_CLOEXEC))

    def release(self, cgroups: tuple[str, ...]) -> None:
        """Lets go of the lock; its file goes once `cgroups` are gone (else the next sweep
        tries again)."""
        if not any(os.path.isdir(c) for c in cgroups):
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self.fd)


# Instance -> the folder of its owner locks on this node (None: this process keeps none),
# swept once per worker process.
_OWNERS: dict[str, str | None] = {}
_SWEEPING = threading.Lock()
# How long the sweep waits for a dead agent's task cgroup to empty and go (each).
SWEEP_DRAIN_S = 10.0


def swept_owners(instance: str, controls: NodeControls) -> str | None:
    """The folder of the owner locks of `instance`'s task cgroups on this node, after this
    process's first call for the instance swept what dead agents left
    (`sweep_dead_task_cgroups`); None where this process cannot keep it (not root), and then
    makes its cgroups unlocked and sweeps nothing. Other threads wait for the sweep."""
    with _SWEEPING:
        if instance not in _OWNERS:
            owners = _owners_dir(instance)
            if owners is not None:
                sweep_dead_task_cgroups(instance, controls, owners)
            _OWNERS[instance] = owners
        return _OWNERS[instance]


def sweep_after_agent_death(instance: str, mechanism: str) -> None:
    """`swept_owners` for a new agent of a node whose agent died, called as soon as the
    scheduler learns of the death: what the dead agent's tasks left must not run on until
    a task of the instance happens to run on this node again (its lost tasks may be retried
    elsewhere)."""
    # A forced mechanism this node lacks, or GPU files that are not devices: its tasks fail to
    # start (saying why), and no cgroup was made.
    with contextlib.suppress(MemoryControlError, GpuWallError):
        swept_owners(instance, node_controls(mechanism))


def _owners_dir(instance: str) -> str | None:
    if os.geteuid() != 0:
        return None
    # Anyone who could write there could keep a dead agent's tasks from the sweep.
    owners = os.path.join(NODE_STATE, instance, OWNERS)
    return owners if made_in_node_state(owners) is None else None


def made_in_node_state(path: str) -> str | None:
    """Makes `path` (0700) under the node's state directory; why it is not root's alone (its
    maker failed, or `NODE_STATE` is no directory of root's that only root may write to,
    so others could plant or replace what is kept there), or None."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(NODE_STATE)
    except OSError as exc:
        return f"cannot make {path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        return f"{NODE_STATE} is not a directory of root's alone"
    return None


def sweep_dead_task_cgroups(instance: str, controls: NodeControls, owners: str) -> list[str]:
    """Kills every process in, and removes, each task cgroup of `instance` on this node (of
    aisched's naming, under the parents `controls` uses) whose lock in `owners` no one holds:
    those of tasks of agents killed before they could remove them. Returns their names.

    It cannot hit a live task. A task takes its lock before it makes its cgroups and lets go
    of it after it removed them, and a lock goes with the process that held it. That the
    node's agent is one named, detached actor (`ray_executor._agent`: `get_if_exists`,
    `max_restarts=0`), so that a new one exists only once the old one is dead, is not enough
    on its own: the agents of the instance on the other Ray nodes of this machine (several
    raylets may share one, as in the tests' cluster) are alive and use the same cgroup
    parents, and a node whose raylet was replaced gets a new Ray id, so a new agent, while
    the old one may not have died yet."""
    gone = []
    prefix = instance_prefix(instance)
    for name, paths in list_task_cgroups(controls.mem, controls.bounds, prefix).items():
        lock = os.path.join(owners, name)
        try:
            fd = _open_lock(lock)  # made where missing: cgroups no task took a lock for
        except OSError:
            continue
        try:
            held = try_flock(fd, fcntl.LOCK_EX)
        except OSError:
            held = False
        if not held:  # a live task's
            os.close(fd)
            continue
        for path in paths:
            # Patient: nothing waits on a sweep but the node's next cgroups, and a process
            # killed under load (in I/O) may take seconds to let go of its cgroup.
            processes.remove_cgroup(path, drain_s=SWEEP_DRAIN_S)
        Owner(lock, fd).release(tuple(paths))
        gone.append(name)
    return gone


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def joined_then(cgroups: TaskCgroups | None, then: Callable[[], None]) -> Callable[[], None]:
    """A preexec_fn: join `cgroups` (if any), then run `then`."""

    def setup() -> None:
        if cgroups is not None:
            cgroups.join()
        then()

    return setup


def removed(cgroups: TaskCgroups | None) -> None:
    if cgroups is not None:
        with contextlib.suppress(OSError):
            cgroups.remove()

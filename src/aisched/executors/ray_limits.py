"""A Ray host task's memory, processes and cores, bounded on its node as on one machine.

The node's agent makes the task's cgroups with the local executor's own code (`cgroups.py`):
a memory cgroup with the task's limit, and its process count and cores bounded (pids and
cpuset cgroups under cgroup v1, with the per-user pids cgroup above them; files of the memory
cgroup under v2). The task's child joins them before it drops to the task's user and execs, so
everything the task starts counts. Where the node has no memory cgroup for the agent, the
child gets the task's limit as RLIMIT_DATA instead, and the task's log says so. What the node
allows is decided once per worker process (`node_controls`).

Standard library and aisched's standard-library modules only: it runs in Ray worker processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aisched.executors import processes
from aisched.executors.cgroups import (
    MemoryControl,
    TaskBounds,
    bound_cgroups,
    cgroup_name,
    choose_memory_control,
    choose_task_bounds,
    create_bounds,
    create_task_cgroup,
)
from aisched.executors.container import DEFAULT_PIDS_LIMIT


@dataclass(frozen=True, slots=True)
class NodeControls:
    mem: MemoryControl
    bounds: TaskBounds


_CONTROLS: dict[str, NodeControls] = {}


def node_controls(mechanism: str) -> NodeControls:
    """How this node bounds tasks with the memory `mechanism` asked for (probed once per
    worker process). Raises MemoryControlError when a forced mechanism is not available."""
    if mechanism not in _CONTROLS:
        mem = choose_memory_control(mechanism)
        _CONTROLS[mechanism] = NodeControls(mem, choose_task_bounds(mem))
    return _CONTROLS[mechanism]


@dataclass(frozen=True, slots=True)
class TaskCgroups:
    """The cgroups one task joins, and what its child sets where there is no memory cgroup."""

    memory: str | None  # its memory cgroup, whose OOM kills are read at its end
    joined: tuple[str, ...]  # every cgroup its child joins
    rlimit_bytes: int  # RLIMIT_DATA for its processes (0: none)
    note: str | None  # for its log: its memory limit is not a cgroup's

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
        """Kills what is left in them, and removes them."""
        for cgroup in self.joined:
            processes.remove_cgroup(cgroup)


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
    made with their bounds. Raises OSError, or MemoryControlError (a forced mechanism that
    this node does not have)."""
    controls = node_controls(str(spec.get("memory_limit") or "auto"))
    instance, job, attempt, task = task_names(spec)
    name = cgroup_name(instance, job, int(attempt), task)
    mem_mib = int(spec.get("mem_limit_mib") or 0)
    memory = create_task_cgroup(controls.mem, name, mem_mib)
    user_pids_max = int(spec.get("user_pids_limit") or 4 * DEFAULT_PIDS_LIMIT)
    try:
        create_bounds(
            controls.bounds,
            name,
            memory,
            int(spec.get("task_pids_limit") or DEFAULT_PIDS_LIMIT),
            cores,
            uid,
            user_pids_max,
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
    return TaskCgroups(memory, joined, rlimit, note)


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

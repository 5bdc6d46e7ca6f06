"""GPU-memory watchdog: how much GPU memory each task's processes use, against what it declared.

Tasks that share a GPU trust each other to stay within the GPU memory they asked for
(`gpu_mem`); nothing in CUDA enforces it. The watchdog reads per-process GPU memory (NVML's
compute processes, through `discovery.gpu_memory`), sums it per task over the task's own
processes on the task's own GPUs, and flags a task above its declared amount. What happens to
a flagged task is the caller's choice (`OverAction`): report it, or stop it; `over_limit`
says, the same for every executor, which tasks to stop and what to write in whose log.

The reading function is injected, so the arithmetic is tested with real reading structures and
no GPU. Without NVML (no nvidia-ml-py, no driver) the watchdog is inactive and says why; it
never guesses. It never signals a process itself.

Caveat: NVML reports pids in the host's pid namespace; inside a container they differ from the
task's pids, and the watchdog then sees no usage for the task (reported in `nvml_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableSet, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from aisched.executors.base import TaskKey

# How often an executor has the watchdog look (an NVML query per GPU each time).
GPU_CHECK_INTERVAL_S = 5.0

# GPU index -> [(pid, used MiB)] of the compute processes on it: `discovery.gpu_memory`.
GpuProcesses = Mapping[int, Sequence[tuple[int, int]]]
ReadGpuMemory = Callable[[Iterable[int]], GpuProcesses]


class OverAction(StrEnum):
    """What to do with a task above its declared GPU memory."""

    REPORT = "report"
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class WatchedTask:
    """A running task: its GPUs, the GPU memory it declared in all (0: none declared, only
    reported) and the pids of its processes now."""

    key: TaskKey
    gpus: tuple[int, ...]
    limit_mib: int
    pids: frozenset[int]


@dataclass(frozen=True, slots=True)
class TaskGpuMemory:
    """What one task's processes hold on its GPUs: per (gpu, pid) and in all."""

    key: TaskKey
    used_mib: int
    limit_mib: int
    by_process: tuple[tuple[int, int, int], ...]  # (gpu, pid, MiB)

    @property
    def over(self) -> bool:
        return self.limit_mib > 0 and self.used_mib > self.limit_mib

    def describe(self) -> str:
        where = ", ".join(f"pid {pid} {mib} MiB on GPU {gpu}" for gpu, pid, mib in self.by_process)
        limit = f"declared {self.limit_mib} MiB" if self.limit_mib else "none declared"
        return f"uses {self.used_mib} MiB of GPU memory ({limit}): {where or 'no process'}"


@dataclass(frozen=True, slots=True)
class WatchdogState:
    active: bool
    reason: str


def nvml_state(unavailable: Callable[[], str | None] | None = None) -> WatchdogState:
    """Whether NVML can be read here, and why not. `unavailable` gives the reason it cannot, or
    None (default: `discovery.nvml_unavailable`)."""
    if unavailable is None:
        from aisched.executors.discovery import nvml_unavailable

        unavailable = nvml_unavailable
    why = unavailable()
    if why is not None:
        return WatchdogState(False, f"inactive: {why}")
    return WatchdogState(
        True, "active: per-process GPU memory from NVML (host pids; none seen in a container)"
    )


class GpuMemoryWatchdog:
    """Measures tasks' GPU memory with `read`; inactive (measures nothing) unless `state`
    says it is active."""

    def __init__(
        self, read: ReadGpuMemory, state: WatchdogState, action: OverAction = OverAction.REPORT
    ) -> None:
        self.read = read
        self.state = state
        self.action = action

    @classmethod
    def with_nvml(cls, action: OverAction = OverAction.REPORT) -> GpuMemoryWatchdog:
        from aisched.executors.discovery import gpu_memory

        return cls(gpu_memory, nvml_state(), action)

    @property
    def active(self) -> bool:
        return self.state.active

    def measure(self, tasks: Sequence[WatchedTask]) -> list[TaskGpuMemory]:
        """Usage of every task that has GPUs, in the order given; [] when inactive."""
        tasks = [t for t in tasks if t.gpus]
        if not self.active or not tasks:
            return []
        reading = self.read(sorted({g for t in tasks for g in t.gpus}))
        out: list[TaskGpuMemory] = []
        for t in tasks:
            mine = tuple(
                (gpu, pid, mib)
                for gpu in t.gpus
                for pid, mib in reading.get(gpu, ())
                if pid in t.pids
            )
            out.append(TaskGpuMemory(t.key, sum(m for _, _, m in mine), t.limit_mib, mine))
        return out


@dataclass(frozen=True, slots=True)
class OverLimit:
    """What an executor does about one task above its declared GPU memory: stop it or not,
    a line for the task's own log (None: it was told before), and a line for the scheduler's
    log (every check, so an operator sees it last as long as it lasts)."""

    usage: TaskGpuMemory
    stop: bool
    task_log: str | None
    service_log: str


def over_limit(
    usage: Sequence[TaskGpuMemory], action: OverAction, reported: MutableSet[TaskKey]
) -> list[OverLimit]:
    """The tasks of `usage` above their declared GPU memory, and what to do with each under
    `action`. `reported` holds the tasks already warned in their own log under `report`; it is
    updated here, so a task's log gets one warning however long it stays over. Under `stop`
    a task is stopped at every check that finds it over (stopping is idempotent)."""
    out: list[OverLimit] = []
    for u in usage:
        if not u.over:
            continue
        key = u.key
        where = f"task {key[0]}/{key[1]}/{key[2]} {u.describe()}"
        if action == OverAction.STOP:
            line = f"stopped: the task {u.describe()}"
            out.append(OverLimit(u, True, line, f"{where}: stopping it"))
        elif key not in reported:
            reported.add(key)
            out.append(OverLimit(u, False, f"warning: the task {u.describe()}", where))
        else:
            out.append(OverLimit(u, False, None, where))
    return out


class _Proc(Protocol):
    pid: int
    pgid: int


def task_pids(leader: int, procs: Iterable[_Proc]) -> frozenset[int]:
    """The pids of a task's processes: its process group, led by its first process `leader`
    (`procs`: `processes.all_procs()`)."""
    return frozenset(p.pid for p in procs if p.pgid == leader)

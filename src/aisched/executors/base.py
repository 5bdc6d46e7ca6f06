"""The executor protocol: how a bound task becomes a running process, and how its end is seen.

Every executor (local processes, a Ray cluster, the simulator's virtual time) takes the same
requests and reports the same events, so the service's loop does not care where work runs.
The environment contract of shared/DESIGN.md is built here, once, by `contract_env`, so every
executor hands a task the same variables.

Invariants an executor keeps:

- A task is identified by `(job_id, attempt, task)`; launching the same key twice is a bug of
  the caller and is refused (`LaunchError`).
- `launch` returns only once the task's process exists (or raises); its `TaskHandle` is
  everything needed to find the task again after the scheduler itself restarts (`adopt`).
- Every launched task ends with exactly one `TaskExited` event, whether it exits by itself, is
  stopped, is killed for exceeding its memory, or is found gone (`lost`). Stopping a task that
  has already exited is not an error.

Nothing here touches a database or the scheduling core's decisions.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from aisched.model.cluster import Node
from aisched.model.job import ContainerSpec

# JSON-serialisable; the service stores it with the task and hands it back to `adopt`.
HandleData = dict[str, Any]


class LaunchError(RuntimeError):
    """A task could not be started (bad command, missing working directory, no such node...).
    The message says what and is shown to the user."""


class LaunchRefused(LaunchError):
    """A launch that would fail the same way however often it were tried (a path its user may
    not mount, containers turned off on the node): its attempt fails without a retry, as one
    whose image is missing does, rather than as a task lost."""


@dataclass(frozen=True, slots=True)
class TaskLaunch:
    """Everything an executor needs to start one task of one attempt of a job.

    `task` is the task's name, `<group>-<index>` (e.g. `worker-1`), unique within the job.
    `env` is the full contract environment (`contract_env`) plus the user's own variables; the
    executor adds nothing else but what it alone knows (e.g. nothing, for the local executor).
    The process gets exactly this environment, so it must carry PATH, HOME and whatever else
    the command needs (the command is looked up on `env`'s PATH, else on /bin:/usr/bin).
    `milli_cpu` is what the core reserved; the executor pins the task to `ceil(milli_cpu/1000)`
    cores where it can. `mem_limit_mib` 0 means no limit. `gpus` are device indices on `node`.
    `log_path` receives stdout and stderr together. `grace_period_s` is the time between
    SIGTERM and SIGKILL when the task is stopped. `gpu_milli` is the share of each of `gpus`
    the task holds (1000: whole devices), for executors that reserve it elsewhere too (Ray).
    `container`: the image and its settings when the task runs in a container.
    `user` is the account the job belongs to: a root executor runs the task as that user
    (uid, gid and groups), any other runs it as itself (the API admits only its own user's
    jobs then); None means the executor's own user. `uid` is the uid that submitted the job
    (None: not known): a root executor refuses the task, for good, where `user` has no
    account or names another uid (the name was given to another account since).
    """

    job_id: str
    attempt: int
    task: str
    node: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str | None
    milli_cpu: int
    mem_limit_mib: int
    gpus: tuple[int, ...]
    log_path: str
    grace_period_s: float
    # GPU memory the task declared over all its GPUs (0: none); for the GPU-memory watchdog.
    gpu_mem_mib: int = 0
    gpu_milli: int = 1000
    user: str | None = None
    uid: int | None = None
    # Run in this image instead of on the host (None: on the host).
    container: ContainerSpec | None = None

    @property
    def key(self) -> TaskKey:
        return (self.job_id, self.attempt, self.task)


TaskKey = tuple[str, int, str]  # (job_id, attempt, task)


@dataclass(frozen=True, slots=True)
class TaskHandle:
    """Where a launched task is: enough to signal it, watch it and adopt it after a restart.

    `data` is executor-specific and JSON-serialisable (for the local executor: the supervisor's
    pid and start time, the task's directory, the cores it was pinned to, its cgroup).
    """

    key: TaskKey
    node: str
    data: HandleData = field(default_factory=dict)


class ExitKind(StrEnum):
    EXITED = "exited"  # the process ended; `exit_code` says how (negative: killed by signal -N)
    STOPPED = "stopped"  # ended after `stop()` was asked for it
    OOM = "oom"  # killed for exceeding its memory limit
    LOST = "lost"  # the task cannot be found any more (process gone without a record, node gone)
    # It can never start as asked (its image is not on the node and cannot be pulled, its
    # program is not found): running it again unchanged cannot help, unlike a crash.
    UNRUNNABLE = "unrunnable"


@dataclass(frozen=True, slots=True)
class TaskExited:
    key: TaskKey
    kind: ExitKind
    exit_code: int | None
    message: str = ""
    time_s: float = 0.0


class AdoptState(StrEnum):
    RUNNING = "running"  # alive: the executor watches it again and will report its exit
    EXITED = "exited"  # it ended while nobody watched; the TaskExited is returned with it
    LOST = "lost"  # nothing is left of it and nothing says how it ended


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """What an executor can enforce, for `aisched nodes`: e.g. memory_limit 'cgroup-v1',
    'cgroup-v2', 'rlimit' or 'none'; cpu_affinity True where tasks are pinned to cores, and
    `pinning` by what: 'cpuset cgroup' (a task cannot widen its cores) or 'cpu affinity' (it
    may)."""

    name: str
    memory_limit: str
    cpu_affinity: bool
    notes: tuple[str, ...] = ()
    pinning: str = "cpu affinity"


class Executor(Protocol):
    """Starts, stops and watches tasks. Called from the service's loop thread only, except
    `wakeup`, which the executor may call from any thread."""

    def info(self) -> ExecutorInfo:
        """Called once at start and by status queries; no side effects."""
        ...

    def nodes(self) -> Sequence[Node]:
        """The nodes this executor can run on, as the core sees them. Called at start and on
        every loop iteration (a cluster executor may gain or lose nodes); must be cheap."""
        ...

    def launch(self, req: TaskLaunch) -> TaskHandle:
        """Start one task. Returns once the task's process (or the supervisor that starts it)
        exists; it does not wait for the command itself. Raises LaunchError (with a message
        for the user) when the request is refused or nothing could be started; then nothing of
        it is left running. A command that cannot be executed is not a LaunchError: it ends
        with an event with a message naming the command, UNRUNNABLE with code 127 when its
        program is not found, EXITED with code 126 when it cannot be run (not executable, a bad
        working directory)."""
        ...

    def stop(self, key: TaskKey, grace_period_s: float | None = None) -> None:
        """Ask a task to stop: SIGTERM to its whole process group, then SIGKILL after the
        grace period (the launch's, unless given). Returns at once; the end is reported by
        `poll` as STOPPED. Idempotent; a task already gone is ignored."""
        ...

    def poll(self) -> list[TaskExited]:
        """Events since the last call; never blocks. Each task's exit is reported once."""
        ...

    def adopt(self, handle: TaskHandle) -> tuple[AdoptState, TaskExited | None]:
        """After a restart of the scheduler: take charge again of a task launched before.
        RUNNING: it is watched again (its exit will come through `poll`), event None; EXITED:
        it ended in the meantime, and the event says how (kind exited, stopped or oom); LOST:
        nothing says how it ended, whatever was left of it has been killed, and the event
        (kind LOST) says why. Never runs the task again. An executor that can find a task
        from its key alone accepts a handle whose `data` holds only `log_path` (the scheduler
        died before it could store the handle `launch` returned)."""
        ...

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        """`wakeup()` is called (from any thread) when `poll` has something new, so the loop
        can react at once instead of at its next tick."""
        ...

    def close(self) -> None:
        """The service is shutting down: stop watching. Tasks keep running (they are adopted
        at the next start); nothing is killed."""
        ...


@runtime_checkable
class NodeAddresses(Protocol):
    """An executor whose nodes are other machines says where each one is, so a gang's
    MASTER_ADDR is the address of its rank 0's node (not the scheduler's)."""

    def node_address(self, node: str) -> str | None: ...


@runtime_checkable
class GangLauncher(Protocol):
    """An executor that starts the tasks launched together (one attempt's gang) in one step,
    e.g. reserving them together (Ray: one placement group). `launch_gang` answers each
    request as `launch` would, in order: a handle, or the LaunchError `launch` would raise.
    It starts all of them or none (then every answer is a LaunchError)."""

    def launch_gang(self, reqs: Sequence[TaskLaunch]) -> list[TaskHandle | LaunchError]: ...


@runtime_checkable
class Availability(Protocol):
    """An executor whose nodes are behind a service of their own (Ray's GCS) says while it
    cannot start tasks at all. `unavailable` is called by the loop before each cycle and by
    readiness checks, from any thread; it must be cheap. A line saying why, or None."""

    def unavailable(self) -> str | None: ...


def unavailable(executor: object) -> str | None:
    """Why `executor` cannot start tasks now, or None (always None for one that cannot tell)."""
    return executor.unavailable() if isinstance(executor, Availability) else None


def master_addr_for(executor: object, node: str, default: str) -> str:
    """MASTER_ADDR for a gang whose rank 0 runs on `node`."""
    if isinstance(executor, NodeAddresses):
        return executor.node_address(node) or default
    return default


def task_name(group: str, index: int) -> str:
    return f"{group}-{index}"


@dataclass(frozen=True, slots=True)
class TaskPlace:
    """One bound task as the environment contract needs it: its name, node and GPUs, in the
    job's rank order."""

    task: str
    node: str
    gpus: tuple[int, ...]
    milli_cpu: int
    index_in_group: int = 0  # the task's index within its group (Volcano's VC_TASK_INDEX)


def contract_env(
    *,
    job_id: str,
    places: Sequence[TaskPlace],
    rank: int,
    restart_count: int,
    checkpoint_dir: str,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The DESIGN.md environment of task `places[rank]`.

    Ranks follow `places` (the job's task order); node ranks follow the first appearance of each
    node in that order, so rank 0 is on node rank 0, whose address is MASTER_ADDR.
    `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA number devices as NVML and nvidia-smi do, so the
    indices in CUDA_VISIBLE_DEVICES mean the GPUs the scheduler chose. A task without GPUs gets
    an empty CUDA_VISIBLE_DEVICES: it must not see (and use) GPUs it was not given.
    """
    me = places[rank]
    node_order: list[str] = []
    for p in places:
        if p.node not in node_order:
            node_order.append(p.node)
    on_my_node = [i for i, p in enumerate(places) if p.node == me.node]
    threads = max(1, -(-me.milli_cpu // 1000))
    return {
        "AISCHED_JOB_ID": job_id,
        "AISCHED_TASK": me.task,
        "AISCHED_TASK_INDEX": str(rank),
        # Volcano's env plugin: the pod's index within its task, so Volcano jobs run unchanged.
        "VC_TASK_INDEX": str(me.index_in_group),
        "VK_TASK_INDEX": str(me.index_in_group),
        "AISCHED_RESTART_COUNT": str(restart_count),
        "AISCHED_CHECKPOINT_DIR": checkpoint_dir,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in me.gpus),
        # The same GPUs in the host's numbering wherever CUDA's differs (a container, walls).
        "AISCHED_GPUS": ",".join(str(g) for g in me.gpus),
        "OMP_NUM_THREADS": str(threads),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(len(places)),
        "RANK": str(rank),
        "LOCAL_RANK": str(on_my_node.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(on_my_node)),
        "NODE_RANK": str(node_order.index(me.node)),
        "GROUP_WORLD_SIZE": str(len(node_order)),
    }


def exit_from_record(key: TaskKey, rec: Mapping[str, Any]) -> TaskExited:
    """A task's end from the record its supervisor wrote (`exit.json`, or a Ray task's result):
    an unknown kind reads as a plain exit, a missing time as now."""
    try:
        kind = ExitKind(str(rec.get("kind")))
    except ValueError:
        kind = ExitKind.EXITED
    code = rec.get("exit_code")
    return TaskExited(
        key=key,
        kind=kind,
        exit_code=code if isinstance(code, int) else None,
        message=str(rec.get("message") or ""),
        time_s=float(rec.get("finished_at") or time.time()),
    )


def least_used_cores(
    cores: Sequence[int], in_use: Iterable[int], milli_cpu: int
) -> tuple[int, ...]:
    """`ceil(milli_cpu / 1000)` of `cores`, the least used first (`in_use`: one entry per task
    on a core; ties: the lowest number), in ascending order; none for a task asking no CPU."""
    n = -(-milli_cpu // 1000)
    if n <= 0:
        return ()
    load = Counter(in_use)
    return tuple(sorted(sorted(cores, key=lambda c: (load[c], c))[:n]))

"""The long-lived agent on each Ray node: one detached, named actor per node that starts and
watches the processes of every aisched task placed there.

A Ray actor per task would cost a fresh Ray worker process per task (about a second each, so a
16-task gang took ~10 s to start); the agent is started once per node, when the node is first
seen, and a task's start is one call to it. The task's CPUs, GPUs and memory are reserved in
Ray by its gang's placement group (see `ray_executor.py`); the agent holds no resources of its
own (`num_cpus=0`) and waits, before it starts a task, until that reservation is in place.

The agent also owns the node's CPU cores: a task gets `ceil(milli_cpu / 1000)` of the cores
this node may use, the least used first, as the local executor pins its tasks; a host task is
pinned by affinity and a container task gets them as its cpuset.

Invariants: a task (`key`) is started at most once per agent; `wait` returns exactly one
result per task; `forget` drops a task after its end was reported (killing what is left of it:
a task forgotten while running was abandoned by the scheduler, e.g. past its start timeout).
If the agent dies, its tasks die with it (parent-death signal), and their containers are
removed by their reapers (see `ray_task.py`).

Standard library and aisched's standard-library modules only: it runs inside a Ray worker,
which imports this module by name; the placement group it waits on is handed to it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from aisched.executors.base import least_used_cores
from aisched.executors.ray_task import MakeWatchdog, Result, TaskRunner

# How often a task waiting for its gang's reservation looks again (and at a stop meanwhile).
RESERVATION_POLL_S = 0.5


class NodeAgent:
    """The agent of one node (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: dict[tuple[str, int, str], TaskRunner] = {}
        self.cores_of: dict[tuple[str, int, str], tuple[int, ...]] = {}
        self.forgotten: set[tuple[str, int, str]] = set()
        self.node_cores = tuple(sorted(os.sched_getaffinity(0)))

    def ping(self) -> int:
        """The agent's pid, once it is up."""
        return os.getpid()

    def start(
        self,
        key: list[Any],
        spec: dict[str, Any] | None,
        gpu_watchdog: MakeWatchdog | None = None,
        placement_group: Any = None,
    ) -> dict[str, Any]:
        """Start the task (once; a repeated call answers as the first did). Waits first until
        `placement_group` (its gang's reservation; None: none) is in place. Returns {"pid",
        "cores"}, {"exit": Result} when it could not be executed, or {"unknown": True} when
        `spec` is None (adoption asks so) and no such task is known here, and from then on
        for that task (it is given up: never started here)."""
        k = _key(key)
        with self.lock:
            runner = self.tasks.get(k)
            if runner is None:
                if spec is None or k in self.forgotten:
                    # Adoption of a task never started here gives it up for good: a scheduler
                    # deposed between committing its launch and making it cannot start it now.
                    self.forgotten.add(k)
                    return {"unknown": True}
                cores = self._pick_cores(int(spec.get("milli_cpu") or 0))
                runner = TaskRunner({**spec, "cores": list(cores)}, gpu_watchdog)
                self.tasks[k] = runner
                self.cores_of[k] = cores
        if placement_group is not None:
            self._wait_reserved(runner, placement_group)
        # Stopped while it waited: start() ends it as "stopped before it started".
        started = runner.start()
        return {**started, "cores": list(self.cores_of.get(k, ()))}

    def wait(self, key: list[Any]) -> Result:
        """Blocks until the task has ended; its result."""
        return self._runner(key).wait()

    def status(self, key: list[Any]) -> Result | None:
        return self._runner(key).status()

    def stop(self, key: list[Any], grace_period_s: float) -> None:
        runner = self.tasks.get(_key(key))
        if runner is not None:
            runner.stop(grace_period_s)

    def gpu_memory(self, key: list[Any]) -> dict[str, Any]:
        return self._runner(key).gpu_memory()

    def forget(self, key: list[Any]) -> None:
        """The scheduler has what it needs of this task: drop it, killing what is left."""
        k = _key(key)
        with self.lock:
            runner = self.tasks.pop(k, None)
            self.cores_of.pop(k, None)
            self.forgotten.add(k)
        if runner is not None and not runner.done.is_set():
            runner.stop(0.0)

    def _runner(self, key: list[Any]) -> TaskRunner:
        runner = self.tasks.get(_key(key))
        if runner is None:
            raise KeyError(f"task {key} is not known to this node's agent")
        return runner

    def _wait_reserved(self, runner: TaskRunner, placement_group: Any) -> bool:
        """Until the gang's reservation is in place (True), or the task is stopped (False)."""
        while not runner.stop_requested:
            if placement_group.wait(timeout_seconds=RESERVATION_POLL_S):
                return True
        return False

    def _pick_cores(self, milli_cpu: int) -> tuple[int, ...]:
        """The node's cores for a task, counting those of the tasks still running here."""
        in_use = (
            c
            for k, cores in self.cores_of.items()
            if not self.tasks[k].done.is_set()
            for c in cores
        )
        return least_used_cores(self.node_cores, in_use, milli_cpu)


def _key(key: list[Any]) -> tuple[str, int, str]:
    return (str(key[0]), int(key[1]), str(key[2]))

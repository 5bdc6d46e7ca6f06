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

The agent is an asyncio actor: its calls are coroutines on one event loop, not threads. A
running task costs it an awaited `wait` (woken by the runner's end through `Latch.then`, from
the thread that saw the process end), and a start waiting for its reservation an awaited
`PlacementGroup.ready()`; so neither the number of tasks on a node nor the calls in flight
take threads of the agent's (the task's own process is still started and watched from a thread
of its runner: see `ray_task.py`). Nothing on the loop may block for long: a stop and a
GPU-memory reading (which may wait for the runner's lock while a container is being created; a
stop also signals a container through its engine) run in a small pool of threads
(`BLOCKING_THREADS`), shared by all tasks.

Invariants: a task (`key`) is started at most once per agent; `wait` returns exactly one
result per task; `forget` drops a task after its end was reported (killing what is left of it:
a task forgotten while running was abandoned by the scheduler, e.g. past its start timeout);
a start with `spec` None (adoption) of a task never started here gives it up for good.
If the agent dies, its tasks die with it (parent-death signal), and their containers are
removed by their reapers (see `ray_task.py`). It must never block its event loop on a task's
process, its container engine or Ray.

Standard library and aisched's standard-library modules only: it runs inside a Ray worker,
which imports this module by name; the placement group it waits on is handed to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aisched.executors import ray_limits, ray_shm
from aisched.executors.base import least_used_cores
from aisched.executors.ray_task import Latch, MakeWatchdog, Result, TaskRunner

# How often a task waiting for its gang's reservation looks at a stop meanwhile, and how often
# it asks Ray again about the reservation (after an error: at the next look).
RESERVATION_POLL_S = 0.5
RESERVATION_ASK_S = 10.0
# The threads that run the short blocking parts of stop and forget, for all tasks together.
BLOCKING_THREADS = 4


class NodeAgent:
    """The agent of one node (see the module docstring)."""

    def __init__(self) -> None:
        self.tasks: dict[tuple[str, int, str], TaskRunner] = {}
        self.cores_of: dict[tuple[str, int, str], tuple[int, ...]] = {}
        self.forgotten: set[tuple[str, int, str]] = set()
        self.node_cores = tuple(sorted(os.sched_getaffinity(0)))
        self.blocking = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="aisched-agent")

    async def ping(self) -> int:
        """The agent's pid, once it is up."""
        return os.getpid()

    async def start(
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
        # No await from the look to the registration: one runner per key.
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
            await _reserved(runner, placement_group)
        # Stopped while it waited: its start ends it as "stopped before it started".
        runner.begin()
        await _until(runner.started)
        return {**runner.start_result(), "cores": list(self.cores_of.get(k, ()))}

    async def wait(self, key: list[Any]) -> Result:
        """Until the task has ended; its result."""
        runner = self._runner(key)
        await _until(runner.done)
        assert runner.result is not None
        return runner.result

    async def status(self, key: list[Any]) -> Result | None:
        return self._runner(key).status()

    async def stop(self, key: list[Any], grace_period_s: float) -> None:
        runner = self.tasks.get(_key(key))
        if runner is not None:
            await self._stop(runner, grace_period_s)

    async def gpu_memory(self, key: list[Any]) -> dict[str, Any]:
        # Off the loop: it takes the runner's lock, held while its container is created.
        runner = self._runner(key)
        return await asyncio.get_running_loop().run_in_executor(self.blocking, runner.gpu_memory)

    async def forget(self, key: list[Any]) -> None:
        """The scheduler has what it needs of this task: drop it, killing what is left."""
        k = _key(key)
        runner = self.tasks.pop(k, None)
        self.cores_of.pop(k, None)
        self.forgotten.add(k)
        if runner is not None and not runner.done.is_set():
            await self._stop(runner, 0.0)

    async def sweep(self, instance: str, memory_limit: str) -> None:
        """Sweeps what a dead agent of this node left of `instance`'s tasks (their cgroups and
        what still runs in them, `ray_limits.sweep_after_agent_death`; their jobs' private
        /dev/shm mounts, `ray_shm.sweep_after_agent_death`), off the loop."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.blocking, _sweep_dead_agents, instance, memory_limit)

    def _runner(self, key: list[Any]) -> TaskRunner:
        runner = self.tasks.get(_key(key))
        if runner is None:
            raise KeyError(f"task {key} is not known to this node's agent")
        return runner

    async def _stop(self, runner: TaskRunner, grace_period_s: float) -> None:
        """`runner.stop`, off the loop: it may wait for the runner's lock (held while its
        container is created) and signal a container through its engine."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.blocking, runner.stop, grace_period_s)

    def _pick_cores(self, milli_cpu: int) -> tuple[int, ...]:
        """The node's cores for a task, counting those of the tasks still running here."""
        in_use = (
            c
            for k, cores in self.cores_of.items()
            if not self.tasks[k].done.is_set()
            for c in cores
        )
        return least_used_cores(self.node_cores, in_use, milli_cpu)


def _sweep_dead_agents(instance: str, memory_limit: str) -> None:
    ray_limits.sweep_after_agent_death(instance, memory_limit)  # first: nothing runs on in them
    ray_shm.sweep_after_agent_death(instance)


async def _reserved(runner: TaskRunner, placement_group: Any) -> bool:
    """Until the gang's reservation is in place (True), or the task is stopped (False). Ray
    answers `ready()` from the GCS, with no task and no thread of ours; it is asked again
    after an error (the group removed, the GCS away) and every `RESERVATION_ASK_S`, so an
    answer lost with a restarted GCS does not hold the task for good."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[Any] | None = None
    asked_at = 0.0
    while not runner.stop_requested:
        if ready is None or loop.time() - asked_at > RESERVATION_ASK_S:
            if ready is not None:
                ready.cancel()
            ready, asked_at = placement_group.ready().as_future(), loop.time()
        done, _ = await asyncio.wait([ready], timeout=RESERVATION_POLL_S)
        if done:
            if not ready.cancelled() and ready.exception() is None:
                return True
            ready = None
            await asyncio.sleep(RESERVATION_POLL_S)
    if ready is not None:
        ready.cancel()
    return False


async def _until(latch: Latch) -> None:
    """Until `latch` is set, woken by the thread that sets it."""
    loop = asyncio.get_running_loop()
    fired: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the agent is going away
            loop.call_soon_threadsafe(_resolve, fired)

    latch.then(wake)
    await fired


def _resolve(fired: asyncio.Future[None]) -> None:
    if not fired.done():
        fired.set_result(None)


def _key(key: list[Any]) -> tuple[str, int, str]:
    return (str(key[0]), int(key[1]), str(key[2]))

"""A fake executor (the httpx `MockTransport` pattern): it records what it is asked to do and
lets a test decide when and how each task ends. No processes, no threads, no clock.

`FakeExecutor.exit(key, code)` queues the task's exit for the next `poll`; `stop` records the
request and, unless the task was told to ignore SIGTERM (`stubborn`), ends it as STOPPED at the
next `poll`. `adopt` answers from what the fake knows, so a test can "restart the scheduler" by
building a new loop over the same store and the same fake.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aisched.executors.base import (
    AdoptState,
    ExecutorInfo,
    ExitKind,
    LaunchError,
    LaunchRefused,
    TaskExited,
    TaskHandle,
    TaskKey,
    TaskLaunch,
)
from aisched.model.cluster import GPU, Node


def fake_node(name: str = "box", gpus: int = 4, cpus: int = 16, mem_gib: int = 64) -> Node:
    return Node(
        name=name,
        milli_cpu=cpus * 1000,
        mem_mib=mem_gib * 1024,
        gpus=tuple(GPU(i, "fake", 16 * 1024) for i in range(gpus)),
    )


@dataclass
class FakeExecutor:
    node_list: Sequence[Node] = field(default_factory=lambda: (fake_node(),))
    launched: list[TaskLaunch] = field(default_factory=list)
    stops: list[TaskKey] = field(default_factory=list)
    running: dict[TaskKey, TaskLaunch] = field(default_factory=dict)
    # Tasks whose launch raises LaunchError, and tasks that ignore stop().
    fail_launch: set[str] = field(default_factory=set)
    refuse_launch: set[str] = field(default_factory=set)  # ... with LaunchRefused
    stubborn: set[TaskKey] = field(default_factory=set)
    # What `adopt` answers for a key it does not run (default LOST).
    gone: dict[TaskKey, TaskExited] = field(default_factory=dict)
    _events: list[TaskExited] = field(default_factory=list)
    _wakeup: Callable[[], None] | None = None

    def info(self) -> ExecutorInfo:
        return ExecutorInfo("fake", "none", False)

    def nodes(self) -> Sequence[Node]:
        return self.node_list

    def launch(self, req: TaskLaunch) -> TaskHandle:
        if req.task in self.fail_launch:
            raise LaunchError(f"cannot start {req.task}")
        if req.task in self.refuse_launch:
            raise LaunchRefused(f"{req.task} may never start here")
        if req.key in self.running:
            raise LaunchError(f"{req.key} launched twice")
        self.launched.append(req)
        self.running[req.key] = req
        return TaskHandle(req.key, req.node, {"fake": True})

    def stop(self, key: TaskKey, grace_period_s: float | None = None) -> None:
        self.stops.append(key)
        if key in self.running and key not in self.stubborn:
            del self.running[key]
            self._events.append(TaskExited(key, ExitKind.STOPPED, -15, "stopped"))

    def poll(self) -> list[TaskExited]:
        out, self._events = self._events, []
        return out

    def adopt(self, handle: TaskHandle) -> tuple[AdoptState, TaskExited | None]:
        if handle.key in self.running:
            return AdoptState.RUNNING, None
        ended = self.gone.get(handle.key)
        if ended is not None:
            return AdoptState.EXITED, ended
        return AdoptState.LOST, None

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup

    def close(self) -> None:
        pass

    # --- what a test does -------------------------------------------------------------------

    def exit(self, key: TaskKey, code: int = 0, kind: ExitKind = ExitKind.EXITED) -> None:
        """The task ends by itself with `code` (reported at the next poll)."""
        self.running.pop(key)
        self._events.append(TaskExited(key, kind, code, ""))

    def crash_while_down(self, key: TaskKey, code: int) -> None:
        """The task ended while no scheduler was watching: `adopt` will say EXITED."""
        self.running.pop(key)
        self.gone[key] = TaskExited(key, ExitKind.EXITED, code, "")

    def keys(self, job_id: str) -> list[TaskKey]:
        return sorted(k for k in self.running if k[0] == job_id)

"""A fake executor on a virtual clock that plays task ends with the simulator's own rules.

Each job (known by name) has a plan: its runtime with every task, its checkpoint interval and
its played failures. A launched attempt runs `lifecycle.work.attempt_runtime_s` (a restore
first after any interruption, then the work left, slower for an elastic job short of tasks),
or fails at its next planned failure (`planned_end_s`), exactly as `sim.engine` plays it; a
stopped or failed attempt keeps the work up to its last checkpoint (`kept_work_s`). Every task
of an attempt ends at the same instant. A stop ends a task `stop_s` after it (capped by the
grace period it is given: `lifecycle.preemption.played_stop_s`), at the next poll when that is
0, as a real SIGTERM to a task that exits at once would; a task that ends by itself meanwhile
ends then (a failure then is not counted: the lifecycle counts none for a preempted attempt).
No processes, no threads: the test moves the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aisched.executors.base import (
    AdoptState,
    ExecutorInfo,
    ExitKind,
    LaunchError,
    TaskExited,
    TaskHandle,
    TaskKey,
    TaskLaunch,
)
from aisched.lifecycle.preemption import played_stop_s
from aisched.lifecycle.work import (
    attempt_runtime_s,
    elastic_speed,
    fails,
    kept_work_s,
    planned_end_s,
)
from aisched.model.cluster import Node


@dataclass(frozen=True, slots=True)
class Plan:
    duration_s: float
    num_tasks: int
    elastic: bool
    checkpoint_interval_s: float
    fail_after_s: tuple[float, ...] = ()


@dataclass(slots=True)
class _Attempt:
    start_s: float
    restore_s: float
    speed: float
    end_s: float
    failing: bool
    stopped: bool = False
    stop_at: float = math.inf  # when a delayed stop ends its tasks


@dataclass
class VirtualExecutor:
    node_list: Sequence[Node]
    clock: Callable[[], float]
    plans: dict[str, Plan]  # by job name
    restart_cost_s: float = 0.0
    stop_s: float = 0.0  # how long a task takes to exit after a stop (its grace caps it)
    # For jobs the test did not name (a service's replicas, made by the loop).
    replica_plan: Plan | None = None
    running: dict[TaskKey, TaskLaunch] = field(default_factory=dict)
    saved_s: dict[str, float] = field(default_factory=dict)  # by job id
    failures: dict[str, int] = field(default_factory=dict)  # by job id
    names: dict[str, str] = field(default_factory=dict)  # job id -> name
    attempts: dict[tuple[str, int], _Attempt] = field(default_factory=dict)
    _events: list[TaskExited] = field(default_factory=list)

    def info(self) -> ExecutorInfo:
        return ExecutorInfo("virtual", "none", False)

    def nodes(self) -> Sequence[Node]:
        return self.node_list

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        pass

    def close(self) -> None:
        pass

    def launch(self, req: TaskLaunch) -> TaskHandle:
        if req.key in self.running:
            raise LaunchError(f"{req.key} launched twice")
        job_id = req.job_id
        plan = self._plan(job_id)
        a = self.attempts.get((job_id, req.attempt))
        if a is None:
            now = self.clock()
            world = int(req.env["WORLD_SIZE"])
            speed = elastic_speed(world, plan.num_tasks) if plan.elastic else 1.0
            restore = self.restart_cost_s if req.attempt > 1 else 0.0
            saved = self.saved_s.get(job_id, 0.0)
            runtime = attempt_runtime_s(plan.duration_s, saved, restore, speed)
            failures = self.failures.get(job_id, 0)
            took = planned_end_s(runtime, plan.fail_after_s, failures)
            failing = fails(runtime, plan.fail_after_s, failures)
            a = _Attempt(now, restore, speed, now + took, failing)
            self.attempts[(job_id, req.attempt)] = a
        self.running[req.key] = req
        return TaskHandle(req.key, req.node, {"virtual": True})

    def _plan(self, job_id: str) -> Plan:
        name = self.names.get(job_id)
        if name is None and self.replica_plan is not None:
            return self.replica_plan
        return self.plans[self.names[job_id]]

    def _keep(self, job_id: str, attempt: int) -> None:
        a = self.attempts[(job_id, attempt)]
        if a.stopped:
            return
        a.stopped = True
        plan = self._plan(job_id)
        self.saved_s[job_id] = kept_work_s(
            self.saved_s.get(job_id, 0.0),
            self.clock() - a.start_s,
            plan.checkpoint_interval_s,
            a.restore_s,
            a.speed,
            plan.duration_s,
        )

    def stop(self, key: TaskKey, grace_period_s: float | None = None) -> None:
        if key not in self.running:
            return
        delay = played_stop_s(math.inf if grace_period_s is None else grace_period_s, self.stop_s)
        if delay > 0:
            a = self.attempts[(key[0], key[1])]
            a.stop_at = min(a.stop_at, self.clock() + delay)
            return
        del self.running[key]
        self._keep(key[0], key[1])
        self._events.append(TaskExited(key, ExitKind.STOPPED, -15, "stopped", self.clock()))

    def next_end_s(self) -> float:
        """When the next running attempt ends by itself (`inf` when none will)."""
        ends = [
            min(a.end_s, a.stop_at) for a in (self.attempts[(k[0], k[1])] for k in self.running)
        ]
        return min(ends, default=math.inf)

    def poll(self) -> list[TaskExited]:
        now = self.clock()
        out, self._events = self._events, []
        for key in sorted(self.running):
            job_id, attempt, _ = key
            a = self.attempts[(job_id, attempt)]
            if min(a.end_s, a.stop_at) > now:
                continue
            del self.running[key]
            if a.end_s > now:  # the stop comes first
                self._keep(job_id, attempt)
                out.append(TaskExited(key, ExitKind.STOPPED, -15, "stopped", now))
            elif a.failing:
                if not a.stopped and a.stop_at == math.inf:
                    self.failures[job_id] = self.failures.get(job_id, 0) + 1
                self._keep(job_id, attempt)
                out.append(TaskExited(key, ExitKind.EXITED, 1, "", now))
            else:
                a.stopped = True
                self.saved_s[job_id] = self._plan(job_id).duration_s
                out.append(TaskExited(key, ExitKind.EXITED, 0, "", now))
        return out

    def adopt(self, handle: TaskHandle) -> tuple[AdoptState, TaskExited | None]:
        if handle.key in self.running:
            return AdoptState.RUNNING, None
        return AdoptState.LOST, None

"""A harness around real LocalExecutors: launch real commands, wait for their real exits.

Every executor a test makes is closed at the end, and every process a test's tasks left (a test
that fails halfway, a supervisor killed on purpose) is killed, so no test leaks processes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aisched.executors import processes, task_files
from aisched.executors.base import TaskExited, TaskHandle, TaskKey, TaskLaunch, TaskPlace
from aisched.executors.base import contract_env as make_contract_env
from aisched.executors.cgroups import (
    MemoryControlError,
    choose_memory_control,
    release_base,
    release_bounds,
)
from aisched.executors.local import LocalExecutor
from aisched.model.cluster import GPU, Node

NODE = Node(
    "local-test", milli_cpu=2000, mem_mib=4096, gpus=(GPU(0, "declared"), GPU(1, "declared"))
)
PY = sys.executable


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def available_mechanisms() -> dict[str, str | None]:
    """mechanism -> None when usable here, else why not."""
    out: dict[str, str | None] = {}
    for m in ("cgroup-v2", "cgroup-v1", "rlimit"):
        try:
            choose_memory_control(m)
            out[m] = None
        except MemoryControlError as exc:
            out[m] = str(exc)
    return out


MECHANISMS = available_mechanisms()


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.made: list[LocalExecutor] = []
        self.defaults: dict[str, object] = {}
        self.supervisors: set[tuple[int, int]] = set()
        self.ex = self.new_executor()

    def new_executor(self, **kw: object) -> LocalExecutor:
        """A new executor on the same state directory (as after a restart of the scheduler)."""
        ex = LocalExecutor(self.state, NODE, **{**self.defaults, **kw})  # type: ignore[arg-type]
        self.made.append(ex)
        self.ex = ex
        self.events: dict[TaskKey, TaskExited] = {}
        self.woken = threading.Event()
        ex.set_wakeup(self.woken.set)
        return ex

    def contract_env(self, task: str, milli_cpu: int, gpus: tuple[int, ...] = ()) -> dict[str, str]:
        return make_contract_env(
            job_id="j1",
            places=[TaskPlace(task, NODE.name, gpus, milli_cpu)],
            rank=0,
            restart_count=0,
            checkpoint_dir=str(self.tmp / "ckpt"),
            master_addr="127.0.0.1",
            master_port=29500,
        )

    def launch(
        self,
        task: str,
        command: list[str],
        *,
        milli_cpu: int = 1000,
        mem_limit_mib: int = 0,
        grace_period_s: float = 5.0,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        gpus: tuple[int, ...] = (),
        attempt: int = 0,
        node: str = NODE.name,
    ) -> TaskHandle:
        full_env = {**self.contract_env(task, milli_cpu, gpus), "PATH": os.environ["PATH"]}
        full_env.update(env or {})
        handle = self.ex.launch(
            TaskLaunch(
                job_id="j1",
                attempt=attempt,
                task=task,
                node=node,
                command=tuple(command),
                env=full_env,
                workdir=workdir,
                milli_cpu=milli_cpu,
                mem_limit_mib=mem_limit_mib,
                gpus=gpus,
                log_path=str(self.log_path(task)),
                grace_period_s=grace_period_s,
            )
        )
        self.supervisors.add((handle.data["supervisor_pid"], handle.data["supervisor_start"]))
        return handle

    def log_path(self, task: str) -> Path:
        return self.tmp / "logs" / f"{task}.log"

    def log(self, task: str) -> str:
        return self.log_path(task).read_text()

    def exit_of(self, key: TaskKey, timeout: float = 20.0) -> TaskExited:
        """The task's exit, through `poll` (woken by the executor's wakeup callback)."""
        deadline = time.monotonic() + timeout
        while key not in self.events:
            for ev in self.ex.poll():
                assert ev.key not in self.events, f"second exit for {ev.key}"
                self.events[ev.key] = ev
            if key in self.events:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"no exit for {key} within {timeout} s")
            self.woken.wait(0.2)
            self.woken.clear()
        return self.events[key]

    def started(self, key: TaskKey) -> dict[str, int]:
        path = self.ex.task_dir(key) / task_files.STARTED
        wait_for(path.exists, what=f"{path.name} of {key}")
        data = task_files.read_json(str(path))
        assert data is not None
        return data

    def cleanup(self) -> None:
        for ex in self.made:
            ex.close()
        for launch in self.state.glob("*/*/*/" + task_files.LAUNCH):
            owner = task_files.read_lock_owner(str(launch.parent))
            if owner is not None:
                self.supervisors.add(owner)
        for pid, start in self.supervisors:
            st = processes.proc_stat(pid)
            if st is None or st.start != start:
                continue
            if st.state not in ("Z", "X"):
                os.kill(pid, 9)
            if st.ppid == os.getpid():  # reap our own: no zombies left behind
                os.waitpid(pid, 0)
        for launch in self.state.glob("*/*/*/" + task_files.LAUNCH):
            tdir = str(launch.parent)
            owner = task_files.read_lock_owner(tdir)
            started = task_files.read_json(os.path.join(tdir, task_files.STARTED)) or {}
            rec = task_files.read_json(str(launch)) or {}
            processes.kill_leftovers(
                sup_pid=owner[0] if owner else None,
                sup_start=owner[1] if owner else None,
                child_pid=started.get("child_pid"),
                child_start=started.get("child_start"),
                cgroup=rec.get("cgroup"),
            )
            processes.remove_task_cgroups(rec)
        for ex in self.made:  # the parent cgroups too, once empty (a killed scheduler's stay)
            release_base(ex.memory_control)
            release_bounds(ex.task_bounds)

"""The GPU-memory watchdog: per-task sums over NVML's per-process readings (fed through the
injected reading function, or a fake NVML module below discovery), its inactive state and
why, and the local executor stopping or only reporting a task above its declared GPU memory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from executor_harness import NODE, Harness
from test_discovery import H100, FakeNvml, nvml  # noqa: F401  (nvml is a fixture)

from aisched.executors.base import ExitKind, TaskLaunch
from aisched.executors.discovery import nvml_unavailable
from aisched.executors.gpu_watchdog import (
    GpuMemoryWatchdog,
    GpuProcesses,
    OverAction,
    OverLimit,
    TaskGpuMemory,
    WatchdogState,
    WatchedTask,
    nvml_state,
    over_limit,
    task_pids,
)
from aisched.executors.processes import ProcStat

ACTIVE = WatchdogState(True, "active: test readings")
A, B = ("j1", 0, "a-0"), ("j2", 0, "b-0")


def reading(fixed: GpuProcesses) -> Callable[[Iterable[int]], GpuProcesses]:
    """A reading function that answers like `discovery.gpu_memory`: GPUs it was asked for."""

    def read(indices: Iterable[int]) -> GpuProcesses:
        return {i: fixed[i] for i in indices if i in fixed}

    return read


def test_usage_is_summed_over_the_tasks_own_processes_on_its_own_gpus() -> None:
    # Two tasks share GPU 0; task a also has GPU 1; pid 99 is nobody's.
    read = reading({0: [(10, 3000), (20, 500), (99, 700)], 1: [(11, 1000)], 2: [(10, 9999)]})
    wd = GpuMemoryWatchdog(read, ACTIVE)
    got = wd.measure(
        [
            WatchedTask(A, (0, 1), 3500, frozenset({10, 11})),
            WatchedTask(B, (0,), 0, frozenset({20})),
            WatchedTask(("j3", 0, "cpu-0"), (), 0, frozenset({30})),
        ]
    )
    assert got == [
        TaskGpuMemory(A, 4000, 3500, ((0, 10, 3000), (1, 11, 1000))),
        TaskGpuMemory(B, 500, 0, ((0, 20, 500),)),
    ]
    assert [u.over for u in got] == [True, False]  # no declared amount: reported, never over
    assert got[0].describe() == (
        "uses 4000 MiB of GPU memory (declared 3500 MiB): pid 10 3000 MiB on GPU 0, "
        "pid 11 1000 MiB on GPU 1"
    )


def test_an_inactive_watchdog_reads_nothing_and_says_why() -> None:
    def never(indices: Iterable[int]) -> GpuProcesses:
        raise AssertionError("an inactive watchdog must not read")

    state = nvml_state(lambda: "nvidia-ml-py (pynvml) is not installed")
    assert state == WatchdogState(False, "inactive: nvidia-ml-py (pynvml) is not installed")
    wd = GpuMemoryWatchdog(never, state)
    assert wd.measure([WatchedTask(A, (0,), 1, frozenset({1}))]) == []


def test_on_this_machine_the_state_matches_what_nvml_answers() -> None:
    state = nvml_state()
    why = nvml_unavailable()
    assert state.active == (why is None)
    assert state.reason.startswith("active" if why is None else f"inactive: {why}")


@pytest.mark.parametrize(
    ("fake", "want"),
    [
        (None, WatchdogState(False, "inactive: nvidia-ml-py (pynvml) is not installed")),
        (
            FakeNvml([H100], fail="nvmlInit"),
            WatchdogState(False, "inactive: NVML did not initialise (no NVIDIA driver?)"),
        ),
    ],
    ids=["no-package", "no-driver"],
)
def test_without_nvml_it_is_inactive(
    nvml: Callable[[FakeNvml | None], None],  # noqa: F811
    fake: FakeNvml | None,
    want: WatchdogState,
) -> None:
    nvml(fake)
    assert GpuMemoryWatchdog.with_nvml().state == want


def test_with_nvml_it_reads_per_process_memory(nvml: Callable[[FakeNvml | None], None]) -> None:  # noqa: F811
    nvml(FakeNvml([H100, H100]))  # GPU 0: pid 4242 holds 2 GiB
    wd = GpuMemoryWatchdog.with_nvml(OverAction.STOP)
    assert wd.active
    got = wd.measure([WatchedTask(A, (0,), 1024, frozenset({4242}))])
    assert got == [TaskGpuMemory(A, 2048, 1024, ((0, 4242, 2048),))]
    assert got[0].over


def test_over_limit_stops_at_every_check_or_warns_the_task_once() -> None:
    over = TaskGpuMemory(A, 3000, 2048, ((0, 10, 3000),))
    within = TaskGpuMemory(B, 500, 1024, ((0, 20, 500),))
    undeclared = TaskGpuMemory(("j3", 0, "c-0"), 9000, 0, ((0, 30, 9000),))
    usage = [over, within, undeclared]
    said = "uses 3000 MiB of GPU memory (declared 2048 MiB): pid 10 3000 MiB on GPU 0"
    stop = OverLimit(over, True, f"stopped: the task {said}", f"task j1/0/a-0 {said}: stopping it")
    reported: set[tuple[str, int, str]] = set()
    assert over_limit(usage, OverAction.STOP, reported) == [stop]
    assert over_limit(usage, OverAction.STOP, reported) == [stop]
    assert reported == set()

    warn = OverLimit(over, False, f"warning: the task {said}", f"task j1/0/a-0 {said}")
    assert over_limit(usage, OverAction.REPORT, reported) == [warn]
    assert reported == {A}
    # Still over: the scheduler's log hears of it again, the task's own log does not.
    assert over_limit(usage, OverAction.REPORT, reported) == [
        OverLimit(over, False, None, f"task j1/0/a-0 {said}")
    ]


def test_a_tasks_processes_are_its_process_group() -> None:
    procs = [ProcStat(pid, "S", 1, pgid, pgid, 0, 0) for pid, pgid in [(7, 7), (8, 7), (9, 9)]]
    assert task_pids(7, procs) == frozenset({7, 8})
    assert task_pids(5, procs) == frozenset()


# --- wired into the local executor ------------------------------------------------------------


def launch_on_gpu(harness: Harness, task: str, gpu_mem_mib: int) -> TaskLaunch:
    req = TaskLaunch(
        job_id="j1",
        attempt=0,
        task=task,
        node=NODE.name,
        command=("sleep", "30"),
        env=harness.contract_env(task, 1000, (0,)),
        workdir=None,
        milli_cpu=1000,
        mem_limit_mib=0,
        gpus=(0,),
        log_path=str(harness.log_path(task)),
        grace_period_s=1.0,
        gpu_mem_mib=gpu_mem_mib,
    )
    harness.ex.launch(req)
    return req


def watching(harness: Harness, action: OverAction, mib: int) -> None:
    """An executor whose watchdog sees every process of task g-0 holding `mib` on GPU 0."""

    def read(indices: Iterable[int]) -> GpuProcesses:
        child = harness.started(("j1", 0, "g-0"))["child_pid"]
        return {0: [(child, mib)]} if 0 in indices else {}

    harness.new_executor(gpu_watchdog=GpuMemoryWatchdog(read, ACTIVE, action))


@pytest.mark.parametrize("action", [OverAction.STOP, OverAction.REPORT])
def test_a_task_above_its_declared_gpu_memory_is_stopped_or_reported(
    harness: Harness, action: OverAction
) -> None:
    watching(harness, action, mib=3000)
    req = launch_on_gpu(harness, "g-0", gpu_mem_mib=2048)
    harness.started(req.key)
    (usage,) = harness.ex.check_gpu_memory()
    assert (usage.key, usage.used_mib, usage.limit_mib, usage.over) == (req.key, 3000, 2048, True)
    if action == OverAction.STOP:
        ev = harness.exit_of(req.key)
        assert ev.kind == ExitKind.STOPPED
        assert harness.log("g-0").startswith(
            "aisched: stopped: the task uses 3000 MiB of GPU memory (declared 2048 MiB)"
        )
    else:
        assert harness.ex.poll() == []  # still running
        assert harness.ex.check_gpu_memory()[0].over  # still over: warned once only
        assert harness.log("g-0") == (
            "aisched: warning: the task uses 3000 MiB of GPU memory (declared 2048 MiB): "
            f"pid {harness.started(req.key)['child_pid']} 3000 MiB on GPU 0\n"
        )


def test_a_task_within_its_gpu_memory_keeps_running(harness: Harness, tmp_path: Path) -> None:
    watching(harness, OverAction.STOP, mib=1000)
    req = launch_on_gpu(harness, "g-0", gpu_mem_mib=2048)
    harness.started(req.key)
    (usage,) = harness.ex.check_gpu_memory()
    assert (usage.used_mib, usage.over) == (1000, False)
    assert harness.ex.poll() == []
    assert "GPU-memory watchdog active: test readings" in harness.ex.info().notes

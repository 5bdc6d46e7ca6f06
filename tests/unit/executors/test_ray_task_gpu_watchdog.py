"""The GPU-memory watchdog of a Ray task, in the code that runs on its node (`TaskRunner`):
a real process, with per-pid GPU-memory readings injected through the watchdog's reading
function (Ray itself is not needed here; tests/ray runs the same code on a Ray cluster)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from aisched.executors.gpu_watchdog import (
    GpuMemoryWatchdog,
    GpuProcesses,
    OverAction,
    TaskGpuMemory,
    WatchdogState,
)
from aisched.executors.ray_task import TaskRunner

ACTIVE = WatchdogState(True, "active: test readings")
KEY = ("j1", 0, "g-0")


class Readings:
    """GPU 0 as NVML would show it: the task's first process holds `mib`."""

    def __init__(self, mib: int) -> None:
        self.mib = mib
        self.pid = 0

    def __call__(self, indices: Iterable[int]) -> GpuProcesses:
        return {0: [(self.pid, self.mib), (1, 777)]} if 0 in indices else {}


def task_spec(tmp_path: Path) -> dict[str, Any]:
    """A Ray task's launch spec: a sleeper on GPU 0 that declared 2 GiB of GPU memory."""
    return {
        "command": ["sleep", "30"],
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "workdir": None,
        "log_path": str(tmp_path / "g-0.log"),
        "grace_period_s": 1.0,
        "key": list(KEY),
        "gpus": [0],
        "gpu_mem_mib": 2048,
        "gpu_check_s": 0.05,
    }


def runner(tmp_path: Path, readings: Readings, action: OverAction | None) -> TaskRunner:
    spec = task_spec(tmp_path)
    make = None if action is None else (lambda: GpuMemoryWatchdog(readings, ACTIVE, action))
    r = TaskRunner(spec, make)
    started = r.start()
    readings.pid = started["pid"]
    return r


def wait_for_usage(r: TaskRunner) -> dict[str, Any]:
    """The first reading that shows the task's process (one taken before `runner` set the
    readings' pid shows none of it, and no report)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = r.gpu_memory()
        if got["usage"] is not None and got["usage"].by_process:
            return got
        time.sleep(0.02)
    raise AssertionError("no GPU-memory reading within 10 s")


def test_above_its_declared_gpu_memory_a_task_is_stopped_with_the_reason_in_its_log(
    tmp_path: Path,
) -> None:
    r = runner(tmp_path, Readings(3000), OverAction.STOP)
    result = r.wait()
    assert (result["kind"], result["exit_code"]) == ("stopped", -15)
    pid = r.proc.pid if r.proc else 0
    said = f"uses 3000 MiB of GPU memory (declared 2048 MiB): pid {pid} 3000 MiB on GPU 0"
    assert (tmp_path / "g-0.log").read_text().splitlines()[:2] == [
        f"aisched: stopped: the task {said}",
        "aisched: stop requested: SIGTERM, then SIGKILL after 1 s",
    ]
    got = r.gpu_memory()
    assert got["state"] == "active: test readings"
    assert got["usage"] == TaskGpuMemory(KEY, 3000, 2048, ((0, pid, 3000),))
    # Lines for the scheduler's log not fetched before the end come with the result.
    assert got["reports"] == []
    assert result["gpu_reports"][0] == f"task j1/0/g-0 {said}: stopping it"


@pytest.mark.parametrize("mib", [3000, 1000], ids=["over", "within"])
def test_under_report_or_within_its_memory_a_task_keeps_running(tmp_path: Path, mib: int) -> None:
    r = runner(tmp_path, Readings(mib), OverAction.REPORT)
    try:
        first = wait_for_usage(r)
        time.sleep(0.2)  # several checks more
        assert r.status() is None  # still running
        later = r.gpu_memory()
        pid = r.proc.pid if r.proc else 0
        said = f"uses {mib} MiB of GPU memory (declared 2048 MiB): pid {pid} {mib} MiB on GPU 0"
        log = (tmp_path / "g-0.log").read_text()
        if mib > 2048:
            # Its own log is warned once; the scheduler's log at every check.
            assert log == f"aisched: warning: the task {said}\n"
            assert first["reports"][0] == f"task j1/0/g-0 {said}"
            assert later["reports"] and set(later["reports"]) == {f"task j1/0/g-0 {said}"}
        else:
            assert log == ""
            assert first["reports"] == later["reports"] == []
        assert later["usage"] == TaskGpuMemory(KEY, mib, 2048, ((0, pid, mib),))
    finally:
        r.stop(0)
        r.wait()


def test_without_nvml_or_a_watchdog_nothing_is_read(tmp_path: Path) -> None:
    def never(indices: Iterable[int]) -> GpuProcesses:
        raise AssertionError("an inactive watchdog must not read")

    off = WatchdogState(False, "inactive: NVML did not initialise (no NVIDIA driver?)")
    spec = task_spec(tmp_path)
    inactive = TaskRunner(spec, lambda: GpuMemoryWatchdog(never, off, OverAction.STOP))
    unwatched = TaskRunner({**spec, "log_path": str(tmp_path / "u.log")})
    for r in (inactive, unwatched):
        r.start()
    deadline = time.monotonic() + 10
    while inactive.gpu_memory()["state"] is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert inactive.gpu_memory() == {"state": off.reason, "usage": None, "reports": []}
    assert unwatched.gpu_memory() == {"state": None, "usage": None, "reports": []}
    for r in (inactive, unwatched):
        assert r.status() is None
        r.stop(0)
        assert r.wait()["kind"] == "stopped"

"""The local executor with real processes and real signals: what a task sees, how each kind of
end is reported, stops, memory limits, and taking tasks over after the scheduler died."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from executor_harness import MECHANISMS, NODE, PY, Harness, wait_for

from aisched.executors import local, processes, task_files
from aisched.executors import supervisor as sup
from aisched.executors.base import (
    AdoptState,
    ExitKind,
    LaunchError,
    TaskExited,
    TaskHandle,
    TaskLaunch,
)
from aisched.executors.cgroups import (
    MemoryControl,
    MemoryControlError,
    TaskBounds,
    all_tasks_pids_max,
    bound_cgroups,
    create_bounds,
    create_task_cgroup,
    release_base,
    release_bounds,
)
from aisched.executors.local import MEMORY_STEP, SUPERVISOR_SCRIPT, LocalExecutor, _launch_error

USABLE = sorted(os.sched_getaffinity(0))
SHOW = (
    "import json, os; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(),"
    " 'cores': sorted(os.sched_getaffinity(0))}))"
)


def gone(pid: int) -> bool:
    st = processes.proc_stat(pid)
    return st is None or st.state in ("Z", "X")


def exited(h: TaskHandle, kind: ExitKind, code: int | None, message: str, ev: TaskExited) -> bool:
    """`ev` is exactly this end (its time aside)."""
    return ev == TaskExited(h.key, kind, code, message, ev.time_s)


# --- what a task sees ------------------------------------------------------------------------


@pytest.mark.parametrize(("milli_cpu", "pinned"), [(1000, 1), (0, len(USABLE))])
def test_a_task_gets_exactly_its_env_its_workdir_and_its_cores(
    harness: Harness, tmp_path: Path, milli_cpu: int, pinned: int
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    mine = {"MY_VAR": "a b", "LANG": "C.UTF-8"}
    h = harness.launch(
        "show-0", [PY, "-c", SHOW], env=mine, workdir=str(workdir), milli_cpu=milli_cpu
    )
    ev = harness.exit_of(h.key)
    assert exited(h, ExitKind.EXITED, 0, "exited with code 0", ev)
    seen = json.loads(harness.log("show-0"))
    want_env = {**harness.contract_env("show-0", milli_cpu), "PATH": os.environ["PATH"], **mine}
    want_cores = h.data["cores"] or USABLE
    assert seen == {"env": want_env, "cwd": str(workdir), "cores": want_cores}
    assert len(want_cores) == pinned


@pytest.mark.skipif(len(USABLE) < 2, reason="needs at least 2 usable cores")
def test_tasks_get_distinct_cores_while_there_are_enough(harness: Harness) -> None:
    first = [harness.launch(f"w-{i}", ["sleep", "30"]) for i in range(len(USABLE))]
    assert sorted(c for h in first for c in h.data["cores"]) == USABLE
    # Every core has one task now: the next goes to the lowest id; a 2-CPU one takes two.
    assert harness.launch("extra-0", ["sleep", "30"]).data["cores"] == USABLE[:1]
    wide = harness.launch("wide-0", ["sleep", "30"], milli_cpu=1500)
    assert wide.data["cores"] == (USABLE[:2] if len(USABLE) == 2 else USABLE[1:3])
    # An adopted task's cores still count.
    harness.new_executor()
    for h in [*first]:
        assert harness.ex.adopt(h) == (AdoptState.RUNNING, None)
    assert harness.launch("after-0", ["sleep", "30"]).data["cores"] == USABLE[:1]


@pytest.mark.skipif(len(USABLE) < 2, reason="needs at least 2 usable cores")
@pytest.mark.parametrize("milli_cpu", [1000, 0])
def test_a_task_s_supervisor_runs_on_the_task_s_cores(any_watch: Harness, milli_cpu: int) -> None:
    # The supervisor copies the task's output, at a cost in CPU that grows with what the task
    # writes: it ran on every core, taking from other tasks' cores what its own task printed.
    h = any_watch.launch("t-0", ["sleep", "30"], milli_cpu=milli_cpu)
    started = any_watch.started(h.key)
    want = set(h.data["cores"] or USABLE)  # a task asking no CPU is not pinned: nor is this
    assert os.sched_getaffinity(started["child_pid"]) == want
    assert os.sched_getaffinity(started["supervisor_pid"]) == want
    assert len(want) == (1 if milli_cpu else len(USABLE))


@pytest.mark.skipif(os.geteuid() != 0, reason="the larger pipe is asked for by root only")
def test_a_root_supervisor_gives_its_task_a_larger_output_pipe(harness: Harness) -> None:
    # A task that writes without pause was copied 64 KiB at a time, each read with its own
    # select and wait calls: a larger pipe lets the supervisor copy more per read.
    h = harness.launch("t-0", ["sleep", "30"])
    child = harness.started(h.key)["child_pid"]
    fd = os.open(f"/proc/{child}/fd/1", os.O_WRONLY | os.O_NONBLOCK)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) == sup.PIPE_SIZE
    finally:
        os.close(fd)


def test_a_task_writing_without_pause_is_stopped_and_its_log_stays_capped(
    harness: Harness,
) -> None:
    harness.new_executor(log_max_bytes=64 << 10, log_max_files=2)
    h = harness.launch("t-0", ["yes", "y" * 99])
    log = harness.log_path("t-0")
    rotated = Path(f"{log}.1")
    wait_for(rotated.exists, what="the log's first rotation")
    harness.ex.stop(h.key, grace_period_s=1)
    assert harness.exit_of(h.key).kind == ExitKind.STOPPED
    assert sorted(p.name for p in log.parent.iterdir()) == ["t-0.log", "t-0.log.1"]
    assert all(p.stat().st_size <= 64 << 10 for p in (log, rotated))
    assert log.read_text().startswith("aisched: log rotated (")
    for path in (rotated, log):
        # The task's lines, between the supervisor's own (a rotation cuts the lines at its
        # ends, a kill the last one).
        output = [ln for ln in path.read_text().splitlines() if not ln.startswith("aisched: ")]
        assert set(output[1:-1]) == {"y" * 99}


# --- how tasks end ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "code", "message"),
    [
        ("exit 0", 0, "exited with code 0"),
        ("exit 3", 3, "exited with code 3"),
        ("kill -9 $$", -9, "killed by signal 9 (SIGKILL)"),
        ("kill -SEGV $$", -11, "killed by signal 11 (SIGSEGV)"),
    ],
)
def test_exit_codes_and_signal_deaths(
    any_watch: Harness, script: str, code: int, message: str
) -> None:
    h = any_watch.launch("t-0", ["sh", "-c", script])
    assert exited(h, ExitKind.EXITED, code, message, any_watch.exit_of(h.key))


# A program that is not found is so for good (unrunnable: not retried); the others are
# reported as exits, retried as any failure.
@pytest.mark.parametrize(
    ("command", "workdir", "kind", "code", "message"),
    [
        (
            ["no-such-command-xyz"],
            None,
            ExitKind.UNRUNNABLE,
            127,
            "command not found: no-such-command-xyz",
        ),
        (["/no/such/file"], None, ExitKind.UNRUNNABLE, 127, "no such file: /no/such/file"),
        (
            ["{tmp}/not-executable"],
            None,
            ExitKind.EXITED,
            126,
            "cannot run {tmp}/not-executable: permission denied",
        ),
        (
            ["true"],
            "/no/such/dir",
            ExitKind.EXITED,
            126,
            "cannot run true: working directory /no/such/dir: No such file or directory",
        ),
    ],
    ids=["not-found", "no-such-file", "not-executable", "bad-workdir"],
)
def test_a_command_that_cannot_run_ends_with_127_or_126_and_says_why(
    harness: Harness,
    tmp_path: Path,
    command: list[str],
    workdir: str | None,
    kind: ExitKind,
    code: int,
    message: str,
) -> None:
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    command = [c.format(tmp=tmp_path) for c in command]
    message = message.format(tmp=tmp_path)
    h = harness.launch("t-0", command, workdir=workdir)
    assert exited(h, kind, code, message, harness.exit_of(h.key))
    assert harness.log("t-0") == f"aisched: {message}\n"


def test_processes_the_task_leaves_behind_are_killed(harness: Harness, tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    script = f"(trap '' TERM; exec sleep 60) & echo $! > {pidfile}; exit 0"
    h = harness.launch("t-0", ["sh", "-c", script])
    assert exited(h, ExitKind.EXITED, 0, "exited with code 0", harness.exit_of(h.key))
    orphan = int(pidfile.read_text())
    wait_for(lambda: gone(orphan), what="the orphaned grandchild to die")


def test_the_wakeup_callback_is_called_when_a_task_ends(harness: Harness) -> None:
    woken = threading.Event()
    harness.ex.set_wakeup(woken.set)
    h = harness.launch("t-0", ["true"])
    assert woken.wait(20)
    assert [ev.key for ev in harness.ex.poll()] == [h.key]
    assert harness.ex.poll() == []


def test_a_launch_restarts_a_fork_server_that_died(harness: Harness) -> None:
    server = harness.ex._fork_server
    assert server is not None and server._proc is None  # started by the first launch
    first = harness.launch("t-0", ["true"])
    assert harness.exit_of(first.key).exit_code == 0
    assert server._proc is not None
    server._proc.kill()
    server._proc.wait()
    second = harness.launch("t-1", ["sh", "-c", "exit 4"])
    assert harness.exit_of(second.key).exit_code == 4
    assert server._proc is not None and server._proc.poll() is None


def test_supervisors_forked_by_the_fork_server_outlive_it(harness: Harness) -> None:
    h = harness.launch("t-0", ["sleep", "60"])
    assert harness.ex._fork_server is not None
    harness.ex._fork_server.close()
    assert processes.is_alive(h.data["supervisor_pid"], h.data["supervisor_start"])
    harness.ex.stop(h.key, grace_period_s=1)
    assert harness.exit_of(h.key).kind == ExitKind.STOPPED


# --- stopping --------------------------------------------------------------------------------


def test_stop_reaches_a_task_whose_supervisor_is_stopped(any_watch: Harness) -> None:
    # A supervisor stopped (SIGSTOP) while its task runs takes a stop's SIGTERM only once
    # continued: the task ran on past its grace, a cancel or a preemption never ended it.
    h = any_watch.launch("t-0", ["sleep", "600"])
    started = any_watch.started(h.key)
    sup_pid = h.data["supervisor_pid"]
    os.kill(sup_pid, signal.SIGSTOP)
    wait_for(lambda: getattr(processes.proc_stat(sup_pid), "state", "") == "T", what="it to stop")
    any_watch.ex.stop(h.key, grace_period_s=1)
    assert any_watch.exit_of(h.key).kind == ExitKind.STOPPED
    assert gone(started["child_pid"])


def test_stop_lets_a_task_that_traps_sigterm_finish(harness: Harness, tmp_path: Path) -> None:
    trapped = tmp_path / "trapped"
    script = f"trap 'echo bye > {trapped}; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    h = harness.launch("t-0", ["sh", "-c", script])
    wait_for(lambda: "ready" in harness.log("t-0"), what="the task to start")
    harness.ex.stop(h.key)
    ev = harness.exit_of(h.key)
    assert exited(h, ExitKind.STOPPED, 0, "stopped: exited with code 0 after SIGTERM", ev)
    assert trapped.read_text() == "bye\n"


def test_stop_kills_a_task_ignoring_sigterm_after_the_grace_period(harness: Harness) -> None:
    script = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
    h = harness.launch("t-0", ["sh", "-c", script], grace_period_s=600)
    wait_for(lambda: "ready" in harness.log("t-0"), what="the task to start")
    harness.ex.stop(h.key, grace_period_s=0.2)  # the stop's grace overrides the launch's
    ev = harness.exit_of(h.key)
    message = "stopped: still running after the grace period, killed by signal 9 (SIGKILL)"
    assert exited(h, ExitKind.STOPPED, -9, message, ev)
    assert (
        harness.log("t-0") == "ready\naisched: stop requested: SIGTERM, then SIGKILL after 0.2 s\n"
    )


def test_stop_kills_the_whole_process_group(harness: Harness, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    h = harness.launch("t-0", ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"])
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", what="the pid file")
    harness.ex.stop(h.key, grace_period_s=5)
    ev = harness.exit_of(h.key)
    assert (ev.kind, ev.exit_code) == (ExitKind.STOPPED, -15)
    wait_for(lambda: gone(int(pidfile.read_text())), what="the task's child to die")


def test_stop_right_after_launch_is_not_lost(harness: Harness) -> None:
    h = harness.launch("t-0", ["sleep", "60"])
    harness.ex.stop(h.key, grace_period_s=0.5)
    ev = harness.exit_of(h.key)
    assert ev.kind == ExitKind.STOPPED
    assert ev.message.startswith("stopped")


def test_stop_is_idempotent_and_ignores_what_is_gone(harness: Harness) -> None:
    h = harness.launch("t-0", ["sleep", "60"])
    harness.ex.stop(h.key, grace_period_s=1)
    harness.ex.stop(h.key, grace_period_s=1)
    harness.ex.stop(("j1", 0, "never-launched"))
    assert harness.exit_of(h.key).kind == ExitKind.STOPPED
    harness.ex.stop(h.key)
    assert harness.ex.poll() == []


# --- memory limits ---------------------------------------------------------------------------

ALLOCATE = "import time; b = [b'x' * (16 << 20) for _ in range({n})]; time.sleep(0.1)"
OVER_LIMIT = {
    "cgroup-v2": "killed: exceeded its memory limit of 256 MiB",
    "cgroup-v1": "killed: exceeded its memory limit of 256 MiB",
    "rlimit": "failed to allocate memory beyond its limit of 256 MiB (data-segment rlimit)",
}
WITH_MECHANISM = [
    pytest.param(m, marks=pytest.mark.skipif(why is not None, reason=str(why)))
    for m, why in MECHANISMS.items()
]


@pytest.mark.parametrize("mechanism", WITH_MECHANISM)
def test_a_task_over_its_memory_limit_ends_as_oom_and_one_under_it_succeeds(
    harness: Harness, mechanism: str
) -> None:
    ex = harness.new_executor(mem_mechanism=mechanism)
    assert ex.info().memory_limit == mechanism
    over = harness.launch("over-0", [PY, "-c", ALLOCATE.format(n=32)], mem_limit_mib=256)
    under = harness.launch("under-0", [PY, "-c", ALLOCATE.format(n=4)], mem_limit_mib=256)
    ev = harness.exit_of(over.key)
    assert (ev.kind, ev.message) == (ExitKind.OOM, OVER_LIMIT[mechanism])
    assert f"aisched: {OVER_LIMIT[mechanism]}\n" in harness.log("over-0")
    assert exited(under, ExitKind.EXITED, 0, "exited with code 0", harness.exit_of(under.key))
    cgroup = over.data["cgroup"]
    assert (cgroup is not None) == mechanism.startswith("cgroup")
    assert cgroup is None or not os.path.exists(cgroup)


@pytest.mark.skipif(MECHANISMS["rlimit"] is not None, reason=str(MECHANISMS["rlimit"]))
def test_under_an_rlimit_the_processes_of_a_task_are_limited_together(harness: Harness) -> None:
    harness.new_executor(mem_mechanism="rlimit")
    hold = shlex.quote("import time; b = b'x' * (150 << 20); time.sleep(60)")
    script = f"{PY} -c {hold} & {PY} -c {hold} & wait"
    h = harness.launch("t-0", ["sh", "-c", script], mem_limit_mib=256)
    ev = harness.exit_of(h.key)
    assert ev.kind == ExitKind.OOM, ev  # how it ended instead, should it not be this
    assert ev.message.startswith("killed: exceeded its memory limit of 256 MiB (its processes held")


# Memory a task holds in files no name reaches, beyond an rlimit's reach: 320 MiB written to a
# memfd, to a deleted file of /dev/shm, or to a memfd kept only by a mapping of one page.
FILL = "for _ in range(20): os.write(fd, b'x' * (16 << 20))\n"
HELD_IN_FILES = {
    "memfd": "fd = os.memfd_create('x')\n" + FILL,
    "deleted-shm-file": "p = f'/dev/shm/aisched-test-{os.getpid()}'\n"
    "fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)\nos.unlink(p)\n" + FILL,
    "mapped-memfd": "fd = os.memfd_create('x')\n"
    + FILL
    + "m = mmap.mmap(fd, 4096)\nos.close(fd)\n",
    "memfd-of-two-processes": "fd = os.memfd_create('x')\n" + FILL + "os.fork()\n",
}


@pytest.mark.skipif(MECHANISMS["rlimit"] is not None, reason=str(MECHANISMS["rlimit"]))
@pytest.mark.parametrize(
    "how",
    [
        pytest.param(
            how,
            marks=pytest.mark.skipif(
                how == "mapped-memfd" and os.geteuid() != 0,
                reason="a mapping's file is read through /proc/PID/map_files, root's",
            ),
        )
        for how in HELD_IN_FILES
    ],
)
def test_under_an_rlimit_memory_held_in_files_no_name_reaches_counts(
    harness: Harness, how: str
) -> None:
    # A memfd's pages are no process's RSS (but for what is mapped): a task under `mem: 256M`
    # held 1,500 MiB in one and ran on.
    harness.new_executor(mem_mechanism="rlimit")
    script = "import mmap, os, time\n" + HELD_IN_FILES[how] + "time.sleep(60)\n"
    h = harness.launch("t-0", [PY, "-c", script], mem_limit_mib=256)
    ev = harness.exit_of(h.key)
    assert ev.kind == ExitKind.OOM, ev
    assert ev.message.startswith("killed: exceeded its memory limit of 256 MiB (its processes held")
    assert "failed to allocate" not in harness.log("t-0")


@pytest.mark.skipif(MECHANISMS["rlimit"] is not None, reason=str(MECHANISMS["rlimit"]))
def test_under_an_rlimit_a_memfd_the_task_maps_is_counted_once(harness: Harness) -> None:
    # 160 MiB in a memfd, all of it mapped and touched: in its RSS and in the file, but held once.
    harness.new_executor(mem_mechanism="rlimit")
    script = (
        "import mmap, os, time\nfd = os.memfd_create('x')\n"
        "for _ in range(10): os.write(fd, b'x' * (16 << 20))\n"
        "m = mmap.mmap(fd, 160 << 20)\nassert sum(m[i] for i in range(0, 160 << 20, 4096))\n"
        "time.sleep(2)\n"  # the supervisor looks every half second
    )
    h = harness.launch("t-0", [PY, "-c", script], mem_limit_mib=256)
    assert exited(h, ExitKind.EXITED, 0, "exited with code 0", harness.exit_of(h.key))


@pytest.mark.skipif(MECHANISMS["rlimit"] is not None, reason=str(MECHANISMS["rlimit"]))
def test_under_an_rlimit_processes_that_left_the_group_count_and_are_killed(
    harness: Harness, tmp_path: Path, no_cgroups: None
) -> None:
    # A process in a session of its own (Popen(start_new_session=True), setsid), its parent
    # gone: it was neither counted against the limit nor killed with the task.
    harness.new_executor(mem_mechanism="rlimit")
    hold = tmp_path / "hold.py"
    hold.write_text("import time; b = b'x' * (150 << 20); time.sleep(60)\n")
    pids = [tmp_path / f"{k}.pid" for k in range(2)]
    spawn = " ".join(f"setsid sh -c 'echo $$ > {f}; exec {PY} {hold}' &" for f in pids)
    h = harness.launch("t-0", ["sh", "-c", f"{spawn} sleep 60"], mem_limit_mib=256)
    ev = harness.exit_of(h.key)
    assert ev.kind == ExitKind.OOM, ev
    assert ev.message.startswith("killed: exceeded its memory limit of 256 MiB (its processes held")
    for f in pids:
        wait_for(lambda f=f: gone(int(f.read_text())), what="the process that left to die")


@pytest.mark.skipif(MECHANISMS["rlimit"] is not None, reason=str(MECHANISMS["rlimit"]))
@pytest.mark.parametrize(
    ("said", "over"),
    [
        ("dd: out of memory", True),  # busybox; it ended "exited with code 1"
        ("fatal error: runtime: out of memory", True),  # Go
        ("memory allocation of 1073741824 bytes failed", True),  # Rust
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:83] DefaultCPUAllocator: can't allocate "
         "memory: you tried to allocate 8589934592 bytes", True),  # PyTorch, on the CPU
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
        ("Error: file not found", False),
    ],
)  # fmt: skip
def test_under_an_rlimit_a_failed_allocation_is_told_by_what_the_task_said(
    harness: Harness, said: str, over: bool
) -> None:
    harness.new_executor(mem_mechanism="rlimit")
    h = harness.launch(
        "t-0", ["sh", "-c", f"echo {shlex.quote(said)} >&2; exit 1"], mem_limit_mib=256
    )
    ev = harness.exit_of(h.key)
    assert (ev.kind == ExitKind.OOM) == over, ev
    assert ev.exit_code == 1


def test_without_a_mechanism_limits_are_not_enforced(harness: Harness) -> None:
    ex = harness.new_executor(mem_mechanism="none")
    assert ex.info().memory_limit == "none"
    h = harness.launch("t-0", [PY, "-c", ALLOCATE.format(n=6)], mem_limit_mib=32)
    assert exited(h, ExitKind.EXITED, 0, "exited with code 0", harness.exit_of(h.key))


def test_a_forced_mechanism_must_exist(harness: Harness) -> None:
    with pytest.raises(MemoryControlError, match="not one of auto, cgroup-v2"):
        harness.new_executor(mem_mechanism="cgroup-v3")
    missing = [m for m, why in MECHANISMS.items() if why is not None]
    for m in missing:
        with pytest.raises(MemoryControlError, match=f"memory mechanism {m} is not available: "):
            harness.new_executor(mem_mechanism=m)


# --- adoption after the scheduler died ---------------------------------------------------------


def wait_for_file(path: Path) -> str:
    return f"while [ ! -e {path} ]; do sleep 0.02; done"


def test_an_adopted_task_reports_its_exit(any_watch: Harness, tmp_path: Path) -> None:
    go = tmp_path / "go"
    h = any_watch.launch("t-0", ["sh", "-c", f"{wait_for_file(go)}; exit 7"])
    any_watch.started(h.key)
    any_watch.ex.close()  # the scheduler goes away; the task is left running
    ex = any_watch.new_executor()
    assert ex.adopt(h) == (AdoptState.RUNNING, None)
    assert ex.adopt(h) == (AdoptState.RUNNING, None)  # already watched: nothing changes
    go.touch()
    assert exited(h, ExitKind.EXITED, 7, "exited with code 7", any_watch.exit_of(h.key))


@pytest.mark.parametrize("with_data", [True, False], ids=["handle", "key-only"])
def test_a_task_that_ended_while_nobody_watched_is_adopted_as_exited(
    harness: Harness, with_data: bool
) -> None:
    h = harness.launch("t-0", ["sh", "-c", "exit 5"])
    harness.ex.close()
    wait_for((harness.ex.task_dir(h.key) / task_files.EXIT).exists, what="the exit record")
    ex = harness.new_executor()
    handle = h if with_data else TaskHandle(h.key, h.node, {})
    state, ev = ex.adopt(handle)
    assert state == AdoptState.EXITED
    assert ev is not None and exited(h, ExitKind.EXITED, 5, "exited with code 5", ev)
    assert ex.poll() == []


def test_a_supervisor_killed_while_watched_is_lost_and_its_task_killed(any_watch: Harness) -> None:
    h = any_watch.launch("t-0", ["sleep", "60"])
    started = any_watch.started(h.key)
    os.kill(h.data["supervisor_pid"], signal.SIGKILL)
    ev = any_watch.exit_of(h.key)
    assert (ev.kind, ev.exit_code) == (ExitKind.LOST, None)
    assert ev.message.startswith(f"its supervisor (pid {h.data['supervisor_pid']}) ended without")
    wait_for(lambda: gone(started["child_pid"]), what="the orphaned task to be killed")


WAIT_FOR_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)"


def test_a_supervisor_whose_task_directory_was_deleted_ends_with_its_task(
    harness: Harness, tmp_path: Path
) -> None:
    # An operator removed the state directory under a running task: nobody can read its exit
    # record any more, so the supervisor must not wait for ever to write it (as it rightly
    # does on a full disk), but end with its task.
    release = tmp_path / "release"
    h = harness.launch("t-0", [PY, "-c", WAIT_FOR_FILE, str(release)])
    harness.started(h.key)
    shutil.rmtree(harness.ex.task_dir(h.key))
    release.touch()
    wait_for(lambda: gone(h.data["supervisor_pid"]), 10.0, "the supervisor to end")
    assert harness.exit_of(h.key).kind == ExitKind.LOST  # no record: the scheduler says lost


def test_a_supervisor_killed_while_nobody_watched_is_adopted_as_lost(harness: Harness) -> None:
    h = harness.launch("t-0", ["sleep", "60"])
    started = harness.started(h.key)
    harness.ex.close()
    os.kill(h.data["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: gone(h.data["supervisor_pid"]), what="the supervisor to die")
    state, ev = harness.new_executor().adopt(h)
    assert state == AdoptState.LOST
    assert ev == TaskExited(
        h.key,
        ExitKind.LOST,
        None,
        "its supervisor is gone without a record; what was left of it was killed",
        ev.time_s if ev else 0.0,
    )
    wait_for(lambda: gone(started["child_pid"]), what="the orphaned task to be killed")


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"supervisor_pid": 4_194_000, "supervisor_start": 12},
        {"supervisor_pid": os.getpid(), "supervisor_start": 1},  # a pid now used by another
    ],
    ids=["no-data", "garbage-pid", "reused-pid"],
)
def test_a_task_that_never_started_is_lost_and_can_never_start(
    harness: Harness, data: dict[str, int]
) -> None:
    # The scheduler died between writing the request and starting its supervisor.
    key = ("j1", 0, "t-0")
    tdir = harness.ex.task_dir(key)
    tdir.mkdir(parents=True)
    log = harness.log_path("t-0")
    launch = {"command": ["sh", "-c", "echo ran"], "env": {}, "log_path": str(log)}
    task_files.write_json_atomic(str(tdir / task_files.LAUNCH), launch)
    state, ev = harness.ex.adopt(TaskHandle(key, NODE.name, data))
    assert state == AdoptState.LOST
    assert (
        ev is not None
        and ev.message == "it never started (the scheduler stopped while launching it)"
    )
    # A supervisor that turns up only now finds the task given up and runs nothing.
    assert subprocess.run([PY, "-I", "-S", SUPERVISOR_SCRIPT, str(tdir)]).returncode == 0
    assert not log.exists()
    assert not (tdir / task_files.EXIT).exists()


def test_a_task_never_launched_here_is_lost(harness: Harness) -> None:
    state, ev = harness.ex.adopt(TaskHandle(("nope", 0, "t-0"), NODE.name, {}))
    assert state == AdoptState.LOST
    assert ev is not None and ev.message.startswith("no record of this task in ")


def test_a_task_given_up_before_its_launch_can_never_start(harness: Harness) -> None:
    # A deposed leader paused between committing a launch and making it: the new leader's
    # adopt finds no request and gives the task up, so the old leader's launch is refused.
    key = ("j1", 0, "t-0")
    state, ev = harness.ex.adopt(TaskHandle(key, NODE.name, {}))
    assert state == AdoptState.LOST and ev is not None
    with pytest.raises(LaunchError, match="was given up by a scheduler that recovered it"):
        harness.launch("t-0", ["sh", "-c", "echo ran"])
    assert not harness.log_path("t-0").exists()


def test_a_supervisor_never_runs_a_task_twice(harness: Harness) -> None:
    h = harness.launch("t-0", ["sh", "-c", "echo ran"])
    assert harness.exit_of(h.key).exit_code == 0
    tdir = harness.ex.task_dir(h.key)
    assert subprocess.run([PY, "-I", "-S", SUPERVISOR_SCRIPT, str(tdir)]).returncode == 0
    assert harness.log("t-0") == "ran\n"


SCHEDULER = """
import json, os, sys, time
from aisched.executors.base import TaskLaunch
from aisched.executors.local import LocalExecutor
from aisched.model.cluster import Node

state, node, script, log = sys.argv[1:5]
ex = LocalExecutor(state, Node(node, 2000, 4096))
h = ex.launch(TaskLaunch("j1", 0, "t-0", node, ("sh", "-c", script),
                         {"PATH": os.environ["PATH"]}, None, 1000, 0, (), log, 5.0))
print(json.dumps({"key": h.key, "node": h.node, "data": h.data}), flush=True)
time.sleep(60)
"""


def test_a_scheduler_killed_with_sigkill_leaves_its_task_running_for_the_next(
    harness: Harness, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = f"{wait_for_file(go)}; exit 7"
    log = harness.log_path("t-0")
    log.parent.mkdir(parents=True)
    args = [PY, "-c", SCHEDULER, str(harness.state), NODE.name, script, str(log)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as scheduler:
        assert scheduler.stdout is not None
        line = scheduler.stdout.readline()
        scheduler.kill()
    saved = json.loads(line)
    handle = TaskHandle(tuple(saved["key"]), saved["node"], saved["data"])  # type: ignore[arg-type]
    harness.started(handle.key)
    assert harness.new_executor().adopt(handle) == (AdoptState.RUNNING, None)
    go.touch()
    ev = harness.exit_of(handle.key)
    assert ev == TaskExited(handle.key, ExitKind.EXITED, 7, "exited with code 7", ev.time_s)


# --- refused launches ------------------------------------------------------------------------


def request(harness: Harness, **change: object) -> TaskLaunch:
    base = TaskLaunch(
        job_id="j1",
        attempt=0,
        task="t-0",
        node=NODE.name,
        command=("true",),
        env={"PATH": os.environ["PATH"]},
        workdir=None,
        milli_cpu=1000,
        mem_limit_mib=0,
        gpus=(),
        log_path=str(harness.log_path("t-0")),
        grace_period_s=1.0,
    )
    return dataclasses.replace(base, **change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"node": "elsewhere"},
            "task j1/0/t-0: node 'elsewhere' is not this machine ('local-test')",
        ),
        ({"command": ()}, "task j1/0/t-0: command: empty"),
        ({"job_id": "a/b"}, "job id: 'a/b' cannot name a task directory"),
        ({"task": ".."}, "task: '..' cannot name a task directory"),
        ({"gpus": (1, 5)}, "task j1/0/t-0: gpus: [5] not on node 'local-test'"),
        ({"attempt": -1}, "task j1/-1/t-0: attempt: must be >= 0, got -1"),
        ({"mem_limit_mib": -1}, "task j1/0/t-0: mem_limit_mib: must be >= 0, got -1"),
        ({"grace_period_s": -0.5}, "task j1/0/t-0: grace_period_s: must be >= 0, got -0.5"),
    ],
)
def test_bad_launch_requests_are_refused_with_the_reason(
    harness: Harness, change: dict[str, object], message: str
) -> None:
    with pytest.raises(LaunchError) as err:
        harness.ex.launch(request(harness, **change))
    assert str(err.value) == message
    assert not harness.state.joinpath("j1", "0", "t-0").exists()


def test_a_log_that_cannot_be_written_is_refused(harness: Harness, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(LaunchError, match="task j1/0/t-0: log_path: cannot write .*a-file/t.log"):
        harness.ex.launch(request(harness, log_path=str(tmp_path / "a-file" / "t.log")))


def test_a_launch_that_fails_names_its_step_and_the_file_and_leaves_nothing(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before, every step's failure read 'cannot start its supervisor', and without the file:
    a cgroup that could not be made looked like a supervisor that could not be forked."""
    missing = tmp_path / "missing" / "x"

    def start_fails(self: LocalExecutor, tdir: Path) -> tuple[int, int, bool]:
        os.mkdir(missing)  # the OS's own error: no such parent
        raise AssertionError("unreachable")

    monkeypatch.setattr(LocalExecutor, "_start_supervisor", start_fails)
    with pytest.raises(LaunchError) as err:
        harness.launch("t-0", ["true"])
    assert str(err.value) == (
        f"task j1/0/t-0: cannot start its supervisor: No such file or directory ({missing})"
    )
    assert not harness.state.joinpath("j1", "0", "t-0").exists()


@pytest.mark.parametrize(
    ("step", "error", "words"),
    [
        (
            MEMORY_STEP,
            OSError(errno.EBUSY, "Device or resource busy", "/cg/memory/aisched/t"),
            "Device or resource busy (/cg/memory/aisched/t); the kernel may have no memory "
            "cgroup left to give (65,535 at most)",
        ),
        (
            "start its supervisor",
            OSError(errno.EBUSY, "Device or resource busy"),
            "Device or resource busy",
        ),
        (
            MEMORY_STEP,
            OSError(errno.EACCES, "Permission denied", "/cg/x"),
            "Permission denied (/cg/x)",
        ),
    ],
)
def test_a_launch_error_says_what_the_os_said_and_what_a_busy_memory_cgroup_means(
    step: str, error: OSError, words: str
) -> None:
    assert _launch_error(step, error) == words


def test_a_task_is_launched_once(harness: Harness) -> None:
    h = harness.launch("t-0", ["sleep", "60"])
    with pytest.raises(LaunchError, match="task j1/0/t-0 is already running"):
        harness.launch("t-0", ["true"])
    harness.ex.stop(h.key, 0)
    harness.exit_of(h.key)
    with pytest.raises(LaunchError, match="was launched before on this node"):
        harness.launch("t-0", ["true"])
    retry = harness.launch("t-0", ["true"], attempt=1)
    assert harness.exit_of(retry.key).exit_code == 0


def test_a_closed_executor_launches_nothing(harness: Harness) -> None:
    harness.ex.close()
    harness.ex.close()
    with pytest.raises(LaunchError, match="the executor is closed"):
        harness.launch("t-0", ["true"])


def test_info_and_nodes(harness: Harness) -> None:
    ex = LocalExecutor(harness.state, NODE, mem_mechanism="rlimit", notes=["cpus: declared"])
    harness.made.append(ex)
    info = ex.info()
    assert (info.name, info.memory_limit, info.cpu_affinity) == ("local", "rlimit", True)
    assert info.notes[0] == "cpus: declared"
    assert ex.nodes() == (NODE,)


def test_without_a_node_the_executor_discovers_this_machine(harness: Harness) -> None:
    ex = LocalExecutor(harness.state, mem_mechanism="none")
    harness.made.append(ex)
    (node,) = ex.nodes()
    assert node.milli_cpu == len(USABLE) * 1000
    assert any(n.startswith("cpus: ") for n in ex.info().notes)


def test_the_supervisor_needs_nothing_but_the_standard_library() -> None:
    # It runs with -I -S: importing it there must work (no site-packages: only the standard
    # library and the package's own stdlib-only modules, which it finds beside it).
    code = f"import runpy; runpy.run_path({SUPERVISOR_SCRIPT!r}, run_name='not-main')"
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (0, "")


CGROUPS = [m for m, why in MECHANISMS.items() if why is None and m.startswith("cgroup")]
WITH_CGROUP = pytest.mark.skipif(not CGROUPS, reason="no usable memory cgroups here")


@WITH_CGROUP
def test_under_a_cgroup_an_oom_kill_of_any_process_ends_the_whole_task(harness: Harness) -> None:
    harness.new_executor(mem_mechanism=CGROUPS[0])
    hog = shlex.quote(ALLOCATE.format(n=32))
    # The shell would carry on after its child is killed: the task must end anyway.
    h = harness.launch("t-0", ["sh", "-c", f"{PY} -c {hog}; sleep 60"], mem_limit_mib=256)
    ev = harness.exit_of(h.key)
    assert (ev.kind, ev.message) == (ExitKind.OOM, OVER_LIMIT[CGROUPS[0]])


@pytest.fixture
def no_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """No task cgroup of any kind, as for an ordinary user's service on a cgroup v1 machine:
    the memory mechanism aside, the cpuset and pids cgroups a root service puts each task in
    (and empties when it ends) are not made."""
    monkeypatch.setattr(local, "choose_task_bounds", lambda *_: TaskBounds())


@pytest.mark.parametrize("mechanism", ["none", *CGROUPS])
def test_processes_that_left_the_session_are_killed_with_the_task(
    harness: Harness, tmp_path: Path, mechanism: str, no_cgroups: None
) -> None:
    # Without a cgroup, by the supervisor being their subreaper: they outlived the task before.
    harness.new_executor(mem_mechanism=mechanism)
    pidfile = tmp_path / "escaped.pid"
    escape = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' &"
    h = harness.launch(
        "t-0", ["sh", "-c", f"{escape} while [ ! -s {pidfile} ]; do sleep 0.01; done"]
    )
    assert harness.exit_of(h.key).kind == ExitKind.EXITED
    wait_for(lambda: gone(int(pidfile.read_text())), what="the escaped process to die")


COUNT_TERMS = """
import signal, sys, time
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(time.time()))
print("ready", flush=True)
while not terms:
    time.sleep(0.01)
time.sleep(0.5)  # a second SIGTERM, had one been sent, has arrived by now
with open(sys.argv[1], "w") as f:
    f.write(str(len(terms)))
"""


@WITH_CGROUP
def test_under_a_cgroup_a_stop_sends_the_task_one_sigterm_and_escaped_processes_theirs(
    harness: Harness, tmp_path: Path
) -> None:
    """The group and the cgroup both reach the task: it must still get SIGTERM once (its
    handler may checkpoint), while a process that left its group gets one too."""
    harness.new_executor(mem_mechanism=CGROUPS[0])
    counted, escaped = tmp_path / "terms", tmp_path / "escaped"
    script = tmp_path / "count.py"
    script.write_text(COUNT_TERMS)
    trap = f"trap 'echo term > {escaped}; exit 0' TERM; while :; do sleep 0.05; done"
    daemon = f'setsid sh -c "{trap}" &'
    h = harness.launch("t-0", ["sh", "-c", f"{daemon} exec {PY} {script} {counted}"])
    wait_for(lambda: "ready" in harness.log("t-0"), what="the task to start")
    harness.ex.stop(h.key, grace_period_s=10)
    assert harness.exit_of(h.key).kind == ExitKind.STOPPED
    assert counted.read_text() == "1"
    wait_for(lambda: escaped.exists(), what="the escaped process's SIGTERM")


def test_a_supervisor_records_its_task_s_end_though_its_own_log_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a full disk the exit record cannot be written, and neither can the supervisor's own
    # log line saying so (its stderr is on the same disk): that failure must not end the
    # supervisor before the record is written, or a task that succeeded is taken as lost and
    # run again. /dev/full fails every write with ENOSPC; a directory in the way of the
    # record's temporary file fails its writes until it is removed.
    blocker = tmp_path / f"{task_files.EXIT}.tmp{os.getpid()}"
    blocker.mkdir()
    threading.Timer(0.3, blocker.rmdir).start()
    supervisor = sup.Supervisor(str(tmp_path), {}, -1, sup._Signals())
    full = open("/dev/full", "w", buffering=1)  # noqa: SIM115 - its close fails too
    monkeypatch.setattr(sys, "stderr", full)
    assert supervisor.finish("exited", 0, "done") == 0
    monkeypatch.undo()
    with contextlib.suppress(OSError):
        full.close()
    record = json.loads((tmp_path / task_files.EXIT).read_text())
    assert (record["kind"], record["exit_code"]) == ("exited", 0)


def test_a_stop_whose_request_file_cannot_be_written_still_stops_the_task(
    harness: Harness,
) -> None:
    # A full disk (here a directory in the way of the request's temporary file) must not
    # leave a cancelled task running: the signal goes out all the same.
    h = harness.launch("t-0", ["sh", "-c", "echo ready; sleep 60"])
    wait_for(lambda: "ready" in harness.log("t-0"), what="the task to start")
    blocker = harness.ex.task_dir(h.key) / f"{task_files.STOP}.tmp{os.getpid()}"
    blocker.mkdir()
    harness.ex.stop(h.key, grace_period_s=1)
    ev = harness.exit_of(h.key)
    assert ev.kind == ExitKind.STOPPED
    blocker.rmdir()


CGROUP_MECHANISMS = [p for p in WITH_MECHANISM if str(p.values[0]).startswith("cgroup")]


@pytest.mark.parametrize("mechanism", CGROUP_MECHANISMS)
def test_two_services_tasks_of_one_key_keep_their_own_cgroups(
    tmp_path: Path, mechanism: str
) -> None:
    # Two services started from one shell share the parent cgroup, and a launch replaces a
    # leftover cgroup of its name, emptying it: by the key alone, the second service's task
    # killed the first's.
    first, second = Harness(tmp_path / "a"), Harness(tmp_path / "b")
    try:
        for h in (first, second):
            h.new_executor(mem_mechanism=mechanism)
        one = first.launch("t-0", ["sh", "-c", "echo ready; sleep 60"], mem_limit_mib=256)
        wait_for(lambda: "ready" in first.log("t-0"), what="the first service's task")
        two = second.launch("t-0", ["sh", "-c", "echo ready; sleep 60"], mem_limit_mib=256)
        wait_for(lambda: "ready" in second.log("t-0"), what="the second service's task")
        assert one.data["cgroup"] != two.data["cgroup"]
        assert processes.is_alive(one.data["supervisor_pid"], one.data["supervisor_start"])
        assert first.ex.poll() == []  # nothing ended
    finally:
        first.cleanup()
        second.cleanup()


# --- processes and cores: bounds the task cannot lift --------------------------------------

# Starts up to 64 threads, prints how many it could, and holds them until the file argv[1]
# exists.
HOLD = """
import os, sys, threading, time
started = 0
try:
    for _ in range(64):
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
        started += 1
except RuntimeError:
    pass
print(started, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""

WIDEN = """
import os, sys
try:
    os.sched_setaffinity(0, [int(c) for c in sys.argv[1:]])
except OSError:
    pass
print(sorted(os.sched_getaffinity(0)))
"""


def _bounded(ex: LocalExecutor, ctrl: str) -> bool:
    unbounded = {"pids": "a task's processes and threads are not bounded",
                 "cpuset": "a task's cores are its CPU affinity only"}[ctrl]  # fmt: skip
    return not any(n.startswith(unbounded) for n in ex.info().notes)


def test_info_says_a_cpuset_pins_the_cores_where_one_bounds_them(harness: Harness) -> None:
    ex = harness.new_executor()
    if not _bounded(ex, "cpuset"):
        pytest.skip("no cpuset cgroup here")
    assert ex.info().pinning == "cpuset cgroup"


def test_info_says_cpu_affinity_where_no_cpuset_bounds_the_cores(
    harness: Harness, no_cgroups: None
) -> None:
    assert harness.new_executor().info().pinning == "cpu affinity"


def test_a_task_holds_no_more_processes_and_threads_than_its_pids_limit(harness: Harness) -> None:
    ex = harness.new_executor(task_pids_limit=16)
    if not _bounded(ex, "pids"):
        pytest.skip("no pids cgroup here")
    release = harness.tmp / "release"
    release.touch()  # no need to hold them: alone, it counts what it could start
    h = harness.launch("t-0", [PY, "-c", HOLD, str(release)])
    assert harness.exit_of(h.key).kind == ExitKind.EXITED
    # The interpreter and its threads together: at most 16 tasks of the kernel.
    assert 0 < int(harness.log("t-0").strip()) < 16
    # And all tasks together keep PIDs free for the machine (many tasks of one user could
    # otherwise take every PID): the parent of the task cgroups has a bound of its own.
    (base,) = [n.split(" under ")[1] for n in ex.info().notes if n.startswith("pids cgroups")]
    with open(os.path.join(base, "pids.max")) as f:
        assert (
            int(f.read())
            == all_tasks_pids_max()
            < int(Path("/proc/sys/kernel/pid_max").read_text())
        )


def test_one_users_tasks_together_hold_no_more_than_its_user_pids_limit(
    harness: Harness,
) -> None:
    ex = harness.new_executor(task_pids_limit=16, user_pids_limit=24)
    if not _bounded(ex, "pids") or any("not per user" in n for n in ex.info().notes):
        pytest.skip("no cgroup v1 pids hierarchy here")
    # Each could take 15 threads alone; held at once, together they may not pass their
    # user's 24 (each task's interpreter is one more).
    release = harness.tmp / "release"
    tasks = [harness.launch(f"t-{i}", [PY, "-c", HOLD, str(release)]) for i in range(2)]
    for i in range(2):
        wait_for(lambda i=i: harness.log(f"t-{i}").strip() != "", what=f"t-{i} to count")
    release.touch()
    for h in tasks:
        assert harness.exit_of(h.key).kind == ExitKind.EXITED
    held = [int(harness.log(f"t-{i}").strip()) for i in range(2)]
    assert all(n > 0 for n in held) and sum(held) + 2 <= 24, held


def test_the_bound_parents_another_service_removed_are_made_again(harness: Harness) -> None:
    # Every service of the machine shares the v1 parents of the bound cgroups, and one that
    # stops while none of its tasks run removes them (`release_bounds`): a standby stopping
    # beside an idle leader. The leader's next launch then failed ("No such file or
    # directory" for the cpuset), and so did every one after it.
    shared = harness.ex.task_bounds.bases
    if not shared:
        pytest.skip("no cgroup v1 pids or cpuset hierarchy here")
    bounds = TaskBounds(bases=tuple((c, f"{base}-test-{os.getpid()}") for c, base in shared))
    create_bounds(bounds, "first", None, 16, tuple(USABLE[:1]), os.geteuid(), 64)
    for path in bound_cgroups(bounds, "first", os.geteuid(), 64):
        processes.remove_cgroup(path)
    release_bounds(bounds)  # the other service stops
    assert not any(os.path.isdir(base) for _, base in bounds.bases)
    try:
        create_bounds(bounds, "second", None, 16, tuple(USABLE[:1]), os.geteuid(), 64)
        for ctrl, base in bounds.bases:
            if ctrl == "pids":  # all tasks together are bounded again
                assert Path(base, "pids.max").read_text().strip() == str(all_tasks_pids_max())
            else:  # and the cpuset has the machine's cores to hand out
                assert Path(base, "cpuset.cpus").read_text().strip() != ""
        made = bound_cgroups(bounds, "second", os.geteuid(), 64)
        assert all(os.path.isdir(path) for path in made)
    finally:
        for path in bound_cgroups(bounds, "second", os.geteuid(), 64):
            processes.remove_cgroup(path)
        release_bounds(bounds)


def _private_bounds(harness: Harness, what: str) -> TaskBounds:
    """Bound parents of this test's own, beside the shared ones: others' tasks stay out."""
    shared = harness.ex.task_bounds.bases
    if not shared:
        pytest.skip("no cgroup v1 pids or cpuset hierarchy here")
    return TaskBounds(bases=tuple((c, f"{base}-{what}-{os.getpid()}") for c, base in shared))


def _task_cgroups(bounds: TaskBounds, name: str) -> list[str]:
    """Where the task cgroups named `name` are, found on disk (under a user's pids cgroup)."""
    return [p for _, base in bounds.bases for p in glob.glob(f"{base}/**/{name}", recursive=True)]


def _remove_all(bounds: TaskBounds, *names: str) -> None:
    for name in names:
        for path in _task_cgroups(bounds, name):
            processes.remove_cgroup(path)
    release_bounds(bounds)


def _another_service_stops_at_the_mkdir_of(
    monkeypatch: pytest.MonkeyPatch, name: str, under: str, stop: Callable[[], None]
) -> list[bool]:
    """Runs `stop` (another service releasing the shared parents) at the instant a launch
    has made the parents of its cgroup `name` under `under` and is about to mkdir it; the
    kernel's own mkdir follows. Returns whether each stop left the parents gone."""
    real, seen = os.mkdir, []

    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        path = os.fspath(path)
        if not seen and os.path.basename(path) == name and path.startswith(under):
            stop()
            seen.append(not os.path.isdir(os.path.dirname(path)))
        real(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", mkdir)
    return seen


def test_a_launch_makes_again_the_bound_parents_removed_just_before_its_mkdir(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another service that stops with none of its tasks running removes the shared parents,
    # maybe between a launch's making them and its mkdir: that launch failed (ENOENT).
    bounds = _private_bounds(harness, "race")
    pids_base = dict(bounds.bases).get("pids", bounds.bases[0][1])
    uid = os.geteuid()
    seen = _another_service_stops_at_the_mkdir_of(
        monkeypatch, "t", pids_base, lambda: release_bounds(bounds)
    )
    try:
        create_bounds(bounds, "t", None, 16, tuple(USABLE[:1]), uid, 64)
        monkeypatch.undo()
        assert seen == [True]  # the parents were really gone at the mkdir
        made = _task_cgroups(bounds, "t")
        assert sorted(made) == sorted(bound_cgroups(bounds, "t", uid, 64))
        for ctrl, base in bounds.bases:  # made whole again, with their bounds
            if ctrl == "pids":
                assert Path(base, "pids.max").read_text().strip() == str(all_tasks_pids_max())
                user = os.path.dirname(next(p for p in made if p.startswith(base)))
                assert Path(user, "pids.max").read_text().strip() == "64"
            else:
                assert Path(base, "cpuset.cpus").read_text().strip() != ""
    finally:
        monkeypatch.undo()
        _remove_all(bounds, "t")


@pytest.mark.parametrize("filled", [(), ("cpuset.cpus",)], ids=["empty", "cores-only"])
def test_a_task_joins_a_cpuset_whose_parent_another_service_is_still_making(
    harness: Harness, filled: tuple[str, ...]
) -> None:
    # Another service may have made the shared cpuset parent and not yet given it its cores
    # or memory nodes when a launch finds it there. The launch took it as made: its task's
    # cpuset had no memory nodes, and the task could not join it ("cannot run sh: cgroup: No
    # space left on device", exit 126; seen in CI with many services starting and stopping).
    bounds = _private_bounds(harness, "making")
    if "cpuset" not in dict(bounds.bases):
        pytest.skip("no cgroup v1 cpuset hierarchy here")
    base = dict(bounds.bases)["cpuset"]
    os.makedirs(base)  # the other service's mkdir; its writes have not come yet
    for name in filled:
        Path(base, name).write_text(Path(os.path.dirname(base), name).read_text())
    uid = os.geteuid()
    try:
        create_bounds(bounds, "t", None, 16, tuple(USABLE[:1]), uid, 64)
        join = 'for g in "$@"; do echo $$ > "$g/cgroup.procs" || exit 1; done'
        joined = subprocess.run(
            ["sh", "-c", join, "sh", *bound_cgroups(bounds, "t", uid, 64)],
            capture_output=True,
            text=True,
        )
        assert joined.returncode == 0, joined.stderr
    finally:
        _remove_all(bounds, "t")


def test_a_launch_makes_again_the_memory_parent_removed_just_before_its_mkdir(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = harness.ex.memory_control
    if shared.base is None:
        pytest.skip("no memory cgroups here")
    ctrl = MemoryControl(shared.mechanism, f"{shared.base}-race-{os.getpid()}", owned=True)
    assert ctrl.base is not None
    seen = _another_service_stops_at_the_mkdir_of(
        monkeypatch, "t", ctrl.base, lambda: release_base(ctrl)
    )
    try:
        path = create_task_cgroup(ctrl, "t", 64)
        monkeypatch.undo()
        assert seen == [True]
        assert path == os.path.join(ctrl.base, "t") and os.path.isdir(path)
    finally:
        monkeypatch.undo()
        processes.remove_cgroup(os.path.join(ctrl.base, "t"))
        release_base(ctrl)


def test_services_of_different_user_pids_limits_leave_each_others_bound_alone(
    harness: Harness,
) -> None:
    # Every service of the machine shares the parent of the users' pids cgroups; one that
    # wrote its own user_pids_limit into a user's cgroup changed the bound of the user's
    # tasks of every other service (lowered, their forks failed).
    bounds = _private_bounds(harness, "users")
    if "pids" not in dict(bounds.bases):
        pytest.skip("no cgroup v1 pids hierarchy here")
    uid, cores = os.geteuid(), tuple(USABLE[:1])
    try:
        create_bounds(bounds, "a", None, 16, cores, uid, 64)  # a service bounds it at 64
        create_bounds(bounds, "b", None, 16, cores, uid, 32)  # another, at 32
        base = dict(bounds.bases)["pids"]
        for name, want in (("a", "64"), ("b", "32")):
            (pids,) = [p for p in _task_cgroups(bounds, name) if p.startswith(base)]
            assert Path(os.path.dirname(pids), "pids.max").read_text().strip() == want, name
    finally:
        _remove_all(bounds, "a", "b")


@pytest.mark.skipif(len(USABLE) < 2, reason="needs at least 2 usable cores")
def test_a_task_cannot_widen_its_cores_past_its_cpuset(harness: Harness) -> None:
    if not _bounded(harness.ex, "cpuset"):
        pytest.skip("no cpuset cgroup here")
    h = harness.launch("t-0", [PY, "-c", WIDEN, *map(str, USABLE)], milli_cpu=1000)
    assert harness.exit_of(h.key).kind == ExitKind.EXITED
    assert json.loads(harness.log("t-0")) == h.data["cores"] != USABLE


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_fork_server_killed_between_its_fork_and_its_answer_runs_the_task_once_and_stoppable(
    harness: Harness, tmp_path: Path
) -> None:
    # The fork server killed after forking a supervisor and before answering with its pid:
    # the executor, with no answer, starts a new server and asks again. The first supervisor
    # ran the task unwatched, and the second, the one watched, waited on the task's lock
    # behind it: a stop (SIGTERM to the watched one) never reached the task.
    server = harness.ex._fork_server
    assert server is not None
    first = harness.launch("t-0", ["true"])  # starts the server
    assert harness.exit_of(first.key).exit_code == 0
    assert server._proc is not None
    traced = server._proc.pid
    # The kernel's kill, at the server's next write (its answer), by strace's fault injection.
    tracer = subprocess.Popen(
        ["strace", "-qq", "-o", "/dev/null", "-p", str(traced),
         "-e", "trace=write", "-e", "inject=write:signal=SIGKILL:when=1"],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        status = Path(f"/proc/{traced}/status")
        wait_for(lambda: "TracerPid:\t0\n" not in status.read_text(), what="strace to attach")
        marks = tmp_path / "runs"
        h = harness.launch("t-1", ["sh", "-c", f"echo run >> {marks}; exec sleep 600"])
    finally:
        tracer.wait(10)
    assert server._proc is not None and server._proc.pid != traced  # killed, and started again
    # Its line written, not only its file made (`>>` opens before echo writes).
    wait_for(lambda: marks.exists() and marks.read_text(), what="the task to run")
    harness.ex.stop(h.key, grace_period_s=1)
    assert harness.exit_of(h.key).kind == ExitKind.STOPPED
    assert marks.read_text() == "run\n"  # once


def test_a_state_directory_made_again_while_its_tasks_run_names_none_of_them(
    harness: Harness,
) -> None:
    """A stopped service leaves its tasks running; its state directory wiped and made again,
    the new one's job ids start over. Before, its tasks' cgroups were named by the path alone,
    so a new task of an old one's key took the old task's cgroup for a leftover of its own and
    emptied it, and the old supervisor, its task killed, killed what that cgroup held then:
    the new task ended at once, 'killed by signal 9'."""
    old = harness.launch("t-0", ["sleep", "60"])
    started = harness.started(old.key)
    old_child = int(started["child_pid"])
    old_record = task_files.read_json(str(harness.ex.task_dir(old.key) / task_files.LAUNCH))
    assert old_record is not None
    harness.ex.close()
    shutil.rmtree(harness.state)  # the operator starts afresh; the old task runs on
    try:
        harness.new_executor()
        new = harness.launch("t-0", [PY, "-c", "print('new')"])
        assert harness.exit_of(new.key).exit_code == 0
        assert processes.proc_stat(old_child) is not None, "the old task was killed"
        assert harness.ex.task_dir(new.key) == harness.state / "j1" / "0" / "t-0"
    finally:
        processes.kill_leftovers(
            sup_pid=old.data["supervisor_pid"],
            sup_start=old.data["supervisor_start"],
            child_pid=old_child,
            child_start=int(started["child_start"]),
            cgroup=old_record.get("cgroup"),
        )

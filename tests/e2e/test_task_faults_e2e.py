"""Faults of the machinery under a task, on a real `aisched up`: its supervisor killed or
stopped (SIGSTOP) while the task runs. Whatever happens, the job's end is recorded once, no
attempt runs beside another, and a cancel ends the task."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from harness import Service, local_service, wait_for

from aisched.executors import processes, task_files

# Notes each start (with its restart count and pid), holds the first attempt, ends the others.
SCRIPT = (
    'echo "start $AISCHED_RESTART_COUNT $$" >> {out}; '
    '[ "$AISCHED_RESTART_COUNT" = 0 ] && sleep 600; echo "end $AISCHED_RESTART_COUNT" >> {out}'
)


def supervisor_of(svc: Service, job_id: str, attempt: int) -> tuple[int, int]:
    """The supervisor of the job's one task, once the task has started."""
    pattern = f"{job_id}/{attempt}/*/{task_files.STARTED}"
    started = wait_for("the task to start", lambda: list((svc.home / "tasks").glob(pattern)))
    tdir = started[0].parent
    owner = task_files.read_lock_owner(str(tdir))
    assert owner is not None
    return owner


def submit(svc: Service, out: Path, **extra: Any) -> str:
    doc = {
        "command": ["sh", "-c", SCRIPT.format(out=out)],
        "restart": {"policy": "on-failure", "max_retries": 1, "backoff": "0s"},
        **extra,
    }
    r = svc.api.post("/v1/jobs", json=doc)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_a_supervisor_killed_while_its_task_runs_ends_the_attempt_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with local_service(tmp_path) as svc:
        job_id = submit(svc, out)
        pid, _ = supervisor_of(svc, job_id, 1)
        wait_for("the task to note its start", lambda: out.exists() and out.read_text())
        first = int(out.read_text().split()[2])
        first_start = processes.start_time(first)
        os.kill(pid, signal.SIGKILL)
        job = svc.wait_state(job_id, "succeeded")
        assert first_start is not None and not processes.is_alive(first, first_start)  # killed
        # The first attempt ended there (no "end 0"), once; the second ran alone after it.
        runs = [line.split()[:2] for line in out.read_text().splitlines()]
        assert runs == [["start", "0"], ["start", "1"], ["end", "1"]]
        kinds = [e["kind"] for e in job["events"]]
        assert kinds.count("started") == 2 and kinds.count("succeeded") == 1
        assert kinds.count("task-exited") == 2  # one end for each attempt


def test_a_cancel_ends_a_task_whose_supervisor_is_stopped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with local_service(tmp_path) as svc:
        job_id = submit(svc, out, grace_period="1s")
        pid, _ = supervisor_of(svc, job_id, 1)
        wait_for("the task to note its start", lambda: out.exists() and out.read_text())
        task = int(out.read_text().split()[2])
        task_start = processes.start_time(task)
        os.kill(pid, signal.SIGSTOP)  # a supervisor frozen by hand, or by a debugger
        svc.cli("cancel", job_id)
        job = svc.wait_state(job_id, "cancelled")
        assert task_start is not None and not processes.is_alive(task, task_start)
        kinds = [e["kind"] for e in job["events"]]
        assert kinds.count("task-exited") == 1 and kinds.count("started") == 1

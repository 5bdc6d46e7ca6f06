"""How a Ray task's runner (`TaskRunner`, the code that runs on its node) tells its node's
agent that it started and ended: `Latch` calls back, once, whoever asked (the agent's event
loop, which holds no thread per task); and a start asked twice starts the command once. A
real process; Ray itself is not needed here (tests/ray runs the agent on a Ray cluster)."""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest

from aisched.executors.ray_task import Latch, TaskRunner


def test_a_latch_calls_back_once_whether_asked_before_or_after_it_is_set() -> None:
    latch = Latch()
    calls: list[str] = []
    latch.then(lambda: calls.append("before"))
    assert (latch.is_set(), calls) == (False, [])
    latch.set()
    latch.set()
    latch.then(lambda: calls.append("after"))
    assert (latch.is_set(), latch.wait(0), calls) == (True, True, ["before", "after"])


def test_a_start_asked_twice_starts_the_command_once_and_the_end_calls_back(
    tmp_path: Path,
) -> None:
    marks = tmp_path / "marks"
    spec = {
        "command": ["sh", "-c", f"echo started >> {marks}"],
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "workdir": None,
        "log_path": str(tmp_path / "t.log"),
        "key": ["j1", 0, "t-0"],
    }
    runner = TaskRunner(spec)
    ended = threading.Event()
    runner.done.then(ended.set)
    runner.begin()
    runner.begin()
    assert runner.start()["pid"] > 0
    assert ended.wait(30)
    assert runner.wait()["kind"] == "exited" and runner.wait()["exit_code"] == 0
    assert marks.read_text() == "started\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a Ray worker that switches users)")
def test_a_task_whose_users_name_is_another_uid_on_its_node_does_not_start(
    tmp_path: Path,
) -> None:
    """On a Ray node the name is looked up there: where it names another uid than the one
    that submitted the job (another account, or the node's user database differs), the task
    does not start as it."""
    marks = tmp_path / "marks"
    nobody = pwd.getpwnam("nobody")
    spec = {
        "command": ["sh", "-c", f"echo started >> {marks}"],
        "env": {"PATH": "/usr/bin:/bin"},
        "workdir": None,
        "log_path": str(tmp_path / "t.log"),
        "key": ["j1", 0, "t-0"],
        "user": "nobody",
        "uid": nobody.pw_uid - 1,
    }
    runner = TaskRunner(spec)
    runner.begin()
    ended = runner.start()["exit"]
    assert ended["exit_code"] == 126
    assert ended["message"] == (
        f"user 'nobody' is uid {nobody.pw_uid} on this machine, not uid {nobody.pw_uid - 1}, "
        "which submitted the job: the name now belongs to another account, so the task does "
        "not run as it"
    )
    assert not marks.exists()

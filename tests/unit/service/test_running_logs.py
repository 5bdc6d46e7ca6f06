"""The bound on what one user's running jobs' logs take (`limits.user_max_running_log_bytes`),
on real files: past it the user's jobs with the most logs are named to stop, largest first,
until the rest fit; other users' jobs never; a check runs once every `CHECK_EVERY_S`."""

from __future__ import annotations

from pathlib import Path

from aisched.service.ended_bytes import disk_bytes
from aisched.service.running_logs import CHECK_EVERY_S, RunningLogs

KIB = 1024


def write_log(logs: Path, job_id: str, size: int, task: str = "main-0") -> None:
    """`size` more bytes in a running job's task log, as its supervisor writes them."""
    folder = logs / job_id / "1"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{task}.log").open("ab") as f:
        f.write(b"x" * size)


def test_a_users_jobs_with_the_most_logs_are_stopped_until_the_rest_fit(tmp_path: Path) -> None:
    for job_id, size in (("1", 100), ("2", 300), ("3", 200), ("4", 300)):
        write_log(tmp_path, job_id, size * KIB)
    write_log(tmp_path, "5", 200 * KIB)
    write_log(tmp_path, "6", 900 * KIB)
    bound = disk_bytes(tmp_path / "1") + disk_bytes(tmp_path / "3") + 8 * KIB
    running = {"1": "alice", "2": "alice", "3": "alice", "4": "alice", "5": "bob"}
    logs = RunningLogs(tmp_path, bound)
    got = logs.over(running, now=0.0)
    # 2 and 4 took the most (300 KiB each): the newest of them first, then the other.
    assert [job_id for job_id, _ in got] == ["4", "2"]
    assert "alice's running jobs' logs took" in got[0][1]
    assert "limits.user_max_running_log_bytes" in got[0][1] and "not retried" in got[0][1]
    assert logs.stopped == 2
    # bob's job fits, beside alice's over the bound. One job over it on its own is stopped.
    bob = RunningLogs(tmp_path, bound)
    assert [j for j, _ in bob.over({"5": "bob", "6": "bob"}, now=0.0)] == ["6"]


def test_a_check_comes_once_every_interval_and_sees_what_was_written_since(
    tmp_path: Path,
) -> None:
    write_log(tmp_path, "1", 100 * KIB)
    logs = RunningLogs(tmp_path, 150 * KIB)
    running = {"1": "alice"}
    assert logs.over(running, now=0.0) == []
    write_log(tmp_path, "1", 100 * KIB)
    assert logs.over(running, now=CHECK_EVERY_S / 2) == []  # not due yet
    assert [j for j, _ in logs.over(running, now=CHECK_EVERY_S)] == ["1"]


def test_jobs_no_longer_running_count_no_more(tmp_path: Path) -> None:
    write_log(tmp_path, "1", 100 * KIB)
    write_log(tmp_path, "2", 100 * KIB)
    logs = RunningLogs(tmp_path, 150 * KIB)
    assert logs.over({"1": "alice"}, now=0.0) == []
    # 1 ended (or is being stopped): its logs are no longer running ones; 2 alone fits.
    assert logs.over({"2": "alice"}, now=CHECK_EVERY_S) == []
    assert set(logs.sizes) == {"2"}


def test_without_a_bound_nothing_is_measured(tmp_path: Path) -> None:
    write_log(tmp_path, "1", 100 * KIB)
    logs = RunningLogs(tmp_path, 0)
    assert logs.over({"1": "alice"}, now=0.0) == []
    assert logs.sizes == {}


def test_an_id_that_is_not_decimal_is_no_path_to_follow(tmp_path: Path) -> None:
    write_log(tmp_path, "1", 100 * KIB)
    logs = RunningLogs(tmp_path / "sub", 1)
    assert logs.over({"../1": "alice"}, now=0.0) == []
    assert logs.sizes == {}

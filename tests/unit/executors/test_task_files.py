"""The task directory's lock as the executor probes it (real flock(2) locks: two opens of one
file conflict as two processes' would): `try_flock` takes a free lock and reports a held one,
and `supervisor_alive_or_abandon` marks a task abandoned only when no supervisor holds it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from aisched.executors import task_files


def _open_lock(task_dir: Path) -> int:
    return os.open(task_dir / task_files.LOCK, os.O_RDWR | os.O_CREAT, 0o600)


@pytest.mark.parametrize("held_mode", [fcntl.LOCK_SH, fcntl.LOCK_EX], ids=["shared", "exclusive"])
def test_try_flock_takes_a_free_lock_and_reports_a_held_one(tmp_path: Path, held_mode: int) -> None:
    holder, prober = _open_lock(tmp_path), _open_lock(tmp_path)
    try:
        assert task_files.try_flock(holder, held_mode)
        shared_ok = held_mode == fcntl.LOCK_SH  # shared locks do not conflict with each other
        assert task_files.try_flock(prober, fcntl.LOCK_SH) == shared_ok
        assert not task_files.try_flock(prober, fcntl.LOCK_EX)
        os.close(holder)  # releases it
        holder = -1
        assert task_files.try_flock(prober, fcntl.LOCK_EX)
    finally:
        for fd in (holder, prober):
            if fd >= 0:
                os.close(fd)


def test_try_flock_raises_other_errors(tmp_path: Path) -> None:
    fd = _open_lock(tmp_path)
    os.close(fd)
    with pytest.raises(OSError):  # EBADF: not "held by another"
        task_files.try_flock(fd, fcntl.LOCK_EX)


def test_abandons_only_a_task_whose_supervisor_is_gone(tmp_path: Path) -> None:
    supervisor = _open_lock(tmp_path)
    try:
        assert task_files.try_flock(supervisor, fcntl.LOCK_EX)
        assert task_files.supervisor_alive_or_abandon(str(tmp_path))
        assert not (tmp_path / task_files.ABANDONED).exists()
    finally:
        os.close(supervisor)
    assert not task_files.supervisor_alive_or_abandon(str(tmp_path))
    assert (tmp_path / task_files.ABANDONED).exists()

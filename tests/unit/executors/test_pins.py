"""Pins (supervisor_pins.py): a user's host path is opened without following a link, judged by the
user's rights on what was opened, and bind-mounted at a place of root's for the engine. Needs
root (mounts, another user's files)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from aisched.executors.supervisor_pins import PIN_ROOT, Pins
from aisched.executors.task_files import ExecFailed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pins are mounts: they need root")

NOBODY = 65534


@pytest.fixture
def top() -> Iterator[Path]:
    made = Path(tempfile.mkdtemp())  # pytest's own is in a directory of root's alone
    made.chmod(0o755)  # nobody may pass through
    yield made
    shutil.rmtree(made)


def pins() -> Pins:
    return Pins("test", NOBODY, frozenset({NOBODY}))


def mounted(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return any(line.split()[4] == path for line in f)


def test_a_pin_is_what_the_path_named_when_it_was_opened(top: Path) -> None:
    data = top / "data"
    data.mkdir()
    os.chown(data, NOBODY, NOBODY)
    (data / "mine").write_text("hers\n")
    p = pins()
    try:
        dest, writable = p.pin(str(data), own=False)
        assert writable and mounted(dest) and dest.startswith(f"{PIN_ROOT}/{os.getpid()}-")
        # Swapped for a link after the pin: the pin still holds her directory.
        data.rename(top / "moved")
        data.symlink_to("/etc")
        assert os.listdir(dest) == ["mine"]
    finally:
        p.release()
    assert not mounted(dest) and not os.path.exists(os.path.dirname(dest))
    assert (top / "moved" / "mine").read_text() == "hers\n"  # undoing a pin removes no file


def test_a_link_on_the_way_now_is_refused(top: Path) -> None:
    secret = top / "secret"
    secret.mkdir(mode=0o700)
    home = top / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    (home / "data").symlink_to(secret)  # put there after the path was checked and resolved
    with pytest.raises(ExecFailed) as err:
        pins().pin(f"{home}/data/x", own=False)
    assert err.value.message == (
        f"{home}/data/x: {home}/data is a symbolic link now, not what was checked: refused"
    )


def test_what_the_user_may_not_reach_read_or_own_is_refused(top: Path) -> None:
    closed = top / "closed"
    closed.mkdir(mode=0o700)
    (closed / "inside").mkdir(mode=0o755)
    unreadable = top / "unreadable"
    unreadable.mkdir(mode=0o711)
    refused = []
    for path, own in ((closed / "inside", False), (unreadable, False), (top, True)):
        with pytest.raises(ExecFailed) as err:
            pins().pin(str(path), own=own)
        refused.append(err.value.message)
    assert refused == [
        f"{closed}/inside: uid {NOBODY} may not search {closed}: refused",
        f"{unreadable}: uid {NOBODY} may not read it: refused",
        f"{top}: not a directory of uid {NOBODY}: refused",
    ]


def test_what_the_user_may_read_but_not_write_is_pinned_read_only(top: Path) -> None:
    (top / "file").write_text("root's\n")
    p = pins()
    try:
        dest, writable = p.pin(str(top), own=False)
        assert not writable
        dest_file, writable_file = p.pin(str(top / "file"), own=False)
        assert not writable_file and Path(dest_file).read_text() == "root's\n"
    finally:
        p.release()


def test_pins_left_by_a_supervisor_that_died_are_undone_and_keep_the_files(top: Path) -> None:
    kept = top / "kept"
    kept.mkdir()
    (kept / "keep").write_text("x\n")
    os.makedirs(PIN_ROOT, mode=0o700, exist_ok=True)
    # This pid with another start time: a supervisor that is no longer alive.
    stale = Path(PIN_ROOT) / f"{os.getpid()}-1-gone"
    (stale / "0").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(kept), str(stale / "0")], check=True)
    p = pins()
    try:
        p.pin(str(top), own=False)
        assert not stale.exists() and not mounted(str(stale / "0"))
        assert (kept / "keep").read_text() == "x\n"
    finally:
        p.release()
        if mounted(str(stale / "0")):
            subprocess.run(["umount", "-l", str(stale / "0")], check=False)


def test_a_nested_pin_holds_the_directories_on_its_way_until_it_is_released(top: Path) -> None:
    data, inner = top / "data", top / "inner"
    (data / "a" / "b").mkdir(parents=True)
    inner.mkdir()
    (inner / "f").write_text("x\n")
    for p in (data, data / "a", data / "a" / "b"):
        os.chown(p, NOBODY, NOBODY)
    p = pins()
    try:
        outer, _ = p.pin(str(data), own=False)
        nested, _ = p.pin(str(inner), own=False)
        p.nest(nested, outer, "a/b", str(data), read_only=True)
        assert os.listdir(f"{outer}/a/b") == ["f"] and not mounted(f"{data}/a/b")
        with pytest.raises(OSError) as busy:
            (data / "a").rename(data / "moved")  # then a link in its place: not now
        with pytest.raises(OSError) as read_only:
            Path(f"{outer}/a/b/new").write_text("")
    finally:
        p.release()
    assert (busy.value.errno, read_only.value.errno) == (errno.EBUSY, errno.EROFS)
    (data / "a").rename(data / "moved")  # released: hers to change again
    assert os.listdir(data / "moved" / "b") == [] and os.listdir(inner) == ["f"]


@pytest.mark.skipif(shutil.which("podman") is None, reason="the executor removes with podman")
def test_the_executor_undoes_the_pins_of_a_container_supervisor_it_finds_gone(top: Path) -> None:
    # Killed between pinning and letting go, no later container task on the node may come
    # to sweep them: the executor, finding the supervisor gone, does.
    from aisched.executors.local import _remove_container

    os.makedirs(PIN_ROOT, mode=0o700, exist_ok=True)
    stale = Path(PIN_ROOT) / f"{os.getpid()}-1-gone"
    # Made under a name no sweep reads, then renamed into place with its pin mounted: a
    # container supervisor of a test running beside this one sweeps dead supervisors' pins,
    # and once removed this one's "0" between its mkdir and its mount.
    making = Path(PIN_ROOT) / f"making-{os.getpid()}"
    (making / "0").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(top), str(making / "0")], check=True)
    making.rename(stale)
    try:
        _remove_container({"container": {"binary": "podman", "name": "aisched-pins-gone"}})
        assert not stale.exists() and not mounted(str(stale / "0"))
    finally:
        if mounted(str(stale / "0")):
            subprocess.run(["umount", "-l", str(stale / "0")], check=False)
            shutil.rmtree(stale)

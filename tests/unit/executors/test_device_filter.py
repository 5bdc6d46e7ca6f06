"""The cgroup v2 device filter (`device_filter.py`) and the v2 GPU walls of `cgroups.py`, on
this machine's real cgroup2 hierarchy (the unified one beside cgroup v1 here): a process in
the cgroup cannot open the devices it is denied, root or not, and cannot leave the cgroup.
Devices of /dev stand in for GPUs (no GPU here): /dev/full is 1:7, /dev/random 1:8."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from aisched.executors import device_filter
from aisched.executors.cgroups import MemoryControl, choose_task_bounds, create_bounds
from aisched.executors.device_filter import deny_devices, program
from aisched.testing.child import in_child

FULL, RANDOM = (1, 7), (1, 8)
NOBODY = 65534


def _cgroup2_here() -> Path | None:
    """The directory of this process's cgroup in the cgroup2 hierarchy, if one is mounted."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = [ln.split() for ln in f]
    point = next((m[4] for m in mounts if m[m.index("-") + 1] == "cgroup2"), None)
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        own = next((ln.strip()[3:] for ln in f if ln.startswith("0::")), None)
    return None if point is None or own is None else Path(point + own)


@pytest.fixture
def cgroup2(tmp_path: Path) -> Iterator[Path]:
    here = _cgroup2_here()
    if os.geteuid() != 0 or here is None:
        pytest.skip("needs root and a cgroup2 hierarchy")
    test_dir = here / f"ais-devices-{os.getpid()}-{tmp_path.name[-12:]}"
    test_dir.mkdir()
    yield test_dir
    for sub in sorted(test_dir.rglob("*"), reverse=True):
        if sub.is_dir():
            sub.rmdir()
    test_dir.rmdir()


def opens_in(cgroup: Path, *paths: str, as_uid: int | None = None) -> dict[str, str]:
    """What a child that joined `cgroup` (and then became `as_uid`) got opening each path, and
    writing itself into the cgroup's parent (`leave`)."""

    def probe() -> str:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        if as_uid is not None:
            os.setgid(as_uid)
            os.setuid(as_uid)
        out = []
        for path in paths:
            try:
                os.close(os.open(path, os.O_RDONLY))
                out.append(f"{path}=opens")
            except OSError as e:
                out.append(f"{path}={errno.errorcode[e.errno]}")
        if as_uid is not None:
            try:
                (cgroup.parent / "cgroup.procs").write_text(str(os.getpid()))
                out.append("leave=left")
            except OSError as e:
                out.append(f"leave={errno.errorcode[e.errno]}")
            try:  # BPF_PROG_DETACH of the cgroup's device programs
                fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
                attr = bytearray(128)
                struct.pack_into("<III", attr, 0, fd, 0, 6)
                device_filter._bpf(9, attr, "detach")
                out.append("detach=detached")
            except OSError:
                out.append("detach=refused")
            try:
                os.close(os.open(paths[0], os.O_RDONLY))
                out.append("after=opens")
            except OSError as e:
                out.append(f"after={errno.errorcode[e.errno]}")
        return " ".join(out)

    said = in_child(probe)
    return dict(item.split("=", 1) for item in said.split())


def test_the_program_is_seven_instructions_and_four_per_device() -> None:
    assert len(program([])) == 7 * 8
    assert len(program([FULL, RANDOM])) == (7 + 8) * 8


def test_a_filtered_cgroup_denies_its_devices_to_root_and_to_a_user(cgroup2: Path) -> None:
    deny_devices(str(cgroup2), [FULL])
    assert opens_in(cgroup2, "/dev/full", "/dev/zero", "/dev/random") == {
        "/dev/full": "EPERM",
        "/dev/zero": "opens",
        "/dev/random": "opens",
    }
    # A user in it is denied too, cannot leave for the parent cgroup (root's), and cannot
    # detach the filter; after trying, it is still denied.
    assert opens_in(cgroup2, "/dev/full", "/dev/zero", as_uid=NOBODY) == {
        "/dev/full": "EPERM",
        "/dev/zero": "opens",
        "leave": "EACCES",
        "detach": "refused",
        "after": "EPERM",
    }


def test_v2_gpu_walls_are_chosen_after_a_probe_and_set_per_task(cgroup2: Path) -> None:
    mem = MemoryControl("cgroup-v2", str(cgroup2))
    bounds = choose_task_bounds(mem, (FULL, RANDOM))
    assert bounds.gpu_walls
    assert any("GPU walls: BPF device filters (v2)" in n for n in bounds.notes), bounds.notes
    assert [p.name for p in cgroup2.iterdir() if p.is_dir()] == []  # the probe's cgroup went
    # A task given the second "GPU" is denied the first only.
    task = cgroup2 / "task"
    task.mkdir()
    create_bounds(bounds, "task", str(task), 64, (), 0, 64, deny=(FULL,))
    assert opens_in(task, "/dev/full", "/dev/random") == {
        "/dev/full": "EPERM",
        "/dev/random": "opens",
    }
    assert not choose_task_bounds(mem).gpu_walls  # no GPUs: nothing asked for


def test_a_device_filter_on_no_cgroup_says_why(tmp_path: Path) -> None:
    with pytest.raises(OSError) as err:
        deny_devices(str(tmp_path / "gone"), [FULL])
    assert err.value.errno == errno.ENOENT

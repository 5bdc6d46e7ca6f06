"""The GPU walls' rules and environment (`gpu_walls.py`), on real device files of this machine;
the walls themselves are tested end to end in tests/e2e/test_gpu_walls_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from aisched.executors.gpu_walls import GpuDevices, GpuWallError, gpu_devices, walled_env


def test_a_task_is_denied_every_gpu_file_but_its_own() -> None:
    devices = GpuDevices(((195, 0), (195, 1), (195, 2), (195, 3)))
    assert devices.denied((1, 3)) == ((195, 0), (195, 2))
    assert devices.denied(()) == devices.numbers
    assert devices.denied((0, 1, 2, 3)) == ()


def test_device_numbers_are_read_from_the_files() -> None:
    assert gpu_devices(["/dev/null", "/dev/zero"], 2) == GpuDevices(((1, 3), (1, 5)))


def test_files_that_cannot_be_a_gpus_are_refused_with_which_and_why(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    for files, count, want in [
        (["/dev/null"], 2, "1 files for 2 GPUs"),
        (["/dev/null", str(plain)], 2, f"[1]: {plain} is not a character device"),
        ([str(tmp_path / "gone")], 1, "[0]: "),
        (["/dev/null", "/dev/null"], 2, "two GPUs have the same device file"),
    ]:
        with pytest.raises(GpuWallError, match=r"node\.gpu_device_files") as err:
            gpu_devices(files, count)
        assert want in str(err.value)


def test_a_walled_task_counts_its_gpus_from_zero_and_is_told_the_hosts_numbers() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3,1", "KEEP": "x"}
    assert walled_env(env, (3, 1)) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "AISCHED_GPUS": "1,3",
        "KEEP": "x",
    }
    assert walled_env({}, ())["CUDA_VISIBLE_DEVICES"] == ""


def test_the_machines_gpus_that_are_not_scheduled_are_denied_to_every_task() -> None:
    # `node.gpus: 1` on a machine of 2: the second GPU is no task's.
    devices = gpu_devices(["/dev/null", "/dev/zero"], 1, unscheduled=1)
    assert devices.denied((0,)) == ((1, 5),)
    assert devices.denied(()) == ((1, 3), (1, 5)) == devices.every_gpu

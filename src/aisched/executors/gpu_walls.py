"""GPU walls: a host task opens the device files of its own GPUs only.

`CUDA_VISIBLE_DEVICES` is a variable, not a wall: NVIDIA's driver makes `/dev/nvidia0`, ...
readable and writable by every user, so a task that sets the variable again could use every
GPU of the machine, other users' jobs' included. So each host task's cgroups deny the device
files of every GPU it was not given (`cgroups.py`): under cgroup v1 a `devices` cgroup of its
own beside its pids and cpuset ones, under v2 a BPF device filter on its one cgroup
(`device_filter.py`). The kernel checks them at each open and mknod, for root as for anyone,
and a user's task can neither change them nor leave its cgroups (their files are root's; a
task of root's could, as root can do anything).
The driver's shared files (`nvidiactl`, `nvidia-uvm`, ...) stay open to all: CUDA needs them.

CUDA skips the GPUs it cannot open and numbers the rest from 0 (Slurm sets local indices for
this reason when its cgroups constrain devices), so a walled task's `CUDA_VISIBLE_DEVICES` is
`0..n-1`, as in a container; its GPUs in the host's numbering are in `AISCHED_GPUS`.

Which file is which GPU: NVML's minor number of each GPU (`/dev/nvidia<minor>`), or the files
the operator lists (`node.gpu_device_files`). Declared GPUs with no device files have nothing
to wall.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONFIG_KEY = "node.gpu_device_files"


class GpuWallError(ValueError):
    """A GPU device file that cannot be walled: says which and why."""


@dataclass(frozen=True, slots=True)
class GpuDevices:
    """The device number (major, minor) of each GPU's file, in GPU index order, and of the
    machine's GPUs that are not scheduled (`node.gpus: N` of more: no task gets those)."""

    numbers: tuple[tuple[int, int], ...]
    unscheduled: tuple[tuple[int, int], ...] = ()

    def denied(self, gpus: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The devices a task given `gpus` is denied: every other GPU's file."""
        mine = set(gpus)
        others = tuple(n for index, n in enumerate(self.numbers) if index not in mine)
        return others + self.unscheduled

    @property
    def every_gpu(self) -> tuple[tuple[int, int], ...]:
        return self.numbers + self.unscheduled


def gpu_devices(
    files: Sequence[str], gpu_count: int, unscheduled: int = 0, source: str = CONFIG_KEY
) -> GpuDevices:
    """The device numbers of `files` (GPU i's file at i; the last `unscheduled` are GPUs no
    task gets), named by `source` where wrong. Raises GpuWallError when their count is not the
    node's GPUs' or one is not a character device."""
    if len(files) != gpu_count + unscheduled:
        raise GpuWallError(
            f"{source}: {len(files)} files for {gpu_count} GPUs (one file per GPU, in index order)"
        )
    numbers = []
    for i, path in enumerate(files):
        try:
            st = os.stat(path)
        except OSError as exc:
            raise GpuWallError(f"{source}[{i}]: {path}: {exc.strerror or exc}") from None
        if not stat.S_ISCHR(st.st_mode):
            raise GpuWallError(f"{source}[{i}]: {path} is not a character device")
        numbers.append((os.major(st.st_rdev), os.minor(st.st_rdev)))
    if len(set(numbers)) != len(numbers):
        raise GpuWallError(f"{source}: two GPUs have the same device file")
    return GpuDevices(tuple(numbers[:gpu_count]), tuple(numbers[gpu_count:]))


def walled_env(env: Mapping[str, str], gpus: Sequence[int]) -> dict[str, str]:
    """A walled task's environment: CUDA numbers the GPUs it can open from 0."""
    out = dict(env)
    out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    out["AISCHED_GPUS"] = ",".join(str(g) for g in sorted(gpus))
    return out

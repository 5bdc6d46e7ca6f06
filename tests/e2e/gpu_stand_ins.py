"""Stand-ins for GPUs' device files, for the GPU walls' tests on a machine with no GPU: real
character devices with the numbers of harmless ones (/dev/zero's, /dev/full's, ...), which
the kernel's device cgroup checks as it would NVIDIA's (major 195); and the probe a task runs
to say which of them it can open."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# (name, major, minor) of up to 4 stand-ins: /dev/zero, /dev/full, /dev/random, /dev/urandom.
STAND_INS = [("nvidia0", 1, 5), ("nvidia1", 1, 7), ("nvidia2", 1, 8), ("nvidia3", 1, 9)]

# Prints "NAME opens" or "NAME ERRNO" for each file given, then the task's GPU variables as
# "VARIABLE=value".
OPEN_PROBE = r"""
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print(os.path.basename(path), "opens")
    except OSError as e:
        print(os.path.basename(path), errno.errorcode[e.errno])
print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"])
print("AISCHED_GPUS=" + os.environ.get("AISCHED_GPUS", "(none)"))
"""


@contextmanager
def stand_in_files(count: int) -> Iterator[list[str]]:
    """`count` stand-ins, 0666 as NVIDIA's driver makes its files, in a directory every user
    can reach (pytest's own is root's alone); removed after."""
    dev = Path(tempfile.mkdtemp(prefix="ais-gpus-"))
    dev.chmod(0o755)
    try:
        files = []
        for name, major, minor in STAND_INS[:count]:
            os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            (dev / name).chmod(0o666)
            files.append(str(dev / name))
        yield files
    finally:
        shutil.rmtree(dev)


def seen(log: str) -> dict[str, str]:
    """What the probe printed: file name or variable -> result (a key seen again gets `-2`)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        key, _, value = line.replace("=", " ", 1).partition(" ")
        out[key if key not in out else f"{key}-2"] = value
    return out

"""mount(2) and its kin (umount2, unshare), for the supervisor's pins and private /dev/shm.

It must import only the standard library and stay side-effect free at import: the supervisor
imports it (see `supervisor.py`), running with `-I -S`.
"""

from __future__ import annotations

import os

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MS_BIND, MS_REC, MS_PRIVATE, MS_SLAVE = 0x1000, 0x4000, 1 << 18, 1 << 19
MNT_DETACH = 0x2
CLONE_NEWNS = 0x00020000


def syscall(name: str, *args: object) -> None:
    """libc's `name` (mount, umount2, unshare) through ctypes (Python 3.11 has no os.unshare
    and no mount): one call each, no helper process to start or to parse the errors of."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, name)
    if name == "mount":
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]  # fmt: skip
    raw = [a.encode() if isinstance(a, str) else a for a in args]
    if fn(*raw) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")

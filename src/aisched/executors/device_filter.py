"""A cgroup v2 device filter: the BPF program that denies a task some character devices.

cgroup v2 has no `devices.deny` file: the kernel asks the BPF programs of type
`CGROUP_DEVICE` attached to a process's cgroup (and its ancestors) at every open and mknod of
a device. This module assembles one such program, which denies a list of (major, minor)
character devices and allows everything else, loads it with bpf(2) and attaches it to a cgroup
with `BPF_F_ALLOW_MULTI` (the programs an ancestor attached, systemd's among them, still run:
a device is allowed only if all of them allow it). The attachment lives as long as the
cgroup; a user's process in it cannot detach it (bpf(2) wants CAP_BPF or CAP_SYS_ADMIN where
unprivileged BPF is off, the kernel's default, and the program's handle, which only such a
process can get) nor leave the cgroup (its `cgroup.procs` and its parent's are root's).

The program, in the kernel's BPF instruction set (runc and systemd emit the same shape):

    r2 = ctx->access_type & 0xffff      # the device's type: 1 block, 2 character
    r3 = ctx->major; r4 = ctx->minor
    if r2 != 2 goto allow
    if r3 != MAJOR goto next; if r4 != MINOR goto next; r0 = 0; exit   # one per device
    allow: r0 = 1; exit

Standard library only (ctypes): no BPF library is on the machines it runs on.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence

_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_BPF_PROG_LOAD, _BPF_PROG_ATTACH = 5, 8
_BPF_PROG_TYPE_CGROUP_DEVICE, _BPF_CGROUP_DEVICE = 15, 6
_BPF_F_ALLOW_MULTI = 2
_BPF_DEVCG_DEV_CHAR = 2
_ATTR_SIZE = 128  # bigger than every field used; the kernel checks the rest is zero
_LOG_SIZE = 1 << 16

# Opcodes: load a 32-bit word, and with a constant, jump if not equal to one, move one, exit.
_LDX_W, _AND_K, _JNE_K, _MOV_K, _EXIT = 0x61, 0x57, 0x55, 0xB7, 0x95


def _insn(op: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)


def program(deny: Sequence[tuple[int, int]]) -> bytes:
    """The instructions of a program that denies the character devices `deny`."""
    code = [
        _insn(_LDX_W, dst=2, src=1, off=0),  # access_type
        _insn(_AND_K, dst=2, imm=0xFFFF),
        _insn(_LDX_W, dst=3, src=1, off=4),  # major
        _insn(_LDX_W, dst=4, src=1, off=8),  # minor
        _insn(_JNE_K, dst=2, off=4 * len(deny), imm=_BPF_DEVCG_DEV_CHAR),
    ]
    for major, minor in deny:
        code += [
            _insn(_JNE_K, dst=3, off=3, imm=major),
            _insn(_JNE_K, dst=4, off=2, imm=minor),
            _insn(_MOV_K, dst=0, imm=0),
            _insn(_EXIT),
        ]
    code += [_insn(_MOV_K, dst=0, imm=1), _insn(_EXIT)]
    return b"".join(code)


def deny_devices(cgroup: str, deny: Sequence[tuple[int, int]]) -> None:
    """Attach a program denying `deny` to the cgroup v2 directory `cgroup`. Raises OSError
    (with the kernel verifier's words when it refuses the program)."""
    prog = _load(program(deny))
    try:
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attr = bytearray(_ATTR_SIZE)
            struct.pack_into("<IIII", attr, 0, fd, prog, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI)
            _bpf(_BPF_PROG_ATTACH, attr, "attach the device filter")
        finally:
            os.close(fd)
    finally:
        os.close(prog)  # the attachment holds the program from here on


def _load(code: bytes) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(_LOG_SIZE)
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into(
        "<IIQQIIQ", attr, 0, _BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
        ctypes.addressof(insns), ctypes.addressof(license_), 1, _LOG_SIZE, ctypes.addressof(log),
    )  # fmt: skip
    try:
        return _bpf(_BPF_PROG_LOAD, attr, "load the device filter")
    except OSError as exc:
        said = log.value.decode(errors="replace").strip().splitlines()
        if said:
            raise OSError(exc.errno, f"{exc.strerror}: {said[-1]}") from None
        raise


def _bpf(cmd: int, attr: bytearray, doing: str) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"cannot {doing}: no bpf(2) number for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    out = int(libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(len(attr))))
    if out < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot {doing}: {os.strerror(err)}")
    return out

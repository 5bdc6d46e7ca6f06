"""The container image the container tests run: built here, from files of this machine, with
`podman import` (no registry is reachable, and none is needed).

Its root filesystem: busybox-static (a shell and the usual tools), the host's Python with its
standard library (for the senders, receivers and probes the tests run inside), an /etc/passwd
with `nobody`, a marker file the host does not have, and a setuid-root copy of Python (to show
that the hardening every container gets keeps it from gaining root).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness import machine_lock

MARKER = "/etc/aisched-test-image"
MARKER_TEXT = "inside the aisched test image\n"
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
               "__pycache__", "site-packages", "dist-packages"}  # fmt: skip


def missing_tools() -> str | None:
    """Why the image cannot be built here, or None."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin:/usr/bin:/bin"
    for tool in ("podman", "busybox", "ldd", "tc", "nsenter"):
        if shutil.which(tool, path=path) is None:
            return f"{tool} is not installed (CI installs it: see .ci/run)"
    return None


def _python() -> Path:
    # The interpreter itself, not a virtual environment's link to it.
    return Path(os.path.realpath(sys.executable)).resolve()


def _libs(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        words = line.split()
        for w in words:
            if w.startswith("/"):
                libs.append(Path(w))
    return libs


def _add(tar: tarfile.TarFile, src: Path, dst: str, mode: int | None = None) -> None:
    info = tar.gettarinfo(str(src), arcname=dst.lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if mode is not None:
        info.mode = mode
    with open(src, "rb") as f:
        tar.addfile(info, f)


def _dir(tar: tarfile.TarFile, dst: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(dst.lstrip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _text(tar: tarfile.TarFile, dst: str, text: str) -> None:
    import io

    data = text.encode()
    info = tarfile.TarInfo(dst.lstrip("/"))
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def build_test_image(as_user: Sequence[str] = (), engine: Sequence[str] = ("podman",)) -> str:
    """The image's name, built (once per content) and imported into the engine (podman, or
    `engine`: a docker command line with its daemon's socket): root's, or with `as_user` (a
    command prefix that runs podman as another user) that user's own store."""
    busybox = Path(shutil.which("busybox") or "/bin/busybox").resolve()
    python = _python()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    key = hashlib.sha256(f"{busybox.stat().st_size}{python}{stdlib}{MARKER_TEXT}v1".encode())
    name = f"localhost/aisched-test:{key.hexdigest()[:12]}"
    exists = [*as_user, *engine, "image", "inspect", "--format", "{{.Id}}", name]
    # One build at a time on this machine: a second import of the name by another pytest
    # worker would move the name to a new image under the first worker's tests.
    with machine_lock("test-image"), tempfile.TemporaryDirectory() as tmp:
        if subprocess.run(exists, check=False, capture_output=True).returncode == 0:
            return name
        Path(tmp).chmod(0o755)  # the other user's podman reads the tar
        path = Path(tmp) / "rootfs.tar"
        write_rootfs(path, busybox, python, stdlib)
        path.chmod(0o644)
        argv = [*as_user, *engine, "import", str(path), name]
        subprocess.run(argv, check=True, capture_output=True, cwd=tmp)
    return name


def write_rootfs(path: Path, busybox: Path, python: Path, stdlib: Path) -> None:
    """The image's root filesystem as a tar (see the module docstring)."""
    with tarfile.open(path, "w") as tar:
        for d in (
            "/bin",
            "/etc",
            "/tmp",
            "/lib",
            "/lib64",
            "/usr",
            "/usr/bin",
            "/usr/lib",
            "/root",
            "/data",
        ):
            _dir(tar, d, 0o1777 if d == "/tmp" else 0o755)
        _add(tar, busybox, "/bin/busybox")
        for applet in (
            "sh",
            "ls",
            "cat",
            "echo",
            "sleep",
            "id",
            "nc",
            "dd",
            "wc",
            "true",
            "false",
            "head",
            "env",
            "ps",
            "grep",
            "mkdir",
            "rm",
        ):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        _add(tar, python, "/usr/bin/python3")
        _add(tar, python, "/usr/bin/suid-python3", mode=0o4755)
        seen: set[str] = set()
        for lib in _libs(python):
            for dst in (str(lib), str(lib.resolve())):
                if dst not in seen:
                    seen.add(dst)
                    _add(tar, lib.resolve(), dst)
        for root, dirs, files in os.walk(stdlib):
            dirs[:] = [d for d in dirs if d not in SKIP_STDLIB]
            rel = Path(root).relative_to(stdlib)
            _dir(tar, str(stdlib / rel))
            for f in files:
                if f.endswith((".py", ".so")):
                    _add(tar, Path(root) / f, str(stdlib / rel / f))
        dynload = Path(sysconfig.get_config_var("DESTSHARED") or stdlib / "lib-dynload")
        if dynload.is_dir() and not str(dynload).startswith(str(stdlib)):
            _dir(tar, str(dynload))
            for f in dynload.iterdir():
                _add(tar, f, str(dynload / f.name))
        _text(
            tar,
            "/etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
        )
        _text(tar, "/etc/group", "root:x:0:\nnogroup:x:65534:\n")
        _text(tar, MARKER, MARKER_TEXT)

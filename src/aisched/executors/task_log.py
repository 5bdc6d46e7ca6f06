"""A task's log, capped: what the supervisor (and a Ray host's task runner) copies its output to.

The log is outside the task directory (`launch["log_path"]`); past `log_max_bytes` it is
rotated, its rotated files are `LOG.1` (the newest) to `LOG.N-1`, at most `log_max_files`
files are kept, and each rotation leaves a note in the new file. A log that cannot be written
(a full disk) loses that output, never blocks the task, and says how many bytes were lost
once it can be written again.

It must import only the standard library and the supervisor's stdlib-only modules, never
`supervisor` itself, and stay side-effect free at import (see `supervisor.py`).
"""

from __future__ import annotations

import contextlib
import os

from aisched.executors.processes import MIB

# Task logs: 10 MiB per file and 3 files (the current one and two rotated), kubelet's default.
LOG_MAX_BYTES = 10 * MIB
LOG_MAX_FILES = 3


class CappedLog:
    """A task's log that never grows past `max_bytes` per file and `max_files` files.

    At the cap, `PATH.1` ... become `PATH.2` ... (the oldest dropped), `PATH` becomes `PATH.1`,
    and a new `PATH` starts with a line saying so; with `max_files` 1 the old output is dropped.
    `max_bytes` 0 means no cap. A write that fails (ENOSPC, EIO) drops that output: the task is
    never blocked by its log, and the next write that succeeds says how much was lost."""

    def __init__(self, path: str, max_bytes: int, max_files: int) -> None:
        self.path = path
        # Never below a page: each new file starts with a note that must fit.
        self.max_bytes = max(4096, max_bytes) if max_bytes > 0 else 0
        self.max_files = max(1, max_files)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self.fd).st_size
        self.start = self.size  # where this run's output begins in the current file
        self.rotations = 0
        self.dropped = 0  # bytes of output no longer kept (rotated out, or truncated)
        self.lost = 0  # bytes of output that could not be written, not yet said in the log
        self.lost_why = ""
        self.at_line_start = self.size == 0 or os.pread(self.fd, 1, self.size - 1) == b"\n"

    def write(self, data: bytes) -> None:
        while data:
            if self.max_bytes and self.size >= self.max_bytes:
                self.rotate()
            room = self.max_bytes - self.size if self.max_bytes else len(data)
            part, data = data[: max(room, 1)], data[max(room, 1) :]
            self._append(part)

    def _append(self, data: bytes) -> None:
        """Append task output; what cannot be written is counted, and said in the log (on a
        line of its own, the whole count) before the next output that can be."""
        if self.lost:
            if not self._note(f"aisched: {self.lost} bytes of output lost: {self.lost_why}"):
                self.lost += len(data)  # the disk is still full: this output goes too
                return
            self.lost = 0
        self.lost += self._put(data)

    def _note(self, line: str) -> bool:
        """Write one line of aisched's own, starting a line; whether it was written whole."""
        note = ("" if self.at_line_start else "\n") + line + "\n"
        return self._put(note.encode()) == 0

    def _put(self, data: bytes) -> int:
        """Write `data`; returns how many of its bytes could not be written."""
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                self.size += n
                if n:
                    self.at_line_start = view[n - 1] == ord("\n")
                view = view[n:]
        except OSError as exc:
            self.lost_why = f"cannot write the log: {exc.strerror or exc}"
        return len(view)

    def rotate(self) -> None:
        owner = os.fstat(self.fd)  # the new file is the task's user's, as the first was
        os.close(self.fd)
        self.rotations += 1
        try:
            if self.max_files == 1:
                self.dropped += self.size
                os.unlink(self.path)
            else:
                oldest = f"{self.path}.{self.max_files - 1}"
                with contextlib.suppress(FileNotFoundError):
                    self.dropped += os.stat(oldest).st_size
                for i in range(self.max_files - 1, 1, -1):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(f"{self.path}.{i - 1}", f"{self.path}.{i}")
                os.replace(self.path, f"{self.path}.1")
        except OSError:
            pass  # cannot rename: start the file again rather than let it grow
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        with contextlib.suppress(OSError):
            os.fchown(self.fd, owner.st_uid, owner.st_gid)
        self.size = self.start = 0
        name = os.path.basename(self.path)
        kept = (
            f"the output before this line is in {name}.1 to {name}.{self.max_files - 1}"
            if self.max_files > 2
            else f"the output before this line is in {name}.1"
            if self.max_files == 2
            else "the output before this line was dropped"
        )
        self.at_line_start = True
        self._note(
            f"aisched: log rotated ({self.rotations} time(s); at most {self.max_files} "
            f"file(s) of {self.max_bytes} bytes are kept): {kept}; {self.dropped} bytes of "
            "older log dropped"
        )

    def tail(self, n: int) -> bytes:
        """The last `n` bytes of this run's output in the current file."""
        try:
            size = os.fstat(self.fd).st_size
            start = max(self.start, size - n)
            return os.pread(self.fd, size - start, start) if size > start else b""
        except OSError:
            return b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

"""Task logs are capped by the supervisor: rotated past a size, a bounded number of files kept,
a note in the log at each rotation; a write that fails loses that output, not the task."""

from __future__ import annotations

import os
from pathlib import Path

from executor_harness import PY, Harness

from aisched.executors.base import ExitKind
from aisched.executors.task_log import CappedLog

KIB = 1024


def sizes(tmp: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(tmp.glob("t.log*"))}


def test_a_log_past_its_size_is_rotated_and_keeps_at_most_its_files(tmp_path: Path) -> None:
    log = CappedLog(str(tmp_path / "t.log"), 8 * KIB, 3)
    lines = [f"{i:04d}".encode() + b"x" * (KIB - 5) + b"\n" for i in range(40)]
    output = b"".join(lines)  # five files' worth
    log.write(output)
    log.close()
    got = sizes(tmp_path)
    assert sorted(got) == ["t.log", "t.log.1", "t.log.2"]
    assert all(size <= 8 * KIB for size in got.values())
    assert log.rotations == 5  # each new file starts with a note, so holds a little less
    notes = []
    kept = b""
    for name in ("t.log.2", "t.log.1", "t.log"):
        data = (tmp_path / name).read_bytes()
        note, _, rest = data.partition(b"\n")
        notes.append(note.decode())
        kept += rest
    # What is kept is the end of the output, whole: only the oldest output was dropped.
    assert output.endswith(kept)
    # Dropped: the two oldest files, whole.
    assert log.dropped >= len(output) - len(kept)
    assert notes[-1] == (
        "aisched: log rotated (5 time(s); at most 3 file(s) of 8192 bytes are kept): "
        f"the output before this line is in t.log.1 to t.log.2; {log.dropped} bytes of older "
        "log dropped"
    )


def test_with_one_file_the_old_output_is_dropped(tmp_path: Path) -> None:
    log = CappedLog(str(tmp_path / "t.log"), 4 * KIB, 1)
    log.write(b"a" * (10 * KIB))
    log.close()
    assert sorted(sizes(tmp_path)) == ["t.log"]
    assert (
        (tmp_path / "t.log")
        .read_text()
        .splitlines()[0]
        .endswith("the output before this line was dropped; 8192 bytes of older log dropped")
    )


def _written_past_a_full_disk(tmp_path: Path, before: bytes, lost: list[bytes]) -> str:
    """The log after `before`, then `lost` written while every write fails (EBADF, as on a
    full disk), then `after`."""
    log = CappedLog(str(tmp_path / "t.log"), 0, 3)
    log.write(before)
    good = log.fd
    log.fd = os.open(os.devnull, os.O_RDONLY)
    for chunk in lost:
        log.write(chunk)
    os.close(log.fd)
    log.fd = good
    log.write(b"after\n")
    log.close()
    return (tmp_path / "t.log").read_text()


def test_output_that_cannot_be_written_is_counted_and_said(tmp_path: Path) -> None:
    assert _written_past_a_full_disk(tmp_path, b"before\n", [b"lost output\n"]) == (
        "before\naisched: 12 bytes of output lost: cannot write the log: Bad file descriptor\n"
        "after\n"
    )


def test_output_lost_over_several_writes_is_said_whole_on_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    # The note itself failing (the disk still full) replaced the count by its own length, and
    # a note after a line cut short was glued onto it.
    lost = [b"rt\n", b"second line\n", b"third\n"]  # the notes before the 2nd and 3rd fail too
    assert _written_past_a_full_disk(tmp_path, b"cut sho", lost) == (
        "cut sho\naisched: 21 bytes of output lost: cannot write the log: Bad file descriptor\n"
        "after\n"
    )


def test_a_task_writing_far_past_the_cap_leaves_at_most_the_cap_on_disk(
    harness: Harness,
) -> None:
    ex = harness.new_executor(log_max_bytes=64 * KIB, log_max_files=2)
    assert ex is harness.ex
    # 4 MiB to stdout and stderr, then a last line: the task is never blocked by its log.
    script = (
        "import sys\n"
        "for i in range(2048):\n"
        "    (sys.stdout if i % 2 else sys.stderr).write('y' * 2047 + '\\n')\n"
        "print('the end', flush=True)\n"
    )
    h = harness.launch("t-0", [PY, "-c", script])
    ev = harness.exit_of(h.key)
    assert (ev.kind, ev.exit_code) == (ExitKind.EXITED, 0)
    logs = sorted(harness.log_path("t-0").parent.glob("t-0.log*"))
    assert [p.name for p in logs] == ["t-0.log", "t-0.log.1"]
    assert sum(p.stat().st_size for p in logs) <= 2 * 64 * KIB
    text = harness.log("t-0")
    assert text.startswith("aisched: log rotated (")
    assert text.endswith("the end\n")

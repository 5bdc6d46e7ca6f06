"""The tag of a state directory's tasks, in the names of their cgroups and containers, so that two
schedulers never touch each other's (`cgroups.cgroup_name`, `container.container_name`).

It is kept in the directory (`TAG_FILE`), made at its first use. It was the hash of the
directory's path, and a directory wiped and made again while its tasks ran on (a stopped
service leaves them running) gave its new jobs the ids, and so the cgroup names, of the old
ones: the new launch took the old task's cgroup for a leftover of its own and emptied it, and
the old supervisor, seeing its task killed, killed what its cgroup then held, the new task.
Now a new directory gets a new tag. A directory that already holds tasks but no tag file (made
before the file was) keeps its path's hash, so its running tasks are still found as its own."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from pathlib import Path

from aisched.model.numerals import is_decimal

TAG_FILE = ".instance"
_TAG = re.compile(r"[0-9a-f]{10}")


class InstanceTagError(RuntimeError):
    """The tag file cannot be read or made, or holds something else than a tag; says where."""


def instance_tag(state: Path) -> str:
    """The tag of the tasks of state directory `state` (which exists): read from its tag
    file, else made and written there first. Two executors starting on one directory at once
    get the same tag (the file is published whole, by one of them). Raises InstanceTagError."""
    path = state / TAG_FILE
    try:
        with contextlib.suppress(FileNotFoundError):
            return _read(path)
        return _publish(state, path)
    except OSError as exc:
        raise InstanceTagError(
            f"{path}: cannot read or make the instance tag of this state directory's tasks: "
            f"{exc.strerror or exc}"
        ) from None


def _publish(state: Path, path: Path) -> str:
    """Make the tag and publish it whole at `path`; another executor's, if it came first."""
    fresh = not any(is_decimal(e.name) and e.is_dir() for e in os.scandir(state))
    tag = secrets.token_hex(5) if fresh else hashlib.sha256(str(state).encode()).hexdigest()[:10]
    draft = state / f"{TAG_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    draft.write_text(tag + "\n")
    try:
        os.link(draft, path)  # fails if another executor published its tag first
    except FileExistsError:
        return _read(path)
    finally:
        draft.unlink()
    return tag


def _read(path: Path) -> str:
    text = path.read_text().strip()
    if not _TAG.fullmatch(text):
        raise InstanceTagError(
            f"{path}: expected the instance tag of this state directory's tasks (10 hex digits), "
            f"got {text[:40]!r}; remove the file only when none of its tasks runs"
        )
    return text

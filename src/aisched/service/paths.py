"""Where a job's files live on the service's machine.

A job of the service's own user keeps its checkpoints in the data directory, as always. A job of
another user (a root service running alice's job as alice) cannot reach the data directory,
which is private (0700), so its checkpoint directory is in the user's home:
`~USER/.aisched/checkpoints/INSTANCE-JOBID`. It is made by the task itself after it has become
the user (never by root, in a directory the user controls). INSTANCE is the service's own id, so
two services' job 7 never share checkpoints.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from aisched.model.numerals import is_decimal
from aisched.service.ended_bytes import FILE_KINDS
from aisched.service.identity import service_user


def checkpoint_dir(data_dir: Path, instance: str, user: str, job_id: str) -> str:
    if user != service_user():
        try:
            home = pwd.getpwnam(user).pw_dir
        except KeyError:
            home = ""
        if home:
            return str(Path(home) / ".aisched" / "checkpoints" / f"{instance}-{job_id}")
    return str(data_dir / "checkpoints" / job_id)


def made_by_service(data_dir: Path, path: str) -> bool:
    """Whether the service makes `path` itself (inside its data directory), or the task does."""
    return Path(path).is_relative_to(data_dir)


# The data directory's folders named after a job id: those retention removes with the job,
# and its checkpoints, which it keeps.
JOB_FOLDERS = (*FILE_KINDS, "checkpoints")
_MAX_ID_DIGITS = 18  # a job id is a 64-bit sequence number: a longer name is no job's


def highest_job_folder(data_dir: Path) -> int:
    """The highest job id naming a folder in the data directory's logs, tasks or checkpoints
    (0: none). A state database started afresh beside them (a damaged one moved aside) must
    give out ids above it: a new job 1 was taken for the old job 1's launch (and refused), read
    the old one's log as its own, and restarted from its checkpoints."""
    best = 0
    for kind in JOB_FOLDERS:
        try:
            names = os.listdir(data_dir / kind)
        except OSError:
            continue
        for name in names:
            if is_decimal(name) and len(name) <= _MAX_ID_DIGITS:
                best = max(best, int(name))
    return best

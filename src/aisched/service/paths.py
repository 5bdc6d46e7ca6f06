"""Where a job's files live on the service's machine.

A job of the service's own user keeps its checkpoints in the data directory, as always. A job of
another user (a root service running alice's job as alice) cannot reach the data directory,
which is private (0700), so its checkpoint directory is in the user's home:
`~USER/.aisched/checkpoints/INSTANCE-JOBID`. It is made by the task itself after it has become
the user (never by root, in a directory the user controls). INSTANCE is the service's own id, so
two services' job 7 never share checkpoints.

A checkpoint directory the service made (in the data directory, at the job's launch) is removed
when its job has ended for good, if it is empty (`remove_empty_checkpoint_dir`): else every job
run would leave one behind. One that holds anything is the job's, and kept.
"""

from __future__ import annotations

import errno
import logging
import os
import pwd
from pathlib import Path

from aisched.model.numerals import is_decimal
from aisched.service.ended_bytes import FILE_KINDS
from aisched.service.identity import service_user

log = logging.getLogger("aisched.loop")


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


def remove_empty_checkpoint_dir(data_dir: Path, path: str) -> None:
    """Remove the checkpoint directory `path` of a job that has ended for good, if the service
    made it (`made_by_service`) and it is empty; else leave it as it is. Each directory on the
    way down from `data_dir` is opened without following a link, and the last is removed with
    rmdir: it never removes a file, a link (nor what one points to) or a directory that holds
    anything. The job ids counted from the `checkpoints` folder after a fresh start
    (`highest_job_folder`) then miss it, but there is nothing of it for a new job to take."""
    if not made_by_service(data_dir, path):
        return
    *parents, name = Path(path).relative_to(data_dir).parts
    try:
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        for part in parents:
            step = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
        os.rmdir(name, dir_fd=fd)
    except OSError as e:
        # Not empty, already gone, or not a directory (a link: rmdir does not follow it).
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            log.warning("the empty checkpoint directory %s was not removed: %s", path, e)
    finally:
        os.close(fd)


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

"""Where a job's files live on the service's machine.

A job of the service's own user keeps its checkpoints in the data directory, as always. A job of
another user (a root service running alice's job as alice) cannot reach the data directory,
which is private (0700), so its checkpoint directory is in the user's home:
`~USER/.aisched/checkpoints/INSTANCE-JOBID`. It is made by the task itself after it has become
the user (never by root, in a directory the user controls). INSTANCE is the service's own id, so
two services' job 7 never share checkpoints.
"""

from __future__ import annotations

import pwd
from pathlib import Path

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

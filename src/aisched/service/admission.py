"""Checks at submission that only this machine can answer, and waiting for a submission to be
stored without hanging on a failing store.

1. `path_problems`: a task's `workdir` that is not a directory, and a command named by a path
   (`./train.sh`, `/opt/run`) that is not an executable file, are refused at once (422, one
   line per problem naming its field) instead of being accepted, failing at start and being
   retried. A job that names an image has its command checked inside its image, not here; its
   hostPath volumes are checked here, and so is its workdir where it is a directory here (the
   engine mounts it then, with root's rights, so its user must be able to read and enter it).
   A submitter who is an ordinary local account is answered as that account sees the files,
   symbolic links followed as the kernel would follow them for it: a path behind a directory
   it may not search is "no such" file or directory, as a missing one is, so that the service
   (often root) tells nobody whether a path exists that they could not find themselves.
2. `until_stored`: the loop answers a submission (or a cancel) once it is durable. While the
   store cannot write, that answer waits (the loop retries its batch); the caller is then told
   503 within `patience_s` instead of hanging, and a retry with the same Idempotency-Key
   returns the job once it is stored. When the loop ends meanwhile (this instance was
   deposed, or it is stopping) the answer can never come: `LoopEnded` says so at once.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from aisched.executors.container import not_plain, unreadable_workdir
from aisched.executors.runas import ordinary_account, user_can, user_lookup
from aisched.model.job import Job

T = TypeVar("T")


class NotStoredYet(Exception):
    """The store could not take a submission in time; the message is one line."""


class LoopEnded(Exception):
    """The loop ended before it answered: nothing of the request was stored (a flush that
    stored it answers it first), and no later step will. The app answers as its gate would on
    an instance that no longer leads, else 503 (`service.api`)."""


def _field(job: Job, index: int, name: str, volcano: bool) -> str:
    """Where a task's `name` (native words) was written: in a Volcano file, its pod's words."""
    if volcano:
        pod = f"spec.tasks.{index}.template.spec"
        if name.startswith("volumes."):  # a hostPath; its index among the pod's is not kept
            return f"{pod}.volumes"
        return f"{pod}.containers.0.{_VOLCANO_NAMES.get(name, name)}"
    # A one-task job written with the shorthand (command: at the top) has its fields there.
    if len(job.groups) == 1 and job.groups[0].name == "main":
        return name
    return f"tasks.{index}.{name}"


_VOLCANO_NAMES = {"workdir": "workingDir"}


def _may_mount_workdir(user: str, path: str) -> bool:
    """Whether a container task of `user` may have `path` as its working directory. The
    engine mounts it when it is a directory here, so the user must be able to read and enter
    it; one the user can see is not here is left to the image. A path hidden from the user is
    refused whether or not it is here, so that the answer does not tell which."""
    look = user_lookup(user, path)
    if look.hidden:
        return False
    if look.found is None or not stat.S_ISDIR(look.found.st_mode):
        return True
    return user_can(user, path, 0o5)


def path_problems(
    jobs: Sequence[Job], source: str, as_user: str | None = None, formats: Sequence[str] = ()
) -> list[str]:
    """One line per missing working directory or command file, naming the field as its file
    wrote it (`formats[k]`: job k's, "native" unless given); as `as_user` sees the files, when
    that is an ordinary local account (see the module doc)."""
    local = as_user if as_user is not None and ordinary_account(as_user) else None

    def seen(path: Path) -> os.stat_result | None:
        # What the submitter finds at the path: None alike when it is missing and when it is
        # hidden from the submitter.
        if local is not None:
            return user_lookup(local, str(path)).found
        try:
            return path.stat()
        except OSError:
            return None

    def executable(path: Path) -> bool:
        return user_can(local, str(path), 0o1) if local else os.access(path, os.X_OK)

    out: list[str] = []
    for k, job in enumerate(jobs):
        prefix = f"{source}: " if len(jobs) == 1 else f"{source}: job {job.name!r}: "
        volcano = k < len(formats) and formats[k] == "volcano"
        for k_group, g in enumerate(job.groups):
            i = k_group if g.file_index is None else g.file_index  # as its file wrote it
            if g.container is not None:
                # Its command is inside its image; what it names on this machine are its
                # hostPath volumes and its workdir (the image itself is the engine's to find or
                # pull, and a missing one fails the attempt at once, without a retry).
                for v, vol in enumerate(g.container.volumes):
                    if seen(Path(vol.host_path)) is None:
                        field = _field(job, i, f"volumes.{v}.host_path", volcano)
                        out.append(f"{prefix}{field}: no such file or directory: {vol.host_path}")
                if g.container.workdir_in_image:
                    continue  # a path inside the image, never mounted from here
                if g.workdir and (why := not_plain(g.workdir)) is not None:
                    # Mounted from the host: see container.not_plain.
                    out.append(f"{prefix}{_field(job, i, 'workdir', volcano)}: {why}")
                elif local is not None and g.workdir and not _may_mount_workdir(local, g.workdir):
                    why = unreadable_workdir(local, g.workdir)
                    out.append(f"{prefix}{_field(job, i, 'workdir', volcano)}: {why}")
                continue
            workdir = Path(g.workdir) if g.workdir else None
            if workdir is not None:
                found = seen(workdir)
                if found is None or not stat.S_ISDIR(found.st_mode):
                    why = "no such directory" if found is None else "not a directory"
                    out.append(f"{prefix}{_field(job, i, 'workdir', volcano)}: {why}: {workdir}")
                    continue
                if not executable(workdir):  # seen, but the task could not chdir there
                    why = "a directory its user may not enter (no search permission)"
                    out.append(f"{prefix}{_field(job, i, 'workdir', volcano)}: {why}: {workdir}")
                    continue
            if not g.command or "/" not in g.command[0]:
                continue  # found on PATH at start (by the task's own environment)
            exe = Path(g.command[0])
            if not exe.is_absolute() and workdir is None:
                continue  # relative to a working directory only the executor knows
            full = exe if exe.is_absolute() else (workdir or Path()) / exe
            where = f"{prefix}{_field(job, i, 'command', volcano)}.0"
            found = seen(full)
            if found is not None and stat.S_ISDIR(found.st_mode):
                out.append(f"{where}: a directory, not a program: {full}")
            elif found is None or not stat.S_ISREG(found.st_mode):
                out.append(f"{where}: no such file: {full}")
            elif not executable(full):
                out.append(f"{where}: not executable: {full}")
    return out


NOT_STORED_SUBMISSION = (
    "the submission is not stored yet: the store cannot write (see /v1/readyz); "
    "it is kept and stored once the store recovers, so retry with the same "
    "Idempotency-Key to get that job rather than a second one"
)
NOT_STORED_CANCEL = (
    "the cancel is not stored yet: the store cannot write (see /v1/readyz); it is kept and "
    "carried out once the store recovers (`aisched show` will say so)"
)


async def until_stored(
    future: Future[T],
    store_failing: Callable[[], bool],
    patience_s: float = 5.0,
    not_stored: str = NOT_STORED_SUBMISSION,
    loop_ended: Callable[[], bool] = lambda: False,
) -> T:
    """The loop's answer; raises NotStoredYet (with `not_stored`) when the store has been
    failing for `patience_s` while it waited (a healthy store answers in milliseconds), and
    LoopEnded once the loop has ended (`loop_ended`) with no answer given."""
    waited = 0.0
    step = 0.25
    wrapped = asyncio.wrap_future(future)
    while True:
        done, _ = await asyncio.wait({wrapped}, timeout=step)
        if done:
            return wrapped.result()
        if loop_ended():
            if future.done():  # answered as it ended: `wrapped` hears of it a little later
                return future.result()
            raise LoopEnded("the scheduler stopped before it stored this request")
        waited = waited + step if store_failing() else 0.0
        if waited >= patience_s:
            raise NotStoredYet(not_stored)

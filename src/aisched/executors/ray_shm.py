"""A Ray host task's private /dev/shm on its node, as on one machine.

The tmpfs per job attempt, its sizing, joining, entering and release are the supervisor's
(`supervisor_shm.join_shm`, `enter_shm`, `release_shm`, `sweep_shm`); what differs is who holds
it. On one machine a task's supervisor holds its task directory's lock; on a Ray node the
task's runner, in the node's agent, holds the lock of a directory of its own under a state
directory of root's on the node (`NODE_STATE/<instance>`: node-local, since a tmpfs must not
be mounted on the shared storage of the data directory) for as long as the task runs. An agent
that dies lets go of every lock it held, so the next task's runner on the node finds those
tmpfs mounts held by no one and removes them (`sweep_shm`, once per worker process). Only a
root agent running a user's task makes one; without the right to mount, the task keeps the
node's /dev/shm and its log says so, as on one machine.

Standard library and aisched's standard-library modules only: it runs in Ray worker processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from typing import Any

from aisched.executors import ray_limits, supervisor_shm, task_files

NODE_STATE = ray_limits.NODE_STATE  # shared with the cgroups of its tasks

# Why this node cannot give tasks a private /dev/shm (None: it can), per state directory,
# probed (and swept) once per worker process.
_UNAVAILABLE: dict[str, str | None] = {}


@dataclass(frozen=True, slots=True)
class TaskShm:
    """One task's hold on its attempt's tmpfs: `path` goes over its /dev/shm."""

    shm: dict[str, Any]  # as a local launch's `shm` (supervisor_shm.join_shm)
    task_dir: str
    lock_fd: int
    path: str


def join(spec: dict[str, Any], acct: dict[str, Any]) -> TaskShm | str:
    """The private /dev/shm of the task of `spec` run as `acct`, joined (made if it is the
    first of its attempt here), or the line its log gets when it keeps the node's."""
    instance, job, attempt, task = ray_limits.task_names(spec)
    state = os.path.join(NODE_STATE, instance)
    why = _unavailable(state)
    if why is not None:
        return f"{supervisor_shm.SHM_SHARED}: {why}"
    shm = supervisor_shm.shm_spec(
        state, job, attempt, int(spec.get("mem_limit_mib") or 0),
        int(spec.get("shm_max_mib") or 0), int(acct["uid"]), int(acct["gid"]),
    )  # fmt: skip
    task_dir = os.path.join(state, job, attempt, task)
    fd = -1
    try:
        os.makedirs(task_dir, mode=0o700, exist_ok=True)
        lock = os.path.join(task_dir, task_files.LOCK)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while the task runs
        return TaskShm(shm, task_dir, fd, supervisor_shm.join_shm(shm, task_dir))
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        return f"{supervisor_shm.SHM_SHARED}: {exc.strerror or exc}"


def release(held: TaskShm | None) -> None:
    """The task has ended: it no longer holds the tmpfs, which goes with its last holder."""
    if held is None:
        return
    with contextlib.suppress(OSError):  # the next sweep on the node tries again
        # The attempt's lock goes with the tmpfs: no retention clears a node's state directory.
        supervisor_shm.release_shm(held.shm, held.task_dir, drop_lock=True)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(held.task_dir, task_files.LOCK))
    os.close(held.lock_fd)
    # Its directory and the attempt's and job's, when empty (never a recursive removal).
    d = held.task_dir
    for _ in range(3):
        try:
            os.rmdir(d)
        except OSError:
            break
        d = os.path.dirname(d)


def sweep_after_agent_death(instance: str) -> None:
    """The probe, and so the sweep, of `instance`'s state directory, for a new agent of a
    node whose agent died, as soon as the scheduler learns of the death: the dead agent's
    tmpfs mounts keep what its tasks wrote there in the node's memory until swept, and the
    next task of a user may never come to this node."""
    _unavailable(os.path.join(NODE_STATE, instance))


def _unavailable(state: str) -> str | None:
    if state not in _UNAVAILABLE:
        _UNAVAILABLE[state] = _probe(state)
    return _UNAVAILABLE[state]


def _probe(state: str) -> str | None:
    """Why tasks here cannot have a private /dev/shm, or None, after making the node's state
    directory (root's alone) and sweeping what dead agents left in it."""
    if os.geteuid() != 0:
        return "this Ray worker is not root"
    if (why := ray_limits.made_in_node_state(state)) is not None:
        return why
    supervisor_shm.sweep_shm(state)
    return supervisor_shm.shm_unavailable()


def entered(held: TaskShm | None) -> None:
    """In the task's child, as root: its /dev/shm the attempt's tmpfs (`enter_shm`). A failure
    leaves it the node's, said on its output (its log), never a failed task."""
    if held is None:
        return
    try:
        supervisor_shm.enter_shm(held.path, str(held.shm["root"]))
    except OSError as exc:
        os.write(1, f"aisched: {supervisor_shm.SHM_SHARED}: {exc.strerror or exc}\n".encode())

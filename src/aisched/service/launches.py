"""Launches: an attempt's tasks become launch requests (the environment contract, the
torchrun variables, a service replica's address) and are started, after the batch that wrote
their rows has committed; a task that cannot start ends its attempt like a lost task.

Invariant: every task of a bound attempt ends up started or exited, never left `launching`
(holding its resources until a restart). An attempt whose requests cannot even be put
together (a binding naming a task group the job lacks, no free port for the gang, or a bug)
is not started at all: its first task "could not start", which fails the attempt, and its
restart policy says whether it is retried (after a backoff, a bounded number of times) or
fails, as for a launch the executor refused. A task the executor fails to start with an
unexpected error, not a `LaunchError`, is lost likewise. Unexpected errors are logged with
their traceback: they are bugs, of the scheduler or of the executor.

The job's `started` event is written here, in the batch that stores the tasks as running, once
the executor has taken every task of the attempt; the bind only wrote `placed`. An attempt
whose launch was never made (its leader died or paused first) or that could not start has no
`started` event."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from aisched.executors.base import (
    ExitKind,
    GangLauncher,
    LaunchError,
    LaunchRefused,
    TaskExited,
    TaskHandle,
    TaskLaunch,
    TaskPlace,
    contract_env,
    master_addr_for,
)
from aisched.executors.runas import USER_PATH, ordinary_account
from aisched.model.expansion import expand
from aisched.service import failpoints
from aisched.service.identity import service_user
from aisched.service.live import Batch, LiveJob, Requests, TaskPhase
from aisched.service.paths import made_by_service
from aisched.service.replicas import HOST_ENV
from aisched.service.scheduler_state import SchedulerState
from aisched.spec.job_common import exec_size_problems

log = logging.getLogger("aisched.loop")


class Launches(SchedulerState):
    def node_address(self, node: str) -> str:
        """Where `node` is reached from here: its own address on a cluster of machines, else
        the loop's `master_addr` (loopback)."""
        return master_addr_for(self.executor, node, self.config.master_addr)

    def _launch_requests(self, lj: LiveJob) -> Requests:
        """The launch requests of the attempt's tasks, in rank order; or, when they cannot
        be put together, why (for `_launch_all` to end the attempt with)."""
        try:
            return self._requests(lj)
        except LaunchError as e:
            log.error("job %s: its launch could not be prepared: %s", lj.id, e)
            return e
        except Exception as e:  # a bug must not leave the attempt launching for ever
            log.exception("job %s: its launch could not be prepared", lj.id)
            return LaunchError(f"its launch could not be prepared: {e!r}")

    def _requests(self, lj: LiveJob) -> list[TaskLaunch]:
        groups = {g.name: g for g in lj.job.groups}
        places = [
            TaskPlace(t.name, t.binding.node, t.binding.gpus, t.binding.milli_cpu, t.binding.index)
            for t in lj.tasks
        ]
        port = free_port(self.config.master_addr)
        master_addr = self.node_address(places[0].node)
        out = []
        for t in lj.tasks:
            group = groups.get(t.binding.group)
            if group is None:
                raise LaunchError(
                    f"its placement binds task {t.name} to task group {t.binding.group!r}, "
                    "which it lacks"
                )
            # A container keeps its image's own environment (PATH, LANG...): the service's is
            # for host tasks (an image's tools were not found on the service's PATH).
            env = {} if group.container is not None else dict(self.config.base_env)
            if (
                group.container is None
                and lj.job.user != service_user()
                and ordinary_account(lj.job.user)
            ):
                # That user's usual PATH, not the service's own (root's): said here, since the
                # worker that starts it on a Ray node has a PATH of its own to compare with.
                env["PATH"] = USER_PATH
            env.update(group.env)
            if lj.job.replica_of is not None:  # where to listen: its node's address
                env[HOST_ENV] = self.node_address(t.binding.node)
            env.update(
                contract_env(
                    job_id=lj.id,
                    places=places,
                    rank=t.rank,
                    restart_count=lj.attempt - 1,
                    checkpoint_dir=lj.checkpoint_dir,
                    master_addr=master_addr,
                    master_port=port,
                )
            )
            command = group.command
            if group.kubernetes_pod:  # `$(NAME)` against the task's whole environment
                command = tuple(expand(word, env) for word in command)
                _refuse_oversized(t.name, command, env)
            out.append(
                TaskLaunch(
                    job_id=lj.id,
                    attempt=lj.attempt,
                    task=t.name,
                    node=t.binding.node,
                    command=command,
                    env=env,
                    workdir=group.workdir,
                    milli_cpu=t.binding.milli_cpu,
                    mem_limit_mib=t.binding.mem_mib,
                    gpus=t.binding.gpus,
                    log_path=t.log_path,
                    grace_period_s=lj.job.grace_period_s,
                    gpu_mem_mib=t.binding.gpu_mem_mib,
                    gpu_milli=t.binding.gpu_milli,
                    user=lj.job.user,
                    uid=lj.job.uid,
                    container=group.container,
                )
            )
        return out

    def _launch_all(self, launches: list[tuple[LiveJob, Requests]], now: float) -> None:
        batch = self.batch
        if launches:
            failpoints.hit(failpoints.PAUSE_BEFORE_LAUNCH)
        for lj, reqs in launches:
            if isinstance(reqs, LaunchError):
                self._not_started(lj, reqs, batch, now)
                continue
            try:
                if made_by_service(self.config.data_dir, lj.checkpoint_dir):
                    Path(lj.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                self._not_started(lj, LaunchError(f"its checkpoint directory: {e}"), batch, now)
                continue
            # A gang launcher starts them together (all or none); else one by one, below.
            started: list[TaskHandle | LaunchError | None] = [None] * len(reqs)
            if isinstance(self.executor, GangLauncher):
                try:
                    for req in reqs:
                        Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
                except OSError:
                    pass  # reported below, task by task, where none was started together
                else:
                    try:
                        started = list(self.executor.launch_gang(reqs))
                    except Exception as e:  # the executor's bug: none started, none held
                        log.exception("job %s: starting its gang failed", lj.id)
                        started = [LaunchError(repr(e))] * len(reqs)
            made = 0
            for req, task, got in zip(reqs, lj.tasks, started, strict=True):
                if lj.stopping is not None:  # an earlier task failed to launch: roll back
                    self._on_exit(
                        TaskExited(req.key, ExitKind.STOPPED, None, "not started", now),
                        batch,
                        now,
                    )
                    continue
                why: str | None = None
                kind = ExitKind.LOST
                try:
                    Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
                    if isinstance(got, LaunchError):
                        raise got
                    handle = got if got is not None else self.executor.launch(req)
                except (LaunchError, OSError) as e:
                    why, kind = str(e), _not_started_kind(e)
                except Exception as e:  # the executor's bug: the task is not left launching
                    log.exception("job %s: starting task %s failed", lj.id, req.task)
                    why = repr(e)
                if why is not None:
                    self._on_exit(
                        TaskExited(req.key, kind, None, f"could not start: {why}", now),
                        batch,
                        now,
                    )
                    continue
                task.handle = handle
                task.phase = TaskPhase.RUNNING
                if len(reqs) > 1:
                    failpoints.hit(failpoints.PAUSE_MID_LAUNCH)
                at = self.clock()
                batch.task(
                    req.key, state=TaskPhase.RUNNING.value, handle=handle.data, started_at=at
                )
                made += 1
                if made == len(reqs):
                    batch.event(at, lj.id, "started", started_message(lj.attempt))
        batch.flush(self.store)

    def _not_started(self, lj: LiveJob, why: LaunchError, batch: Batch, now: float) -> None:
        """None of the attempt's tasks is started: the first could not start (which fails
        the attempt and stops the rest), the others are rolled back as not started."""
        for t in lj.tasks:
            key = lj.key(t)
            if lj.stopping is None:
                ev = TaskExited(key, _not_started_kind(why), None, f"could not start: {why}", now)
            else:
                ev = TaskExited(key, ExitKind.STOPPED, None, "not started", now)
            self._on_exit(ev, batch, now)

    def _launch_restarts(self, now: float) -> None:
        if self.restarts:
            restarts, self.restarts = self.restarts, []
            self._launch_all(restarts, now)


def _refuse_oversized(task: str, command: tuple[str, ...], env: dict[str, str]) -> None:
    """Refuse, for good, a command that `$(NAME)` made larger than the kernel starts: the
    file was checked with its own variables only, and exec would fail with E2BIG (`Argument
    list too long`, said of the program) at every start."""
    for i, message in exec_size_problems(command, env.items()):
        where = "" if i is None else f"word {i} of its command (command then args, from 0) "
        raise LaunchRefused(f"task {task}: {where}{message}")


def _not_started_kind(e: Exception) -> ExitKind:
    """How a task that could not start ended: unrunnable (not retried) when its launch is
    refused for good, else lost (it may start another time: a node back, an engine probed)."""
    return ExitKind.UNRUNNABLE if isinstance(e, LaunchRefused) else ExitKind.LOST


def started_message(attempt: int) -> str:
    """The message of the `started` event of an attempt all of whose tasks were made."""
    return f"attempt {attempt}: every task launched"


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

"""Launches: an attempt's tasks become launch requests (the environment contract, the
torchrun variables, a service replica's address) and are started, after the batch that wrote
their rows has committed; a task that cannot start ends its attempt like a lost task."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from aisched.executors.base import (
    ExitKind,
    GangLauncher,
    LaunchError,
    TaskExited,
    TaskHandle,
    TaskLaunch,
    TaskPlace,
    contract_env,
    master_addr_for,
)
from aisched.service import failpoints
from aisched.service.live import LiveJob, TaskPhase
from aisched.service.paths import made_by_service
from aisched.service.replicas import HOST_ENV
from aisched.service.scheduler_state import SchedulerState

log = logging.getLogger("aisched.loop")


class Launches(SchedulerState):
    def node_address(self, node: str) -> str:
        """Where `node` is reached from here: its own address on a cluster of machines, else
        the loop's `master_addr` (loopback)."""
        return master_addr_for(self.executor, node, self.config.master_addr)

    def _launch_requests(self, lj: LiveJob) -> list[TaskLaunch]:
        places = [
            TaskPlace(t.name, t.binding.node, t.binding.gpus, t.binding.milli_cpu, t.binding.index)
            for t in lj.tasks
        ]
        port = free_port(self.config.master_addr)
        master_addr = self.node_address(places[0].node)
        out = []
        for t in lj.tasks:
            group = next(g for g in lj.job.groups if g.name == t.binding.group)
            env = dict(self.config.base_env)
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
            out.append(
                TaskLaunch(
                    job_id=lj.id,
                    attempt=lj.attempt,
                    task=t.name,
                    node=t.binding.node,
                    command=group.command,
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
                    container=group.container,
                )
            )
        return out

    def _launch_all(self, launches: list[tuple[LiveJob, list[TaskLaunch]]], now: float) -> None:
        batch = self.batch
        if launches:
            failpoints.hit(failpoints.PAUSE_BEFORE_LAUNCH)
        for lj, reqs in launches:
            if made_by_service(self.config.data_dir, lj.checkpoint_dir):
                Path(lj.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            # A gang launcher starts them together (all or none); else one by one, below.
            started: list[TaskHandle | LaunchError | None] = [None] * len(reqs)
            if isinstance(self.executor, GangLauncher):
                try:
                    for req in reqs:
                        Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
                except OSError:
                    pass  # reported below, task by task, where none was started together
                else:
                    started = list(self.executor.launch_gang(reqs))
            for req, task, got in zip(reqs, lj.tasks, started, strict=True):
                if lj.stopping is not None:  # an earlier task failed to launch: roll back
                    self._on_exit(
                        TaskExited(req.key, ExitKind.STOPPED, None, "not started", now),
                        batch,
                        now,
                    )
                    continue
                try:
                    Path(req.log_path).parent.mkdir(parents=True, exist_ok=True)
                    if isinstance(got, LaunchError):
                        raise got
                    handle = got if got is not None else self.executor.launch(req)
                except (LaunchError, OSError) as e:
                    self._on_exit(
                        TaskExited(req.key, ExitKind.LOST, None, f"could not start: {e}", now),
                        batch,
                        now,
                    )
                    continue
                task.handle = handle
                task.phase = TaskPhase.RUNNING
                batch.task(
                    req.key,
                    state=TaskPhase.RUNNING.value,
                    handle=handle.data,
                    started_at=self.clock(),
                )
        batch.flush(self.store)

    def _launch_restarts(self, now: float) -> None:
        if self.restarts:
            restarts, self.restarts = self.restarts, []
            self._launch_all(restarts, now)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

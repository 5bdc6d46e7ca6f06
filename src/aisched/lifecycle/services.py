"""A service's replicas: how one is made from its service, the same in both drivers.

A service job never runs a task itself; its work is its replicas, ordinary jobs (kind `infer`,
restart policy `always`) that are placed, preempted and restarted like any other. A service
starts (RUNNING, holding nothing) at its submission, or once its dependencies are met, with
`min_replicas` replicas; the live service's autoscaler changes the count later (the simulator
keeps the minimum). A replica learns its port through `AISCHED_SERVICE_PORT`, chosen when it is
made (the live service picks a free one; the simulator has none to pick, and uses 0).
"""

from __future__ import annotations

from dataclasses import replace

from aisched.model.job import Job, JobKind, RestartPolicy

PORT_ENV = "AISCHED_SERVICE_PORT"
SERVICE_ENV = "AISCHED_SERVICE_ID"


def replica_job(service: Job, name: str, port: int) -> Job:
    """A replica of `service` (id and submit time are the driver's to set)."""
    extra = ((PORT_ENV, str(port)), (SERVICE_ENV, service.id))
    return replace(
        service,
        id="",
        name=name,
        kind=JobKind.INFER,
        service=None,
        replica_of=service.id,
        restart_policy=RestartPolicy.ALWAYS,
        depends_on=(),
        groups=tuple(replace(g, env=(*g.env, *extra)) for g in service.groups),
    )


def replica_name(service: Job, job_id: str) -> str:
    """The name a replica with id `job_id` gets."""
    return f"{service.name}-r{job_id}"

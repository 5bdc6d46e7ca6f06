"""Replica jobs of a `service` job: how one is made, and which live jobs serve a service.

A replica is an ordinary job (kind `infer`, one task) that the loop places, runs, preempts and
restarts like any other; only its birth and death are the autoscaler's. It inherits the
service's request, queue, priority and command, restarts `always`, and is told where to listen
through `AISCHED_SERVICE_PORT` (chosen when the replica is made and kept in its spec, so the
autoscaler and a restarted scheduler find it again) and `AISCHED_SERVICE_HOST` (its node's
address, set at each launch: loopback on one machine, the node's IP on a Ray cluster).
"""

from __future__ import annotations

from dataclasses import replace

from aisched.model.job import Job, JobKind, RestartPolicy

PORT_ENV = "AISCHED_SERVICE_PORT"
HOST_ENV = "AISCHED_SERVICE_HOST"
SERVICE_ENV = "AISCHED_SERVICE_ID"


def replica_job(service: Job, name: str, port: int) -> Job:
    """A replica of `service` (id and submit time are the loop's to set)."""
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


def replica_port(job: Job) -> int | None:
    for g in job.groups:
        for k, v in g.env:
            if k == PORT_ENV:
                return int(v)
    return None

"""Replica jobs of a `service` job: how one is made, and which live jobs serve a service.

A replica is an ordinary job (kind `infer`, one task) that the loop places, runs, preempts and
restarts like any other; only its birth and death are the autoscaler's. It inherits the
service's request, queue, priority and command, restarts `always`, and is told where to listen
through `AISCHED_SERVICE_PORT` (chosen when the replica is made and kept in its spec, so the
autoscaler and a restarted scheduler find it again) and `AISCHED_SERVICE_HOST` (its node's
address, set at each launch: loopback on one machine, the node's IP on a Ray cluster).
"""

from __future__ import annotations

from aisched.lifecycle.services import PORT_ENV, SERVICE_ENV, replica_job
from aisched.model.job import Job

__all__ = ["HOST_ENV", "PORT_ENV", "SERVICE_ENV", "replica_job", "replica_port"]

HOST_ENV = "AISCHED_SERVICE_HOST"


def replica_port(job: Job) -> int | None:
    for g in job.groups:
        for k, v in g.env:
            if k == PORT_ENV:
                return int(v)
    return None

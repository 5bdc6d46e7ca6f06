"""A service's replicas: how one is made from its service, the same in both drivers.

A service job never runs a task itself; its work is its replicas, ordinary jobs (kind `infer`,
restart policy `always`) that are placed, preempted and restarted like any other. A service
starts (RUNNING, holding nothing) at its submission, or once its dependencies are met, with
`min_replicas` replicas. A replica learns its port through `AISCHED_SERVICE_PORT`, chosen when
it is made (the live service picks a free one; the simulator has none to pick, and uses 0).

Scaling: a count asked for is held within the service's `[min_replicas, max_replicas]`
(`replicas_within`); new replicas are made for a larger count, and for a smaller one the
surplus goes pending replicas first (they hold nothing), then the newest running ones
(`surplus`). Who asks is the live service's autoscaler (`service.autoscaler`, its rule the pure
`core.autoscale.decide`), from load it measures on the running replicas (readiness probes,
scraped or pushed rps and latency). The simulator does not model it, and says so: no trace it
reads carries a service's load over time, and a load model made up for it would decide the
result; so in the simulator a service keeps its minimum of replicas.

A replica has no runtime to predict: it serves until its service scales down or is cancelled
(`Job.serves_until_scaled_down`). Neither driver asks its predictor about one, so it runs with
no expected end, as a job of unknown length does; and no reservation waits for one to end
(`core.reservation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from aisched.model.job import Job, JobKind, RestartPolicy
from aisched.model.service import ServiceSpec

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


def replicas_within(spec: ServiceSpec, asked: int) -> int:
    """The replica count kept when `asked` is asked for: held within the service's bounds."""
    return min(max(asked, spec.min_replicas), spec.max_replicas)


def surplus(live: Sequence[tuple[str, bool]], keep: int) -> list[str]:
    """Which of the `live` replicas (id, running), numeric ids, go when only `keep` stay:
    pending ones first, then the newest running ones."""
    order = sorted(live, key=lambda r: (r[1], -int(r[0])))
    return [job_id for job_id, _ in order[: max(len(live) - keep, 0)]]

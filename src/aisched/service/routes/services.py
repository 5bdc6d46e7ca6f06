"""Services: a service's replicas and autoscaler status, and the load it reports.

`POST /v1/jobs/{id}/metrics` takes a service's total load or one replica's own; the autoscaler
(`service/autoscaler.py`) follows the service's metric. `service_status` is what a service's
`GET /v1/jobs/{id}` shows beside the job.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from aisched.service.app import Service
from aisched.service.auth import CallerDep, require_owner
from aisched.service.autoscaler import MetricError
from aisched.service.limits import check_depth
from aisched.service.routes.common import MAX_BODY, job_or_404, problem
from aisched.service.schemas import MetricsOut, Problem, ServiceStatusOut


def services_router(svc: Service) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/v1/jobs/{job_id}/metrics",
        status_code=202,
        response_model=MetricsOut,
        responses={404: {"model": Problem}, 409: {"model": Problem}, 422: {"model": Problem}},
    )
    async def push_metrics(job_id: str, request: Request, who: CallerDep) -> Response:
        """Report load for a service (its total) or one replica (its own): a JSON object such
        as {"rps": 12.5} or {"latency_ms": 80}; the autoscaler follows the service's metric."""
        row = await run_in_threadpool(job_or_404, svc, job_id)
        require_owner(who, job_id, row, "report its load")
        body = await request.body()
        if len(body) > MAX_BODY:
            return problem(413, f"the metrics document is larger than {MAX_BODY} bytes")
        if (deep := check_depth(body)) is not None:
            return problem(422, "invalid metrics", [f"body: {deep}"])
        try:
            values = json.loads(body)
        except ValueError as e:  # not JSON, not UTF-8, or an integer past Python's digit limit
            return problem(422, "invalid metrics", [f"body: not valid JSON: {e}"])
        if svc.autoscaler is None:
            return problem(409, "the autoscaler is not running")
        try:
            service_id = svc.autoscaler.push(job_id, values)
        except MetricError as e:
            return problem(422, "invalid metrics", [f"body: {e}"])
        except KeyError:
            return problem(
                409, f"job {job_id} is not a running service or a replica of one ({row['state']})"
            )
        return JSONResponse(status_code=202, content=MetricsOut(service=service_id).model_dump())

    return router


def service_status(svc: Service, job_id: str) -> ServiceStatusOut | None:
    """A live service's replicas and its autoscaler's view; None once it is no longer live."""
    sched = svc.scheduler
    live = sched.jobs.get(job_id)
    if live is None or live.job.service is None:
        return None
    spec = live.job.service
    st = svc.autoscaler.status(job_id) if svc.autoscaler is not None else None
    return ServiceStatusOut(
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        metric=spec.metric.value,
        target=spec.target,
        replica_ids=[r.id for r in sched.replicas_of(job_id)],
        replicas=None if st is None else st.replicas,
        ready=None if st is None else st.ready,
        desired=None if st is None else st.desired,
        load=None if st is None else st.load,
        reason=None if st is None else st.reason,
        endpoints=[] if st is None else list(st.endpoints),
    )

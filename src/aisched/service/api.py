"""The REST API under `/v1` (FastAPI; its OpenAPI document at `/openapi.json`) and `/metrics`.

`create_app` only wires: the body limit, the error handlers and one router per resource
(`service/routes/`, the dashboard's in `service/dashboard.py`). A new resource is a module of
its own and one `include_router` line here.

Handlers never change live state themselves: submissions and cancellations go to the loop
(`Scheduler.submit` / `cancel`) and are answered once the loop has committed them; everything
else is read from the store or from the loop's published figures. Every error is a `Problem`
document with a status code: 422 for input that is wrong (with one line per problem, each
naming its field), 404 for an unknown job, 409 for a command that no longer applies, 413 for an
oversized body, 429 for a caller past their rate limit (with Retry-After), 507/503 for a
submission the service cannot take now (disk pressure, a failing store: `/v1/readyz` says
why; `service.health`). The service never answers a bad request with
a 500 or dies of one.

Every route but `/v1/healthz` and `/v1/readyz` needs an identity (`service/auth.py`): 401
without one, 403 for a caller without the right. Jobs are listed for everyone without their
commands; a job's command, environment, events and logs are its owner's and the admins'.
Cancels and actions on another user's job go to the audit log.
"""

from __future__ import annotations

import logging

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from aisched import __version__
from aisched.service import leader_gate
from aisched.service.admission import LoopEnded
from aisched.service.app import Service
from aisched.service.cut_short import AnswerWhenCutShort
from aisched.service.dashboard import dashboard_router
from aisched.service.limits import BodyLimit
from aisched.service.ratelimit import RequestLimits
from aisched.service.response_headers import NoSniff
from aisched.service.routes.bulk import bulk_router
from aisched.service.routes.cluster import cluster_router
from aisched.service.routes.common import MAX_BODY, no_nul, problem, text_only
from aisched.service.routes.jobs import jobs_router
from aisched.service.routes.logs import logs_router
from aisched.service.routes.services import services_router
from aisched.service.routes.system import system_router
from aisched.service.routes.tokens import tokens_router
from aisched.spec.errors import problem_lines
from aisched.store.errors import StoreError

log = logging.getLogger("aisched.api")


def create_app(svc: Service) -> FastAPI:
    app = FastAPI(
        title="aisched",
        version=__version__,
        description="An AI compute-resource scheduler: queue, place and run AI workloads.",
        docs_url=None,  # the interactive page loads its scripts from a CDN; offline, it breaks
        redoc_url=None,
        openapi_url=None,  # served by the system router, behind the same identity as the rest
        dependencies=[Depends(no_nul), Depends(text_only)],
    )
    app.state.service = svc
    # Per-caller request budgets, charged where the caller is identified (`service/auth.py`).
    app.state.rate_limits = RequestLimits(svc.config.limits.rate_budgets())
    leader_gate.install(app, svc)  # standbys answer reads and refuse writes
    # An oversized body is refused before any of it is buffered.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY)
    app.add_middleware(AnswerWhenCutShort)  # the stop's cancel reaches it last
    app.add_middleware(NoSniff)  # outermost: every answer, the other middlewares' too

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        # In the words job, cluster and config files get, each line led by its field's path
        # (`body.state: expected 'pending' or 'running', got 'x' (a string)`).
        return problem(422, "invalid request", problem_lines(exc.errors()))

    @app.exception_handler(HTTPException)
    async def _http(_req: Request, exc: HTTPException) -> JSONResponse:
        out = problem(exc.status_code, str(exc.detail))
        out.headers.update(exc.headers or {})
        return out

    @app.exception_handler(LoopEnded)
    async def _loop_ended(_req: Request, _exc: LoopEnded) -> JSONResponse:
        # Nothing of the request was stored. Deposed: the leader takes it (the CLI sends it
        # there); stopping: a retry reaches this service started again, or another instance.
        if not svc.leadership.leading:
            return leader_gate.not_leader_answer(svc)
        return problem(
            503,
            "the scheduler stopped before it stored this request (the service is stopping); "
            "nothing of it was kept: send it again",
            kept_nothing=True,
        )

    @app.exception_handler(SQLAlchemyError)
    @app.exception_handler(StoreError)
    async def _store(_req: Request, exc: Exception) -> JSONResponse:
        # A read the store could not answer (locked, unreachable, a connection that timed
        # out): the store's state, not a bug of the request, and worth a retry.
        first = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        log.warning("a request met a failing store: %s", first)
        return problem(
            503,
            f"the state database cannot answer now ({first[:300]}); GET /v1/readyz says when "
            "it is back: try again then",
        )

    @app.exception_handler(Exception)
    async def _failed(_req: Request, exc: Exception) -> JSONResponse:
        # A bug, or a stored row no version of aisched wrote (edited by hand, damaged): said
        # as a Problem, so that a client does not take the service for another server (a
        # bare 500 page); Starlette still logs the traceback.
        first = (str(exc).splitlines() or [""])[0][:300]
        return problem(
            500,
            f"the service failed on this request ({exc.__class__.__name__}: {first}); the "
            "service's log has the details",
        )

    app.include_router(dashboard_router(svc))  # the page at /, its JSON at /v1/dashboard
    app.include_router(system_router(svc))  # healthz, readyz, info, openapi.json, /metrics
    app.include_router(bulk_router(svc))  # POST /v1/jobs/cancel: many jobs at once
    app.include_router(jobs_router(svc))
    app.include_router(services_router(svc))
    app.include_router(logs_router(svc))
    app.include_router(cluster_router(svc))  # nodes, queues
    app.include_router(tokens_router(svc))  # tokens, the audit log
    return app

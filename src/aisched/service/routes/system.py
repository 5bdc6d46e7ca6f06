"""The service itself: liveness, readiness, what it runs, its OpenAPI document and `/metrics`.

`/v1/healthz` and `/v1/readyz` need no identity (a supervisor probes them); the rest do.

The probes never wait for one of the worker threads that slow requests (a store read, a large
job file) may all hold: a probe queued behind them timed out, and a supervisor restarted a
service that was only busy. Liveness reads memory alone, on the event loop; readiness reads the
disks (`service.health`), so it runs in a worker thread, but one of its own few. `/metrics`
holds readiness too (`aisched_ready`, the disks' free space), and a scrape that timed out
behind slow requests left a gap in the very graphs that should show them: its caller's
identity and its figures are read in threads of its own few as well.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from aisched import __version__
from aisched.service.app import Service
from aisched.service.auth import CallerDep, caller
from aisched.service.leader_gate import not_leader
from aisched.service.metrics import CONTENT_TYPE
from aisched.service.schemas import Info

READINESS_THREADS = 4
METRICS_THREADS = 2


def system_router(svc: Service) -> APIRouter:
    router = APIRouter()
    sched = svc.scheduler

    @router.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request, who: CallerDep) -> Response:
        return JSONResponse(request.app.openapi())

    @router.get("/v1/healthz")
    async def healthz() -> dict[str, object]:
        """Alive: the loop runs (leader), or the election goes on (standby)."""
        lead = svc.leadership
        thread = sched.thread
        # Standing by, or elected and still recovering: alive while the election runs.
        ok = thread.is_alive() if lead.leading and thread is not None else lead.alive()
        return {"ok": ok, **lead.describe()}

    # Readiness's own worker threads, apart from the default ones. A few: should the disks
    # hang, the probes beyond them wait, and time out as for a service that is not ready.
    readiness_threads = anyio.CapacityLimiter(READINESS_THREADS)

    @router.get("/v1/readyz")
    async def readyz() -> Response:
        """Whether new work is taken here now: 200 on a leader that is ready, else 503 with
        the problems (service.health), a standby's naming the leader."""
        return await anyio.to_thread.run_sync(readiness, limiter=readiness_threads)

    def readiness() -> Response:
        r = svc.health.check()
        doc = {**r.to_dict(), **svc.leadership.describe()}
        if svc.leadership.leading:
            return JSONResponse(doc, status_code=200 if r.ready else 503)
        doc["ready"] = False
        # A standby's loop does not run; whether it could take over is the lease's to say.
        lease = svc.leadership.problem()
        doc["problems"] = [not_leader(svc), *([lease] if lease else [])]
        return JSONResponse(doc, status_code=503)

    @router.get("/v1/info", response_model=Info)
    def info(who: CallerDep) -> Info:
        return Info(
            version=__version__,
            policy=svc.policy.name,
            data_dir=str(svc.home),
            # Where the state lives is the admins' business: a user sees only the kind.
            database=svc.store.url if who.admin else svc.store.url.partition(":")[0],
            started_at=svc.started_at,
            executor=svc.executor.info().name,
            you=who.user,
            admin=who.admin,
            via=who.via,
        )

    # Apart from readiness's too: scrapes, however many, never hold up a supervisor's probe.
    metrics_threads = anyio.CapacityLimiter(METRICS_THREADS)

    @router.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        return await anyio.to_thread.run_sync(scrape, request, limiter=metrics_threads)

    def scrape(request: Request) -> Response:
        caller(request)  # who asks (a token is looked up in the store), as CallerDep would
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE)

    return router

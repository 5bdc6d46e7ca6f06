"""`POST /v1/jobs/cancel`: cancel every live job a selection names, in one command.

The body names what to take: `mine` (the caller's own jobs), `queue`, `state` ("pending" or
"running"); at least one, so that no request cancels everything by leaving them out. The
owner rules are those of one cancel (`service/auth.py`): a user's selection is always their own
jobs; an admin's is every user's unless `mine` says theirs. One audit line per call, whatever
the count; the answer gives the count and each job with its state after the command
(cancelled, or running while its tasks stop).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from aisched.service.admission import NOT_STORED_CANCEL, NotStoredYet, until_stored
from aisched.service.app import Service
from aisched.service.auth import CallerDep
from aisched.service.loop_types import CancelSelection
from aisched.service.routes.common import audit
from aisched.service.schemas import CancelOut, NoNul, Problem


class BulkCancelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mine: bool = False
    queue: NoNul | None = None
    state: Literal["pending", "running"] | None = None


class BulkCancelOut(BaseModel):
    count: int  # jobs taken
    cancelled: int  # of them, ended now
    stopping: int  # of them, running until their tasks have stopped
    jobs: list[CancelOut]


def bulk_router(svc: Service) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/v1/jobs/cancel",
        response_model=BulkCancelOut,
        responses={422: {"model": Problem}},
    )
    async def cancel_many(body: BulkCancelIn, who: CallerDep) -> JSONResponse:
        """Cancel every live job of the selection (see the module's description)."""
        if not (body.mine or body.queue or body.state):
            return JSONResponse(
                status_code=422,
                content=Problem(
                    error="name the jobs to cancel",
                    problems=["body: give at least one of mine, queue, state"],
                ).model_dump(),
            )
        user = who.user if body.mine or not who.admin else None
        selection = CancelSelection(user=user, uid=who.uid, queue=body.queue, state=body.state)
        failing = lambda: svc.health.errors.store_failing  # noqa: E731
        try:
            done = await until_stored(
                svc.scheduler.cancel_matching(selection),
                failing,
                not_stored=NOT_STORED_CANCEL,
                loop_ended=svc.scheduler.ended,
            )
        except NotStoredYet as e:
            return JSONResponse(status_code=503, content=Problem(error=str(e)).model_dump())
        cancelled = sum(1 for _, state in done if state == "cancelled")
        out = BulkCancelOut(
            count=len(done),
            cancelled=cancelled,
            stopping=len(done) - cancelled,
            jobs=[CancelOut(id=i, state=state) for i, state in done],
        )
        detail = f"{out.count} jobs: {out.cancelled} cancelled, {out.stopping} stopping"
        what = ", ".join(
            f"{k}={v}"
            for k, v in (("user", user or "*"), ("queue", body.queue), ("state", body.state))
            if v is not None
        )
        await run_in_threadpool(
            audit, svc, who, "cancel-many", f"jobs with {what}", user, detail
        )  # the store, off the event loop
        return JSONResponse(content=out.model_dump())

    return router

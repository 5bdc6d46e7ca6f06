"""What the API's routes share: the `Problem` answer, the body limit, the audit log, job lookup.

Every error a route answers is a `Problem` document (`problem`); a route that must stop early
deep in a helper raises `HTTPException`, which `create_app` turns into the same document.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from aisched.model.states import JobState
from aisched.service.app import Service
from aisched.service.identity import Caller
from aisched.service.retention import no_job
from aisched.service.schemas import Problem
from aisched.spec.errors import MAX_JOB_FILE, not_unicode_problem

MAX_BODY = MAX_JOB_FILE
# A JSON escape of a UTF-16 surrogate: in a pair (an emoji) it is text; alone it is not.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
LIVE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)


# On a 5xx answer to a change that the service kept nothing of (it refused it at once, or its
# loop ended first): the CLI then does not offer the Idempotency-Key to fetch it later.
KEPT_NOTHING = {"aisched-kept": "nothing"}


def problem(
    status: int, error: str, problems: list[str] | None = None, kept_nothing: bool = False
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content=Problem(error=error, problems=problems or []).model_dump(),
        headers=KEPT_NOTHING if kept_nothing else None,
    )


async def no_nul(request: Request) -> None:
    """Refuse a NUL character in a path segment or query parameter (every route's dependency).
    PostgreSQL stores and compares no text with one: such a lookup (`/v1/jobs/1%00`,
    `?queue=a%00`) failed in the store and was answered 503, the state database "cannot answer
    now", for a request that was wrong. Async, though it never waits: FastAPI runs a sync
    dependency in a worker thread, and every request, the probes' too, would queue for one."""
    for where, params in (("path", request.path_params), ("query", request.query_params)):
        for name, value in params.items():
            if "\x00" in str(value):
                raise RequestValidationError(
                    [{"loc": (where, name), "msg": "contains a NUL character", "type": "nul"}]
                )


async def text_only(request: Request) -> None:
    """Refuse a JSON body holding a string that is not Unicode text: a lone surrogate, which
    JSON's escapes can write (`"\\udcff"`) and UTF-8 cannot encode (every route's dependency).
    Taken as any other string, it failed every answer that showed it with a 500: a token's
    note, a job's command (stored first, then never listable), a queue to cancel. Only a body
    with such an escape is parsed here; the route parses its own as before."""
    if "json" not in request.headers.get("content-type", ""):
        return
    body = await request.body()
    if not _SURROGATE_ESCAPE.search(body):
        return
    try:
        doc = json.loads(body)
    except ValueError:
        return  # not JSON: the route says so
    if (where := not_unicode_problem(doc)) is not None:
        path, _, why = where.partition(": ")
        raise RequestValidationError([{"loc": ("body", path), "msg": why, "type": "not_text"}])


def audit(
    svc: Service, who: Caller, action: str, target: str, owner: str | None, detail: str = ""
) -> None:
    """One line of the audit log: who did what to whose thing, and how they came in."""
    with svc.store.tx() as tx:
        tx.add_audit(
            {
                "time": time.time(),
                "actor": who.user,
                "via": who.via,
                "action": action,
                "target": target,
                "owner": owner,
                "detail": detail,
            }
        )


def job_or_404(svc: Service, job_id: str) -> dict[str, Any]:
    with svc.store.read() as tx:
        row = tx.get_job(job_id)
        newest = tx.max_seq() if row is None else 0
    if row is None:
        raise HTTPException(404, no_job(job_id, newest))
    return row

"""A job's logs (`/v1/jobs/{id}/logs`): read whole, or followed as they grow across restarts.

The logs are the owner's and the admins'; an admin reading another user's goes to the audit
log. Files are read where the task rows say they are; a log the supervisor rotated (it caps
them) is noticed by its shrinking size and read again from its start.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from aisched.service.app import Service
from aisched.service.auth import CallerDep, require_owner
from aisched.service.routes.common import LIVE_STATES, audit, problem
from aisched.service.schemas import Problem


def logs_router(svc: Service) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/v1/jobs/{job_id}/logs",
        response_class=PlainTextResponse,
        responses={404: {"model": Problem}},
    )
    async def logs(
        job_id: str,
        who: CallerDep,
        task: str | None = None,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        follow: bool = False,
    ) -> Response:
        with svc.store.read() as tx:
            row = tx.get_job(job_id)
        if row is None:
            return problem(404, f"no job {job_id}")
        require_owner(who, job_id, row["user"], "read its logs")
        if row["user"] != who.user:
            audit(svc, who, "logs", f"job {job_id}", row["user"])
        if attempt is not None and attempt > row["attempt"]:
            return problem(404, f"job {job_id} has had {row['attempt']} attempt(s), not {attempt}")
        if not follow:
            text = "".join(_read_logs(svc, job_id, attempt or row["attempt"], task))
            return PlainTextResponse(text)
        return StreamingResponse(
            _follow_logs(svc, job_id, task, attempt), media_type="text/plain; charset=utf-8"
        )

    return router


def _log_paths(svc: Service, job_id: str, attempt: int, task: str | None) -> list[tuple[str, Path]]:
    if attempt < 1:
        return []
    with svc.store.read() as tx:
        rows = tx.tasks_of(job_id, attempt)
    return [(r["name"], Path(r["log_path"])) for r in rows if task is None or r["name"] == task]


def _read_logs(svc: Service, job_id: str, attempt: int, task: str | None) -> list[str]:
    paths = _log_paths(svc, job_id, attempt, task)
    out: list[str] = []
    for name, path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if len(paths) > 1:
            out.extend(f"[{name}] {line}\n" for line in text.splitlines())
        else:
            out.append(text)
    return out


async def _follow_logs(
    svc: Service, job_id: str, task: str | None, attempt: int | None
) -> AsyncIterator[bytes]:
    """Stream the logs of the current attempt as they grow; on a restart, go on with the next
    attempt's; end when the job has ended and everything is sent."""
    shown = 0  # the attempt whose logs are being streamed
    offsets: dict[str, int] = {}
    partial: dict[str, bytes] = {}
    while True:
        with svc.store.read() as tx:
            row = tx.get_job(job_id)
        if row is None:
            return
        current = attempt or row["attempt"]
        if current > shown:
            if shown:
                for chunk in _drain(svc, job_id, shown, task, offsets, partial, final=True):
                    yield chunk
                yield f"--- attempt {current} ---\n".encode()
            shown, offsets, partial = current, {}, {}
        for chunk in _drain(svc, job_id, shown, task, offsets, partial, final=False):
            yield chunk
        ended = row["state"] not in LIVE_STATES or (
            attempt is not None and row["attempt"] > attempt
        )
        if ended:
            for chunk in _drain(svc, job_id, shown, task, offsets, partial, final=True):
                yield chunk
            return
        await asyncio.sleep(0.2)


def _drain(
    svc: Service,
    job_id: str,
    attempt: int,
    task: str | None,
    offsets: dict[str, int],
    partial: dict[str, bytes],
    *,
    final: bool,
) -> list[bytes]:
    paths = _log_paths(svc, job_id, attempt, task)
    out: list[bytes] = []
    for name, path in paths:
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < offsets.get(name, 0):
                    offsets[name] = 0  # rotated (the supervisor caps logs): a new file
                fh.seek(offsets.get(name, 0))
                data = fh.read()
        except OSError:
            continue
        offsets[name] = offsets.get(name, 0) + len(data)
        buf = partial.get(name, b"") + data
        lines = buf.split(b"\n")
        rest = lines.pop()
        if final and rest:
            lines.append(rest)
            rest = b""
        partial[name] = rest
        prefix = f"[{name}] ".encode() if len(paths) > 1 else b""
        out.extend(prefix + line + b"\n" for line in lines)
    return out

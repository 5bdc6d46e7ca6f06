"""A job's logs (`/v1/jobs/{id}/logs`): read whole, or followed as they grow across restarts.

The logs are the owner's and the admins'; an admin reading another user's goes to the audit
log. Files are read where the task rows say they are; a log the supervisor rotated (it caps
them) is noticed by its shrinking size and read again from its start. The store and the files
are read in worker threads, never on the event loop, where a slow disk or a locked database
would hold up every other request.

Logs are streamed, a chunk at a time, never read whole: a job may have thousands of tasks, each
with a log of `limits.log_max_size`, and one request (or a few at once) for all of them must
not make the service hold their sum several times over. A line longer than `MAX_LINE` is sent
in pieces of that size, each a line of its own where lines are prefixed with their task.

A followed log outlives the check of its caller at the request's start, by as long as the job
runs: the caller's token is checked again every `RECHECK_S` while it streams (`auth.still_valid`),
and one revoked or expired since ends the stream with the line `FOLLOW_STOPPED`.
"""

from __future__ import annotations

import asyncio
import codecs
import io
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from aisched.service.app import Service
from aisched.service.auth import CallerDep, own_job, require_owner, still_valid
from aisched.service.defaults import FOLLOW_STOPPED
from aisched.service.routes.common import LIVE_STATES, audit, job_or_404, problem
from aisched.service.schemas import Problem

CHUNK = 1 << 16  # read from a log file at a time
MAX_LINE = 1 << 20  # the longest line kept whole; a longer one is sent in pieces
RECHECK_S = 1.0  # how often a followed log asks again whether its caller's token is live


def logs_router(svc: Service) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/v1/jobs/{job_id}/logs",
        response_class=PlainTextResponse,
        responses={404: {"model": Problem}},
    )
    def logs(  # not async: the store and the files are read in a worker thread
        job_id: str,
        who: CallerDep,
        request: Request,
        task: str | None = None,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        follow: bool = False,
    ) -> Response:
        row = job_or_404(svc, job_id)
        require_owner(who, job_id, row, "read its logs")
        if not own_job(who, row):  # an admin reading another's
            audit(svc, who, "logs", f"job {job_id}", row["user"])
        if attempt is not None and attempt > row["attempt"]:
            return problem(404, f"job {job_id} has had {row['attempt']} attempt(s), not {attempt}")
        if attempt is not None and (gone := _forgotten(svc, job_id, attempt)) is not None:
            return problem(404, gone)
        if not follow:
            paths = _log_paths(svc, job_id, attempt or row["attempt"], None)
            named = [(name, path) for name, path in paths if task is None or name == task]
            if paths and not named:  # a misspelt task read as an empty log, without a word
                tasks = ", ".join(name for name, _ in paths[:20])
                return problem(404, f"job {job_id} has no task {task!r} (its tasks: {tasks})")
            return StreamingResponse(_read_logs(named), media_type="text/plain; charset=utf-8")
        return StreamingResponse(
            _follow_logs(svc, job_id, task, attempt, lambda: still_valid(request)),
            media_type="text/plain; charset=utf-8",
        )

    return router


def _forgotten(svc: Service, job_id: str, attempt: int) -> str | None:
    """Why the logs of `attempt` (one the job has had) cannot be read, when its records were
    forgotten (`limits.keep_attempts`); None when they are kept. Without this an attempt that
    is gone read as an empty log."""
    with svc.store.read() as tx:
        kept = tx.kept_attempts(job_id)
    if kept is not None and kept[0] <= attempt:
        return None
    which = "none is" if kept is None else _attempts(*kept)
    return (
        f"job {job_id}'s attempt {attempt} is no longer kept, nor its logs (a live job keeps "
        f"its latest attempts only, limits.keep_attempts): {which}"
    )


def _attempts(first: int, last: int) -> str:
    if first == last:
        return f"attempt {first} is"
    return f"attempts {first} to {last} are"


def _log_paths(svc: Service, job_id: str, attempt: int, task: str | None) -> list[tuple[str, Path]]:
    if attempt < 1:
        return []
    with svc.store.read() as tx:
        rows = tx.tasks_of(job_id, attempt)
    return [(r["name"], Path(r["log_path"])) for r in rows if task is None or r["name"] == task]


def _read_logs(paths: list[tuple[str, Path]]) -> Iterator[bytes]:
    """The logs at `paths` as UTF-8 text (undecodable bytes replaced, line ends made "\\n", as
    a file read as text), each line prefixed with its task's name where there are several."""
    for name, path in paths:
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below, as the stream goes on
        except OSError:
            continue
        with fh:
            decoder = io.IncrementalNewlineDecoder(
                codecs.getincrementaldecoder("utf-8")("replace"), translate=True
            )
            if len(paths) == 1:
                while chunk := fh.read(CHUNK):
                    yield decoder.decode(chunk).encode()
                yield decoder.decode(b"", final=True).encode()  # an unfinished character
                continue
            carry = ""
            while chunk := fh.read(CHUNK):
                lines, carry = _whole_lines(carry + decoder.decode(chunk))
                yield "".join(f"[{name}] {line}\n" for line in lines).encode()
            last = (carry + decoder.decode(b"", final=True)).splitlines()
            yield "".join(f"[{name}] {line}\n" for line in last).encode()


def _whole_lines(text: str) -> tuple[list[str], str]:
    """The whole lines of `text` (as `str.splitlines` ends them, without their ends) and what
    follows the last (a line still being read). A rest over `MAX_LINE` is cut into lines of
    that length."""
    parts = text.splitlines(keepends=True)
    rest = parts.pop() if parts and not _ended(parts[-1]) else ""
    lines = [p.splitlines()[0] for p in parts]
    while len(rest) > MAX_LINE:
        lines.append(rest[:MAX_LINE])
        rest = rest[MAX_LINE:]
    return lines, rest


def _ended(part: str) -> bool:
    return part.splitlines()[0] != part


async def _follow_logs(
    svc: Service,
    job_id: str,
    task: str | None,
    attempt: int | None,
    caller_valid: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """Stream the logs of the current attempt as they grow; on a restart, go on with the next
    attempt's; end when the job has ended and everything is sent, or (with `FOLLOW_STOPPED`)
    once `caller_valid` says no, asked every `RECHECK_S`."""
    shown = 0  # the attempt whose logs are being streamed
    offsets: dict[str, int] = {}
    partial: dict[str, bytes] = {}
    checked = time.monotonic()
    while True:
        if time.monotonic() - checked >= RECHECK_S:
            if not await run_in_threadpool(caller_valid):
                yield FOLLOW_STOPPED.encode()
                return
            checked = time.monotonic()
        row = await run_in_threadpool(_job, svc, job_id)
        if row is None:
            return
        current = attempt or row["attempt"]
        if current > shown:
            if shown:
                async for chunk in iterate_in_threadpool(
                    _drain(svc, job_id, shown, task, offsets, partial, final=True)
                ):
                    yield chunk
                yield f"--- attempt {current} ---\n".encode()
            shown, offsets, partial = current, {}, {}
        async for chunk in iterate_in_threadpool(
            _drain(svc, job_id, shown, task, offsets, partial, final=False)
        ):
            yield chunk
        ended = row["state"] not in LIVE_STATES or (
            attempt is not None and row["attempt"] > attempt
        )
        if ended:
            async for chunk in iterate_in_threadpool(
                _drain(svc, job_id, shown, task, offsets, partial, final=True)
            ):
                yield chunk
            return
        await asyncio.sleep(0.2)


def _job(svc: Service, job_id: str) -> dict[str, Any] | None:
    with svc.store.read() as tx:
        return tx.get_job(job_id)


def _drain(
    svc: Service,
    job_id: str,
    attempt: int,
    task: str | None,
    offsets: dict[str, int],
    partial: dict[str, bytes],
    *,
    final: bool,
) -> Iterator[bytes]:
    """What the logs of `attempt` have gained since `offsets`, in whole lines (and, if `final`,
    the last part line too), a chunk at a time."""
    paths = _log_paths(svc, job_id, attempt, task)
    for name, path in paths:
        prefix = f"[{name}] ".encode() if len(paths) > 1 else b""
        try:
            fh = open(path, "rb")  # noqa: SIM115 - closed below, as the stream goes on
        except OSError:
            continue
        with fh:
            try:
                if os.fstat(fh.fileno()).st_size < offsets.get(name, 0):
                    offsets[name] = 0  # rotated (the supervisor caps logs): a new file
                fh.seek(offsets.get(name, 0))
            except OSError:
                continue
            while data := fh.read(CHUNK):
                offsets[name] = offsets.get(name, 0) + len(data)
                lines = (partial.get(name, b"") + data).split(b"\n")
                rest = lines.pop()
                while len(rest) > MAX_LINE:
                    lines.append(rest[:MAX_LINE])
                    rest = rest[MAX_LINE:]
                partial[name] = rest
                yield b"".join(prefix + line + b"\n" for line in lines)
        if final and partial.get(name):
            yield prefix + partial[name] + b"\n"
            partial[name] = b""

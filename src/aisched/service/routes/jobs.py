"""Jobs: submit, list, show and cancel (`/v1/jobs`).

Submissions and cancellations go to the loop (`Scheduler.submit` / `cancel`) and are answered
once the loop has committed them; lists and details are read from the store, a long list a
page (`LIST_PAGE` jobs) at a time, written as it is read: a user's own jobs show their commands
(up to 1 MiB each), and 10,000 of them read at once held several GB. A list cut at its `limit`
says so (`more`, and `next_before`: the ID to ask the next page `before`). Every job is
listed for every caller without its commands; a job's command, environment and events are its
owner's and the admins'. A cancel of another user's job goes to the audit log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from aisched.model.job import Job
from aisched.model.numerals import is_decimal
from aisched.model.states import JobState
from aisched.service.admission import (
    NOT_STORED_CANCEL,
    NotStoredYet,
    path_problems,
    until_stored,
)
from aisched.service.app import Service
from aisched.service.auth import (
    CallerDep,
    may_ask_priority,
    may_run_jobs,
    may_submit_to,
    owns,
    require_owner,
)
from aisched.service.defaults import MAX_LIST_LIMIT
from aisched.service.identity import Caller
from aisched.service.leader_gate import not_leader_answer
from aisched.service.limits import check_depth
from aisched.service.loop import Rejected
from aisched.service.loop_types import NotAccepting
from aisched.service.off_loop import OnePerCaller
from aisched.service.retention import no_job
from aisched.service.routes.common import (
    LIVE_STATES,
    MAX_BODY,
    audit,
    job_or_404,
    problem,
)
from aisched.service.routes.services import service_status
from aisched.service.schemas import (
    CancelOut,
    EventOut,
    JobDetail,
    JobList,
    JobOut,
    Problem,
    SubmitOut,
    job_out,
)
from aisched.spec.errors import SpecError
from aisched.spec.pipeline import (
    ParsedSubmission,
    parse_submission_document,
    parse_submission_text,
)
from aisched.store.db import job_row

# Jobs a listing reads from the store, and holds, at a time: a user's own jobs show their
# commands, up to 1 MiB each, and a listing may ask for 100,000 jobs.
LIST_PAGE = 100

_SUBMIT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A job file: the native format (JSON or YAML) or a Volcano "
        "batch.volcano.sh/v1alpha1 Job (see docs/jobs.md).",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


def jobs_router(svc: Service) -> APIRouter:
    router = APIRouter()
    sched = svc.scheduler
    reading = OnePerCaller()  # submissions read off the event loop

    @router.post(
        "/v1/jobs",
        status_code=201,
        response_model=SubmitOut,
        responses={422: {"model": Problem}, 413: {"model": Problem}},
        openapi_extra=_SUBMIT_BODY,
    )
    async def submit(
        request: Request,
        who: CallerDep,
        idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
        source: Annotated[str | None, Query(max_length=256)] = None,
        workdir: Annotated[
            str | None, Query(max_length=4096, description="for tasks that name none")
        ] = None,
    ) -> Response:
        # Disk pressure, a failing store: say so at once. Not to what may be a retry (the same
        # Idempotency-Key) of a submission taken before: that one may be kept, waiting to be
        # stored, and is answered as such by the loop (when it runs: not on a standby), lest its
        # sender take it for refused while it runs later.
        if not svc.leadership.leading:  # deposed since the gate let it in
            return not_leader_answer(svc)
        refused = svc.health.refusal()
        if refused is not None and (idempotency_key is None or not svc.health.alive()):
            return problem(refused[0], refused[1], kept_nothing=True)
        not_accepting = None if refused is None else NotAccepting(refused[1], refused[0])
        if (why := may_run_jobs(who)) is not None:
            return problem(403, "job refused", [why])
        body = await request.body()
        if len(body) > MAX_BODY:
            return problem(413, f"the job document is larger than {MAX_BODY} bytes")
        src = source or "request"
        ctype = request.headers.get("content-type", "")
        read = await reading.run(
            who.user, lambda: _read_submission(svc, who, body, ctype, src, workdir)
        )
        if isinstance(read, Response):
            return read
        parsed, jobs = read
        warnings = [w for p in parsed.jobs for w in p.warnings]
        failing = lambda: svc.health.errors.store_failing  # noqa: E731
        try:
            if parsed.is_pipeline:
                items = tuple(
                    (job, p.format, p.warnings) for job, p in zip(jobs, parsed.jobs, strict=True)
                )
                fut_all = sched.submit_all(items, idempotency_key, not_accepting)
                stored = await until_stored(fut_all, failing, loop_ended=svc.scheduler.ended)
            else:
                one = parsed.jobs[0]
                fut = sched.submit(
                    jobs[0], one.format, one.warnings, idempotency_key, not_accepting
                )
                stored = [await until_stored(fut, failing, loop_ended=svc.scheduler.ended)]
        except NotAccepting as e:
            return problem(e.status, str(e), kept_nothing=True)
        except Rejected as e:
            if e.status == 503:  # the store, not the job: one line, as for NotStoredYet
                return problem(503, f"the submission was {e}")
            return problem(e.status, "job refused", [f"{src}: {e}"])
        except NotStoredYet as e:
            return problem(503, str(e))
        rows = [job_row(r) for r in stored]  # as stored, without reading them back
        outs = [job_out(r) for r in rows]
        out = SubmitOut(
            id=rows[0]["id"],
            warnings=warnings,
            job=outs[0],
            jobs=outs if parsed.is_pipeline else [],
        )
        return JSONResponse(status_code=201, content=out.model_dump())

    @router.get("/v1/jobs", response_model=JobList)
    def list_jobs(
        who: CallerDep,
        state: Annotated[str | None, Query(description="comma-separated states")] = None,
        queue: str | None = None,
        user: str | None = None,
        all: Annotated[bool, Query(description="every state, not just live jobs")] = False,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 1000,
        before: Annotated[
            str | None,
            Query(
                max_length=20,
                description="only jobs submitted before this job ID: the "
                "next page is `before` the answer's `next_before`",
            ),
        ] = None,
    ) -> Response:
        states: list[str] | None
        if state:
            states = [s.strip() for s in state.split(",") if s.strip()]
            bad = [s for s in states if s not in {js.value for js in JobState}]
            if bad:
                known = ", ".join(js.value for js in JobState)
                return problem(
                    422, "invalid request", [f"state: unknown {bad[0]!r}; one of {known}"]
                )
        else:
            states = None if all else list(LIVE_STATES)
        # A job's id is its seq: the next page starts under it even once that job is forgotten.
        if before is not None and not is_decimal(before):
            return problem(422, "invalid request", [f"before: {before!r} is not a job ID"])
        before_seq = int(before) if before is not None else None
        # Each page is read one row longer than it is shown: that row says whether more match.
        page = min(limit, LIST_PAGE)
        # The first page is read here, so that a failing store is a 503, not a cut answer.
        with svc.store.read() as tx:
            first = tx.list_jobs(
                states=states, queue=queue, user=user, limit=page + 1, before_seq=before_seq
            )
        if len(first) <= page or limit <= LIST_PAGE:
            shown = first[:limit]
            outs = [_visible(job_out(r), owns(who, r)) for r in shown]
            cut = len(first) > limit
            listed = JobList(jobs=outs, more=cut, next_before=shown[-1]["id"] if cut else None)
            return JSONResponse(listed.model_dump())
        next_before: list[str] = []  # the last job shown, once the list is cut at `limit`

        def pages() -> Iterator[list[dict[str, Any]]]:
            rows, left = first, limit
            while True:
                shown = rows[: min(left, LIST_PAGE)]
                yield shown
                left -= len(shown)
                if len(rows) == len(shown):  # no row beyond this page
                    return
                if left <= 0:
                    next_before.append(shown[-1]["id"])
                    return
                with svc.store.read() as tx:
                    rows = tx.list_jobs(
                        states=states,
                        queue=queue,
                        user=user,
                        limit=min(left, LIST_PAGE) + 1,
                        before_seq=shown[-1]["seq"],
                    )

        return StreamingResponse(
            _job_list(pages(), lambda row: owns(who, row), next_before),
            media_type="application/json",
        )

    @router.get("/v1/jobs/{job_id}", response_model=JobDetail, responses={404: {"model": Problem}})
    def show(job_id: str, who: CallerDep) -> Response:
        with svc.store.read() as tx:
            row = tx.get_job(job_id)
            if row is None:
                return problem(404, no_job(job_id, tx.max_seq()))
            tasks = tx.tasks_of(job_id, row["attempt"]) if row["attempt"] else []
            events = tx.events_of(job_id)
        mine = owns(who, row)
        base = _visible(job_out(row, tasks), mine)
        detail = JobDetail(
            **base.model_dump(),
            service=service_status(svc, job_id) if row["kind"] == "service" else None,
            events=[
                EventOut(seq=e["seq"], time=e["time"], kind=e["kind"], message=e["message"])
                for e in events
            ]
            if mine
            else [],
            env=_job_env(row) if mine else None,
        )
        return JSONResponse(detail.model_dump())

    @router.post(
        "/v1/jobs/{job_id}/cancel",
        status_code=202,
        response_model=CancelOut,
        responses={404: {"model": Problem}, 409: {"model": Problem}},
    )
    async def cancel(job_id: str, who: CallerDep) -> Response:
        row = await run_in_threadpool(job_or_404, svc, job_id)
        require_owner(who, job_id, row, "cancel it")
        failing = lambda: svc.health.errors.store_failing  # noqa: E731
        try:
            state = await until_stored(
                sched.cancel(job_id),
                failing,
                not_stored=NOT_STORED_CANCEL,
                loop_ended=svc.scheduler.ended,
            )
        except Rejected as e:
            return problem(e.status, str(e))
        except NotStoredYet as e:
            return problem(503, str(e))
        await run_in_threadpool(
            audit, svc, who, "cancel", f"job {job_id}", row["user"], f"was {row['state']}"
        )
        return JSONResponse(status_code=202, content=CancelOut(id=job_id, state=state).model_dump())

    return router


def _read_submission(
    svc: Service, who: Caller, body: bytes, ctype: str, src: str, workdir: str | None
) -> Response | tuple[ParsedSubmission, list[Job]]:
    """The submission in `body` and its jobs, placed in `workdir`; or the problem answer that
    refuses it. Blocking (parsing, the submitter's files): run off the event loop."""
    if (deep := check_depth(body)) is not None:
        return problem(422, "invalid job", [f"{src}: {deep}"])
    defaults = svc.config.job_defaults(who.user)
    try:
        if "json" in ctype:
            try:
                data = json.loads(body)
            except ValueError as e:  # not JSON, not UTF-8, or an integer past the limit
                raise SpecError(f"{src}: not valid JSON: {e}") from None
            parsed = parse_submission_document(data, src, defaults)
        else:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise SpecError(f"{src}: not UTF-8 text") from None
            parsed = parse_submission_text(text, src, defaults)
    except SpecError as e:
        return problem(422, "invalid job", list(e.problems))
    except RecursionError:
        return problem(422, "invalid job", [f"{src}: nested too deep"])
    # Every problem of the submission at once, in the order of the checks; one that the
    # caller may not do (403) outranks an invalid field (422) in the answer's status.
    lines: list[str] = []
    refused = False
    for p in parsed.jobs:
        if p.job.user != who.user:
            refused = True
            lines.append(
                f"{src}: user: jobs run as the user who submits them; this one names "
                f"{p.job.user!r} and you are {who.user!r}"
            )
        volcano = p.format == "volcano"
        if not svc.scheduler.queues.has(p.job.queue):  # the loop refuses it too, without a path
            lines.append(f"{src}: {p.queue_path}: unknown queue {p.job.queue!r}")
            continue  # who may submit there, and at what priority, is moot
        if (why := may_submit_to(svc, who, p.job.queue)) is not None:
            refused = True
            lines.append(f"{src}: {p.queue_path}: {why}")
        if (why := may_ask_priority(svc, who, p.job.queue, p.job.priority)) is not None:
            where = "spec.priorityClassName" if volcano else "priority"
            refused = True
            lines.append(f"{src}: {where}: {why}")
    # Its submitter's uid goes with it: it runs as that account or not at all (runas.account).
    jobs = [replace(_in_workdir(p.job, workdir), uid=who.uid) for p in parsed.jobs]
    lines += path_problems(jobs, src, who.user, [p.format for p in parsed.jobs])
    if lines:
        return problem(403, "job refused", lines) if refused else problem(422, "invalid job", lines)
    return parsed, jobs


def _job_list(
    pages: Iterator[list[dict[str, Any]]],
    mine: Callable[[dict[str, Any]], bool],
    next_before: list[str],
) -> Iterator[bytes]:
    """`{"jobs": [...], "more": ..., "next_before": ...}` of the rows of `pages`, written a page
    at a time, as JSONResponse writes a JobList; `next_before` holds the last job shown once
    `pages` is spent, if the list was cut."""
    yield b'{"jobs":['
    sep = ""
    for rows in pages:
        if not rows:  # the jobs left ended between two pages' reads (a live list)
            continue
        outs = (_visible(job_out(r), mine(r)).model_dump() for r in rows)
        text = ",".join(
            json.dumps(o, ensure_ascii=False, allow_nan=False, separators=(",", ":")) for o in outs
        )
        yield (sep + text).encode()
        sep = ","
    more = {"more": bool(next_before), "next_before": next_before[0] if next_before else None}
    yield b"]," + json.dumps(more, separators=(",", ":")).encode()[1:]


def _visible(out: JobOut, mine: bool) -> JobOut:
    """A job as its owner and admins see it, or as everyone else does: without its commands,
    its tasks' log paths, its checkpoint directory, and the messages of its end and its tasks'
    and its submission's warnings, which name its programs, files and directories ("exec
    failed: /home/ana/project/run.sh: ...") (like `squeue` for another's job)."""
    if mine:
        return out
    return out.model_copy(
        update={
            "groups": [g.model_copy(update={"command": []}) for g in out.groups],
            "tasks": [t.model_copy(update={"log_path": "", "message": None}) for t in out.tasks],
            "checkpoint_dir": "",
            "message": None,
            "warnings": [],
        }
    )


def _job_env(row: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each task group's own variables, as submitted (the contract's are added at launch)."""
    return {
        g["name"]: {str(k): str(v) for k, v in g.get("env") or ()} for g in row["spec"]["groups"]
    }


def _in_workdir(job: Job, workdir: str | None) -> Job:
    """Relative (or missing) working directories are the submitter's, like Slurm's; but for
    a container whose workdir is inside its image (a pod's), which keeps its own."""
    if workdir is None:
        return job
    return replace(
        job,
        groups=tuple(
            replace(g, workdir=str(Path(workdir) / (g.workdir or "")).rstrip("/") or "/")
            if (g.workdir is None or not Path(g.workdir).is_absolute())
            and not (g.container is not None and g.container.workdir_in_image)
            else g
            for g in job.groups
        ),
    )

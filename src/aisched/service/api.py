"""The REST API under `/v1` (FastAPI; its OpenAPI document at `/openapi.json`) and `/metrics`.

Handlers never change live state themselves: submissions and cancellations go to the loop
(`Scheduler.submit` / `cancel`) and are answered once the loop has committed them; everything
else is read from the store or from the loop's published figures. Every error is a `Problem`
document with a status code: 422 for input that is wrong (with one line per problem, each
naming its field), 404 for an unknown job, 409 for a command that no longer applies, 413 for an
oversized body, 507/503 for a submission the service cannot take now (disk pressure, a failing
store: `/v1/readyz` says why; `service.health`). The service never answers a bad request with
a 500 or dies of one.

Every route but `/v1/healthz` and `/v1/readyz` needs an identity (`service/auth.py`): 401
without one, 403 for a caller without the right. Jobs are listed for everyone without their
commands; a job's command, environment, events and logs are its owner's and the admins'.
Cancels and actions on another user's job go to the audit log.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from aisched import __version__
from aisched.model.job import Job
from aisched.model.states import JobState
from aisched.service import tokens
from aisched.service.admission import NotStoredYet, path_problems, until_stored
from aisched.service.app import Service
from aisched.service.auth import (
    CallerDep,
    may_run_jobs,
    may_submit_to,
    owns,
    require_admin,
    require_owner,
)
from aisched.service.autoscaler import MetricError
from aisched.service.dashboard import dashboard_router
from aisched.service.identity import Caller
from aisched.service.limits import BodyLimit, check_depth
from aisched.service.loop import Rejected
from aisched.service.metrics import CONTENT_TYPE
from aisched.service.routes_bulk import bulk_router
from aisched.service.schemas import (
    AuditOut,
    CancelOut,
    EventOut,
    GPUOut,
    Info,
    JobDetail,
    JobList,
    JobOut,
    MetricsOut,
    NodeList,
    NodeOut,
    Problem,
    QueueList,
    QueueOut,
    ServiceStatusOut,
    SubmitOut,
    TokenCreated,
    TokenIn,
    TokenOut,
    job_out,
)
from aisched.spec.errors import SpecError
from aisched.spec.pipeline import parse_submission_document, parse_submission_text
from aisched.store.db import job_row

MAX_BODY = 1 << 20  # a job file larger than 1 MiB is a mistake, not a job
LIVE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)

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


def problem(status: int, error: str, problems: list[str] | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content=Problem(error=error, problems=problems or []).model_dump()
    )


def create_app(svc: Service) -> FastAPI:
    app = FastAPI(
        title="aisched",
        version=__version__,
        description="An AI compute-resource scheduler: queue, place and run AI workloads.",
        docs_url=None,  # the interactive page loads its scripts from a CDN; offline, it breaks
        redoc_url=None,
        openapi_url=None,  # served below, behind the same identity as everything else
    )
    sched = svc.scheduler
    app.state.service = svc
    # Outermost: an oversized body is refused before any of it is buffered.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY)

    def audit(who: Caller, action: str, target: str, owner: str | None, detail: str = "") -> None:
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

    def job_or_404(job_id: str) -> dict[str, Any]:
        with svc.store.read() as tx:
            row = tx.get_job(job_id)
        if row is None:
            raise HTTPException(404, f"no job {job_id}")
        return row

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        lines = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"])
            lines.append(f"{where}: {e['msg']}")
        return problem(422, "invalid request", lines)

    @app.exception_handler(HTTPException)
    async def _http(_req: Request, exc: HTTPException) -> JSONResponse:
        out = problem(exc.status_code, str(exc.detail))
        out.headers.update(exc.headers or {})
        return out

    app.include_router(dashboard_router(svc))  # the page at /, its JSON at /v1/dashboard

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(who: CallerDep) -> Response:
        return JSONResponse(app.openapi())

    @app.get("/v1/healthz")
    def healthz() -> dict[str, bool]:
        alive = sched.thread is not None and sched.thread.is_alive()
        return {"ok": alive}

    @app.get("/v1/readyz")
    def readyz() -> Response:
        """Whether new work is taken now: 200, or 503 with the problems (service.health)."""
        r = svc.health.check()
        return JSONResponse(r.to_dict(), status_code=200 if r.ready else 503)

    @app.get("/v1/info", response_model=Info)
    def info(who: CallerDep) -> Info:
        return Info(
            version=__version__,
            policy=svc.policy.name,
            data_dir=str(svc.home),
            database=svc.store.url,
            started_at=svc.started_at,
            executor=svc.executor.info().name,
            you=who.user,
            admin=who.admin,
            via=who.via,
        )

    @app.post(
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
        refused = svc.health.refusal()  # disk pressure, a failing store: say so at once
        if refused is not None:
            return problem(refused[0], refused[1])
        if (why := may_run_jobs(who)) is not None:
            return problem(403, "job refused", [why])
        body = await request.body()
        if len(body) > MAX_BODY:
            return problem(413, f"the job document is larger than {MAX_BODY} bytes")
        src = source or "request"
        if (deep := check_depth(body)) is not None:
            return problem(422, "invalid job", [f"{src}: {deep}"])
        defaults = svc.config.job_defaults(who.user)
        try:
            if "json" in request.headers.get("content-type", ""):
                try:
                    data = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
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
        for p in parsed.jobs:
            if p.job.user != who.user:
                return problem(
                    403,
                    "job refused",
                    [
                        f"{src}: user: jobs run as the user who submits them; this one names "
                        f"{p.job.user!r} and you are {who.user!r}"
                    ],
                )
            if (why := may_submit_to(svc, who, p.job.queue)) is not None:
                return problem(403, "job refused", [f"{src}: queue: {why}"])
        jobs = [_in_workdir(p.job, workdir) for p in parsed.jobs]
        missing = path_problems(jobs, src)
        if missing:
            return problem(422, "invalid job", missing)
        warnings = [w for p in parsed.jobs for w in p.warnings]
        failing = lambda: svc.health.errors.store_failing  # noqa: E731
        try:
            if parsed.is_pipeline:
                items = tuple(
                    (job, p.format, p.warnings) for job, p in zip(jobs, parsed.jobs, strict=True)
                )
                stored = await until_stored(sched.submit_all(items, idempotency_key), failing)
            else:
                one = parsed.jobs[0]
                fut = sched.submit(jobs[0], one.format, one.warnings, idempotency_key)
                stored = [await until_stored(fut, failing)]
        except Rejected as e:
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

    @app.get("/v1/jobs", response_model=JobList)
    def list_jobs(
        who: CallerDep,
        state: Annotated[str | None, Query(description="comma-separated states")] = None,
        queue: str | None = None,
        user: str | None = None,
        all: Annotated[bool, Query(description="every state, not just live jobs")] = False,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
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
        with svc.store.read() as tx:
            rows = tx.list_jobs(states=states, queue=queue, user=user, limit=limit)
        outs = [_visible(job_out(r), owns(who, r["user"])) for r in rows]
        return JSONResponse(JobList(jobs=outs).model_dump())

    @app.get("/v1/jobs/{job_id}", response_model=JobDetail, responses={404: {"model": Problem}})
    def show(job_id: str, who: CallerDep) -> Response:
        with svc.store.read() as tx:
            row = tx.get_job(job_id)
            if row is None:
                return problem(404, f"no job {job_id}")
            tasks = tx.tasks_of(job_id, row["attempt"]) if row["attempt"] else []
            events = tx.events_of(job_id)
        mine = owns(who, row["user"])
        base = _visible(job_out(row, tasks), mine)
        detail = JobDetail(
            **base.model_dump(),
            service=_service_status(job_id) if row["kind"] == "service" else None,
            events=[
                EventOut(seq=e["seq"], time=e["time"], kind=e["kind"], message=e["message"])
                for e in events
            ]
            if mine
            else [],
            env=_job_env(row) if mine else None,
        )
        return JSONResponse(detail.model_dump())

    def _service_status(job_id: str) -> ServiceStatusOut | None:
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

    @app.post(
        "/v1/jobs/{job_id}/metrics",
        status_code=202,
        response_model=MetricsOut,
        responses={404: {"model": Problem}, 409: {"model": Problem}, 422: {"model": Problem}},
    )
    async def push_metrics(job_id: str, request: Request, who: CallerDep) -> Response:
        """Report load for a service (its total) or one replica (its own): a JSON object such
        as {"rps": 12.5} or {"latency_ms": 80}; the autoscaler follows the service's metric."""
        row = job_or_404(job_id)
        require_owner(who, job_id, row["user"], "report its load")
        body = await request.body()
        if len(body) > MAX_BODY:
            return problem(413, f"the metrics document is larger than {MAX_BODY} bytes")
        try:
            values = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
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

    app.include_router(bulk_router(svc))  # POST /v1/jobs/cancel: many jobs at once

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        status_code=202,
        response_model=CancelOut,
        responses={404: {"model": Problem}, 409: {"model": Problem}},
    )
    async def cancel(job_id: str, who: CallerDep) -> Response:
        row = job_or_404(job_id)
        require_owner(who, job_id, row["user"], "cancel it")
        try:
            state = await asyncio.wrap_future(sched.cancel(job_id))
        except Rejected as e:
            return problem(e.status, str(e))
        audit(who, "cancel", f"job {job_id}", row["user"], f"was {row['state']}")
        return JSONResponse(status_code=202, content=CancelOut(id=job_id, state=state).model_dump())

    @app.get(
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
            audit(who, "logs", f"job {job_id}", row["user"])
        if attempt is not None and attempt > row["attempt"]:
            return problem(404, f"job {job_id} has had {row['attempt']} attempt(s), not {attempt}")
        if not follow:
            text = "".join(_read_logs(svc, job_id, attempt or row["attempt"], task))
            return PlainTextResponse(text)
        return StreamingResponse(
            _follow_logs(svc, job_id, task, attempt), media_type="text/plain; charset=utf-8"
        )

    @app.get("/v1/nodes", response_model=NodeList)
    def nodes(who: CallerDep) -> Response:
        info = svc.executor.info()
        owners = sched.gpu_owners()
        a, f = sched.arrays, sched.free
        out = []
        for i, node in enumerate(a.nodes):
            gpus = [
                GPUOut(
                    index=g.index,
                    model=g.model,
                    mem_mib=g.mem_mib,
                    free_milli=int(f.gpu_milli[i, g.index]),
                    used_by=[
                        {"job": j, "task": t, "gpu_milli": m}
                        for j, t, m in owners.get((node.name, g.index), [])
                    ],
                )
                for g in node.gpus
            ]
            out.append(
                NodeOut(
                    name=node.name,
                    rack=node.rack,
                    zone=node.zone,
                    healthy=node.healthy,
                    milli_cpu=node.milli_cpu,
                    mem_mib=node.mem_mib,
                    free_milli_cpu=int(f.cpu[i]),
                    free_mem_mib=int(f.mem[i]),
                    gpus=gpus,
                    memory_limit=info.memory_limit,
                    cpu_affinity=info.cpu_affinity,
                    notes=[*svc.node_notes, *info.notes, *svc.health.check().problems],
                )
            )
        return JSONResponse(NodeList(nodes=out).model_dump())

    @app.get("/v1/queues", response_model=QueueList)
    def queues(who: CallerDep) -> Response:
        _, per_queue = sched.live_summary()
        used: dict[str, list[float]] = {}
        for (qname, _user), (cpu, mem, gpu) in list(sched.usage.items()):
            path = sched.queues.path(qname) if sched.queues.has(qname) else (qname,)
            for name in path:
                acc = used.setdefault(name, [0.0, 0.0, 0.0])
                acc[0] += cpu
                acc[1] += mem
                acc[2] += gpu
        out = []
        for q in sched.queues.queues:
            u = used.get(q.name, [0.0, 0.0, 0.0])
            p, r = per_queue.get(q.name, (0, 0))
            out.append(
                QueueOut(
                    name=q.name,
                    parent=q.parent,
                    weight=q.weight,
                    guarantee=_amount(q.guarantee),
                    limit=None if q.limit is None else _amount(q.limit),
                    borrowing=q.borrowing,
                    used={"cpus": u[0] / 1000, "mem_gib": u[1] / 1024, "gpus": u[2] / 1000},
                    pending=p,
                    running=r,
                )
            )
        return JSONResponse(QueueList(queues=out).model_dump())

    @app.get("/metrics", include_in_schema=False)
    def metrics(who: CallerDep) -> Response:
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE)

    # --- tokens and the audit log (admins) --------------------------------------------------

    @app.post("/v1/tokens", status_code=201, response_model=TokenCreated)
    def create_token(body: TokenIn, who: CallerDep) -> Response:
        """A new token for `user`; its secret is in this answer and nowhere else, ever."""
        require_admin(who, "create tokens")
        now = time.time()
        if body.expires_in_s is not None and body.expires_in_s <= 0:
            return problem(422, "invalid request", ["expires_in_s: must be above 0"])
        expires = None if body.expires_in_s is None else now + body.expires_in_s
        secret, row = tokens.create(
            svc.store,
            body.user,
            admin=body.admin,
            created_by=who.user,
            now=now,
            expires_at=expires,
            note=body.note,
        )
        audit(who, "token create", f"token {row['id']}", body.user, "admin" if body.admin else "")
        out = TokenCreated(**_token_out(row).model_dump(), token=secret)
        return JSONResponse(status_code=201, content=out.model_dump())

    @app.get("/v1/tokens", response_model=list[TokenOut])
    def list_tokens(who: CallerDep) -> Response:
        with svc.store.read() as tx:
            rows = tx.list_tokens(None if who.admin else who.user)
        return JSONResponse([_token_out(r).model_dump() for r in rows])

    @app.post("/v1/tokens/{token_id}/revoke", response_model=TokenOut)
    def revoke_token(token_id: str, who: CallerDep) -> Response:
        with svc.store.read() as tx:
            mine = [r for r in tx.list_tokens(who.user) if r["id"] == token_id]
        if not who.admin and not mine:
            raise HTTPException(403, "only admins may revoke another user's token")
        with svc.store.tx() as tx:
            row = tx.revoke_token(token_id, time.time())
        if row is None:
            return problem(404, f"no token {token_id}")
        audit(who, "token revoke", f"token {token_id}", row["user"])
        return JSONResponse(_token_out(row).model_dump())

    @app.get("/v1/audit", response_model=list[AuditOut])
    def audit_log(
        who: CallerDep, limit: Annotated[int, Query(ge=1, le=100_000)] = 1000
    ) -> Response:
        require_admin(who, "read the audit log")
        with svc.store.read() as tx:
            rows = tx.audit_log(limit)
        return JSONResponse([AuditOut(**r).model_dump() for r in rows])

    return app


def _visible(out: JobOut, mine: bool) -> JobOut:
    """A job as its owner and admins see it, or as everyone else does: without its commands,
    its tasks' log paths and its checkpoint directory (like `squeue` for another's job)."""
    if mine:
        return out
    return out.model_copy(
        update={
            "groups": [g.model_copy(update={"command": []}) for g in out.groups],
            "tasks": [t.model_copy(update={"log_path": ""}) for t in out.tasks],
            "checkpoint_dir": "",
        }
    )


def _job_env(row: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each task group's own variables, as submitted (the contract's are added at launch)."""
    return {
        g["name"]: {str(k): str(v) for k, v in g.get("env") or ()} for g in row["spec"]["groups"]
    }


def _token_out(row: dict[str, Any]) -> TokenOut:
    return TokenOut(
        id=row["id"],
        user=row["user"],
        admin=bool(row["admin"]),
        created_at=row["created_at"],
        created_by=row["created_by"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        note=row["note"],
    )


def _in_workdir(job: Job, workdir: str | None) -> Job:
    """Relative (or missing) working directories are the submitter's, like Slurm's."""
    if workdir is None:
        return job
    return replace(
        job,
        groups=tuple(
            replace(g, workdir=str(Path(workdir) / (g.workdir or "")).rstrip("/") or "/")
            if g.workdir is None or not Path(g.workdir).is_absolute()
            else g
            for g in job.groups
        ),
    )


def _amount(r: Any) -> dict[str, float]:
    return {
        "cpus": r.milli_cpu / 1000,
        "mem_gib": r.mem_mib / 1024,
        "gpus": r.gpu + r.gpu_milli / 1000,
    }


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

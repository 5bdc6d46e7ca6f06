"""The web dashboard: the page at `/`, its JSON at `/v1/dashboard`, and the utilisation ring.

The page (static files shipped in `aisched/service/static/`, no CDN, no external fonts) polls
`/v1/dashboard` and draws racks and GPUs, queues, waiting jobs with their reasons, a timeline of
recent jobs and utilisation over time. The JSON is built from the loop's published state and the
store, read-only.

The endpoint must never take the service down or answer a 500 because of odd state (a node
without GPUs, a queue that no longer exists, a job row half-written, a dictionary changing while
it is read by another thread): every section is built on its own, and a section that fails is
answered empty with a line in `errors`, the rest of the document intact.

Utilisation over time comes from a bounded in-memory ring of samples, taken by a daemon thread
that ends when the scheduler stops; it is lost on restart by design (Prometheus keeps history).
"""

from __future__ import annotations

import hmac
import html
import logging
import math
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from aisched import __version__
from aisched.core.queues import borrowed_usage
from aisched.core.session import usage_along_paths, usage_vector
from aisched.model.queue import Queue
from aisched.model.resources import Dim
from aisched.model.states import JobState
from aisched.service import tokens
from aisched.service.app import Service
from aisched.service.auth import ReaderDep, charge_unidentified, cookie_name, reader
from aisched.service.loop import Scheduler
from aisched.service.routes.common import problem
from aisched.service.user_limits import OTHERS, UserHolding, governed, in_unit, user_holdings
from aisched.store.db import Tx

log = logging.getLogger("aisched.dashboard")

SAMPLE_INTERVAL_S = 2.0
RING_SAMPLES = 1800  # one hour at the default interval
TIMELINE_JOBS = 40
PENDING_SHOWN = 200
# The login form has one field, a token of 68 characters: its body is bounded far below the
# API's 1 MiB, and so is the number of fields it may hold (parsed on the event loop).
LOGIN_BODY_MAX = 4096
LOGIN_FIELDS_MAX = 4
STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class UtilisationSample:
    time: float
    gpus_used: float
    gpus_total: float
    cpus_used: float
    cpus_total: float
    mem_used_bytes: float
    mem_total_bytes: float
    running_jobs: int
    pending_jobs: int


class UtilisationRing:
    """The last `size` samples of what is allocated; thread-safe (the sampler writes, requests
    read)."""

    def __init__(self, size: int = RING_SAMPLES) -> None:
        self._samples: deque[UtilisationSample] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, sample: UtilisationSample) -> None:
        with self._lock:
            self._samples.append(sample)

    def samples(self) -> list[UtilisationSample]:
        with self._lock:
            return list(self._samples)

    def last_time(self) -> float:
        with self._lock:
            return self._samples[-1].time if self._samples else -math.inf


def take_sample(sched: Scheduler, now: float) -> UtilisationSample:
    alloc = sched.allocation()
    states, _ = sched.live_summary()
    cpu, mem, gpu = alloc["cpu"], alloc["memory_bytes"], alloc["gpu"]
    return UtilisationSample(
        time=now,
        gpus_used=gpu[0],
        gpus_total=gpu[1],
        cpus_used=cpu[0],
        cpus_total=cpu[1],
        mem_used_bytes=mem[0],
        mem_total_bytes=mem[1],
        running_jobs=states.get(JobState.RUNNING.value, 0),
        pending_jobs=states.get(JobState.PENDING.value, 0),
    )


def start_sampler(
    sched: Scheduler,
    ring: UtilisationRing,
    interval_s: float = SAMPLE_INTERVAL_S,
    clock: Callable[[], float] = time.time,
) -> threading.Thread:
    """Sample every `interval_s` until the scheduler is told to stop."""

    def run() -> None:
        while not sched.stopping.wait(interval_s):
            try:
                ring.add(take_sample(sched, clock()))
            except Exception:  # a bad sample is skipped; the next one may be fine
                log.exception("utilisation sample failed")

    thread = threading.Thread(target=run, name="aisched-dashboard-sampler", daemon=True)
    thread.start()
    return thread


# --- the document ------------------------------------------------------------------------------


def _gpu_state(free_milli: int, users: list[dict[str, Any]]) -> str:
    """free: nobody on it; used: one task holds it whole; shared: held in parts."""
    if not users:
        return "free"
    if len(users) == 1 and users[0]["gpu_milli"] >= 1000 and free_milli <= 0:
        return "used"
    return "shared"


def racks_section(sched: Scheduler) -> list[dict[str, Any]]:
    owners = sched.gpu_owners()
    live = dict(sched.jobs)
    a, f = sched.arrays, sched.free
    racks: dict[str, list[dict[str, Any]]] = {}
    for i, node in enumerate(a.nodes):
        gpus = []
        for g in node.gpus:
            users = []
            for job_id, task, milli in owners.get((node.name, g.index), []):
                lj = live.get(job_id)
                users.append(
                    {
                        "job": job_id,
                        "task": task,
                        "gpu_milli": milli,
                        "name": lj.job.name if lj is not None else "",
                        "queue": lj.job.queue if lj is not None else "",
                    }
                )
            free_milli = int(f.gpu_milli[i, g.index])
            gpus.append(
                {
                    "index": g.index,
                    "model": g.model,
                    "mem_mib": g.mem_mib,
                    "free_milli": free_milli,
                    "state": _gpu_state(free_milli, users),
                    "users": users,
                }
            )
        racks.setdefault(node.rack, []).append(
            {
                "name": node.name,
                "zone": node.zone,
                "healthy": node.healthy,
                "cpus": node.milli_cpu / 1000,
                "free_cpus": int(f.cpu[i]) / 1000,
                "mem_gib": node.mem_mib / 1024,
                "free_mem_gib": int(f.mem[i]) / 1024,
                "gpus": gpus,
            }
        )
    return [{"name": name, "nodes": nodes} for name, nodes in sorted(racks.items())]


def queues_section(
    sched: Scheduler, max_priority: Callable[[tuple[str, ...]], int]
) -> list[dict[str, Any]]:
    """Per queue: its guarantee, what it uses (its descendants included), the part of that
    borrowed from idle capacity (what reclaim may take back: above its own guarantee and
    every guarantee above it, `core.queues.borrowed_usage`), the highest priority its users
    may ask for (`max_priority` of its path: `ServiceConfig.max_priority`), and its per-user
    limit with what each user's running jobs hold against it (`_per_user`)."""
    _, per_queue = sched.live_summary()
    capacity_gpus = sched.allocation()["gpu"][1]
    by_user = dict(list(sched.usage.items()))  # a copy: the loop thread replaces entries
    raw = usage_along_paths(sched.queues, by_user)
    borrowed = borrowed_usage(sched.queues, raw)
    used = {
        name: [in_unit(v, i, metric=False) for i, v in enumerate(vec)] for name, vec in raw.items()
    }
    roots = [q for q in sched.queues.queues if q.parent is None]
    holdings = user_holdings(sched.queues, by_user)
    out = []
    for q in sched.queues.queues:
        cpus, mem_gib, gpus = used.get(q.name, [0.0, 0.0, 0.0])
        guarantee_gpus = q.guarantee.gpu + q.guarantee.gpu_milli / 1000
        borrowed_gpus = in_unit(borrowed.get(q.name, (0.0, 0.0, 0.0))[2], 2, metric=False)
        if roots == [q]:
            # The only top-level queue owns the whole cluster (nothing it uses is borrowed,
            # `borrowed_usage`): its guarantee mark stands at the cluster's GPUs.
            guarantee_gpus = max(guarantee_gpus, capacity_gpus)
        # None where the limit does not cap GPUs; 0 where it keeps the queue off them.
        limit_gpus = (
            None
            if q.limit is None or Dim.GPU not in q.limit_caps()
            else (q.limit.gpu + q.limit.gpu_milli / 1000)
        )
        pending, running = per_queue.get(q.name, (0, 0))
        out.append(
            {
                "name": q.name,
                "parent": q.parent,
                "weight": q.weight,
                "borrowing": q.borrowing,
                "guarantee_gpus": guarantee_gpus,
                "limit_gpus": limit_gpus,
                "used_gpus": gpus,
                "used_cpus": cpus,
                "used_mem_gib": mem_gib,
                "borrowed_gpus": borrowed_gpus,
                "share": gpus / capacity_gpus if capacity_gpus > 0 else 0.0,
                "pending": pending,
                "running": running,
                "max_priority": max_priority(sched.queues.path(q.name)),
                **_per_user(q, holdings.get(q.name, [])),
            }
        )
    return out


def _per_user(q: Queue, held: list[UserHolding]) -> dict[str, Any]:
    """A queue's `user_limit` (the resources it caps, in GPUs, CPUs and GiB; None without one)
    and, per user with running jobs under it (bounded, `user_limits.USERS_SHOWN`), what they
    hold of each of those resources and whether they are at the limit on one of them (their
    next job there waits)."""
    limit = q.user_limit
    if limit is None:
        return {"user_limit": None, "users": []}
    resources = governed(q.user_limit_caps())
    cap = usage_vector(limit)
    users = []
    for h in held:
        row: dict[str, Any] = {"user": h.user, "others": h.user == OTHERS}
        for _, key, i in resources:
            row[key] = in_unit(h.usage[i], i, metric=False)
        # A cap of 0 is a ban, refused at submission, not a share a user's jobs fill up.
        row["at_limit"] = not row["others"] and any(
            0 < cap[i] <= h.usage[i] for _, _, i in resources
        )
        users.append(row)
    return {
        "user_limit": {key: in_unit(cap[i], i, metric=False) for _, key, i in resources},
        "users": users,
    }


# What the pending list and the timeline show of a job: never its document (`spec`), which a
# user may make megabytes long (`limits.user_max_job_bytes`); its GPUs come from `JobGpus`.
PENDING_COLUMNS = (
    "id",
    "name",
    "queue",
    "user",
    "priority",
    "submitted_at",
    "reason_code",
    "reason",
    "eta",
)
TIMELINE_COLUMNS = ("id", "name", "queue", "state", "submitted_at", "started_at", "finished_at")
GPUS_CACHED = 4096  # jobs whose GPUs are remembered: far more than one document shows


def _spec_gpus(spec: dict[str, Any]) -> float:
    total = 0
    for g in spec.get("groups", []):
        req = g.get("request", {})
        total += (req.get("gpu", 0) * 1000 + req.get("gpu_milli", 0)) * g.get("replicas", 1)
    return total / 1000


class JobGpus:
    """The GPUs each job asks for, by id, so that a poll's cost does not grow with the size of
    the jobs' documents: from the scheduler's live job when there is one, else from the job's
    stored document, read once (a job's document never changes). Remembers the last
    `size` jobs looked up; thread-safe (requests run on several threads)."""

    def __init__(self, size: int = GPUS_CACHED) -> None:
        self._size = size
        self._gpus: dict[str, float] = {}
        self._lock = threading.Lock()

    def of(self, sched: Scheduler, tx: Tx, job_ids: list[str]) -> dict[str, float]:
        """GPUs of each of `job_ids` (0 for a job forgotten meanwhile); reads the documents
        of only those jobs neither remembered nor live."""
        with self._lock:
            found = {i: self._gpus[i] for i in job_ids if i in self._gpus}
        live = sched.jobs
        for i in job_ids:
            lj = live.get(i) if i not in found else None
            if lj is not None:
                found[i] = lj.job.num_gpus
        missing = [i for i in job_ids if i not in found]
        for i, spec in tx.job_specs(missing).items():
            found[i] = _spec_gpus(spec or {})
        with self._lock:
            for i in job_ids:
                if i in found and i not in self._gpus:
                    self._gpus[i] = found[i]
            while len(self._gpus) > self._size:  # the oldest remembered go first
                del self._gpus[next(iter(self._gpus))]
        return {i: found.get(i, 0.0) for i in job_ids}


def pending_section(svc: Service, now: float, gpus: JobGpus) -> tuple[list[dict[str, Any]], int]:
    """The `PENDING_SHOWN` longest-waiting jobs, longest first, and how many more wait."""
    waiting = [JobState.PENDING.value]
    with svc.store.read() as tx:
        # Oldest first from the store: the newest ones, sorted, left out those that had waited
        # longest (the job holding the reservation among them).
        rows = tx.list_jobs(
            states=waiting, limit=PENDING_SHOWN, newest_first=False, columns=PENDING_COLUMNS
        )
        total = tx.count_jobs(waiting) if len(rows) == PENDING_SHOWN else len(rows)
        asked = gpus.of(svc.scheduler, tx, [r["id"] for r in rows])
    shown = [
        {
            "id": r["id"],
            "name": r["name"],
            "queue": r["queue"],
            "user": r["user"],
            "priority": r["priority"],
            "gpus": asked[r["id"]],
            "submitted_at": r["submitted_at"],
            "waited_s": max(now - (r["submitted_at"] or now), 0.0),
            "reason_code": r["reason_code"],
            "reason": r["reason"] or "not yet considered by a scheduling cycle",
            "eta": r["eta"],
        }
        for r in rows
    ]
    return shown, max(total - len(shown), 0)


def timeline_section(svc: Service, gpus: JobGpus) -> list[dict[str, Any]]:
    """The last `TIMELINE_JOBS` jobs, oldest first, each with the spans its attempts ran
    (`runs`: [start, end or None while running]): a job preempted and requeued waits
    between them."""
    with svc.store.read() as tx:
        rows = tx.list_jobs(limit=TIMELINE_JOBS, columns=TIMELINE_COLUMNS)
        ids = [r["id"] for r in rows]
        runs = tx.attempt_spans(ids)
        asked = gpus.of(svc.scheduler, tx, ids)
    return [
        {
            "id": r["id"],
            "name": r["name"],
            "queue": r["queue"],
            "state": r["state"],
            "gpus": asked[r["id"]],
            "submitted_at": r["submitted_at"],
            "started_at": r["started_at"],
            "finished_at": r["finished_at"],
            "runs": [list(span) for span in runs.get(r["id"], [])],
        }
        for r in reversed(rows)  # oldest first, as a Gantt chart reads
    ]


def summary_section(sched: Scheduler) -> dict[str, Any]:
    states, _ = sched.live_summary()
    jobs = {s.value: states.get(s.value, 0) for s in (JobState.PENDING, JobState.RUNNING)}
    for state, n in sched.terminal_counts.items():
        jobs[state] = n
    alloc = sched.allocation()
    return {
        "jobs": jobs,
        "gpus": {"used": alloc["gpu"][0], "total": alloc["gpu"][1]},
        "cpus": {"used": alloc["cpu"][0], "total": alloc["cpu"][1]},
        "mem_gib": {
            "used": alloc["memory_bytes"][0] / 2**30,
            "total": alloc["memory_bytes"][1] / 2**30,
        },
    }


def dashboard_document(
    svc: Service,
    ring: UtilisationRing,
    now: float,
    since: float | None = None,
    gpus: JobGpus | None = None,
) -> dict[str, Any]:
    """Every section of the page; a section that cannot be built is empty, with an error line."""
    sched = svc.scheduler
    gpus = gpus if gpus is not None else JobGpus()
    errors: list[str] = []

    def section(name: str, build: Callable[[], Any], empty: Any) -> Any:
        try:
            return build()
        except Exception as e:  # odd state must not cost the rest of the page
            log.exception("dashboard section %s failed", name)
            errors.append(f"{name}: {e.__class__.__name__}: {e}")
            return empty

    samples = ring.samples()
    if since is not None:
        samples = [s for s in samples if s.time > since]
    pending, pending_more = section("pending", lambda: pending_section(svc, now, gpus), ([], 0))
    return {
        "time": now,
        "version": __version__,
        "policy": section("policy", lambda: svc.policy.name, ""),
        "summary": section("summary", lambda: summary_section(sched), {}),
        "racks": section("racks", lambda: racks_section(sched), []),
        "queues": section("queues", lambda: queues_section(sched, svc.config.max_priority), []),
        "pending": pending,
        "pending_more": pending_more,  # waiting jobs past those listed
        "timeline": section("timeline", lambda: timeline_section(svc, gpus), []),
        "utilisation": [asdict(s) for s in samples],
        "errors": errors,
    }


def dashboard_router(svc: Service, clock: Callable[[], float] = time.time) -> APIRouter:
    """The page, its static files and its JSON; starts the sampler of the utilisation ring."""
    router = APIRouter()
    ring = UtilisationRing()
    gpus = JobGpus()
    start_sampler(svc.scheduler, ring, clock=clock)

    @router.get("/", include_in_schema=False)
    def page(request: Request, token: str | None = None) -> Response:
        if token is not None:
            return _link(svc, token, request)
        try:
            reader(request)
        except HTTPException as e:
            if e.status_code == 429:  # known, but over the rate limit: not a login question
                raise
            return _login_page(status=401)
        return _page(_static("dashboard.html"))

    @router.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        # The form is posted by the login page itself; a browser says when another page, even
        # one on another port of this host, posts it (login CSRF: its token, its view).
        if _posted_elsewhere(request):
            return problem(403, "the login form may be posted only from its own page")
        # Charged before the body is read: a login is a request without a valid identity yet.
        charge_unidentified(request)
        body = await _bounded_body(request, LOGIN_BODY_MAX)
        if body is None:
            return problem(413, f"the login form is larger than {LOGIN_BODY_MAX} bytes")
        try:
            form = urllib.parse.parse_qs(
                body.decode("utf-8", "replace"), max_num_fields=LOGIN_FIELDS_MAX
            )
        except ValueError:
            return problem(400, f"the login form has more than {LOGIN_FIELDS_MAX} fields")
        # The token's check reads the store: off the event loop, which a slow store would hold.
        return await run_in_threadpool(_login, svc, (form.get("token") or [""])[0], request)

    @router.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        media = STATIC_FILES.get(name)
        if media is None:
            return JSONResponse(
                status_code=404, content={"error": f"no static file {name}", "problems": []}
            )
        return Response(_static(name), media_type=media)

    @router.get("/v1/dashboard")
    def dashboard(
        who: ReaderDep,
        since: Annotated[
            float | None, Query(description="only utilisation samples after this Unix time")
        ] = None,
    ) -> Response:
        """Everything the dashboard page shows; `since` keeps only newer utilisation samples."""
        now = clock()
        if now - ring.last_time() >= SAMPLE_INTERVAL_S:
            # A page opened right after start still gets a point to draw.
            try:
                ring.add(take_sample(svc.scheduler, now))
            except Exception:
                log.exception("utilisation sample failed")
        return JSONResponse(_finite(dashboard_document(svc, ring, now, since, gpus)))

    return router


def _link(svc: Service, secret: str, request: Request) -> Response:
    """A link with `?token=`: the login form filled in with it, saying whose it is, for the
    user to submit. Never a login by itself: any page can send a browser to such a link, and
    would sign its visitor in as whoever the token is (login CSRF). A browser already signed in
    with that very token just goes to the page, off the URL (a bookmarked link)."""
    secret = secret.strip()
    try:
        info = tokens.verify(svc.store, secret, time.time())
    except tokens.TokenRefused:
        charge_unidentified(request)
        note = "The token in this link was refused (unknown, revoked or expired)."
        return _login_page(note, status=401)
    held = request.cookies.get(cookie_name(request))
    cookie = tokens.dashboard_cookie(secret, info.id)
    if held is not None and hmac.compare_digest(held.encode(), cookie.encode()):
        return RedirectResponse("/", status_code=303)
    return _login_page(
        f"This link signs you in as <b>{html.escape(info.user)}</b>"
        f"{' (admin)' if info.admin else ''}. Sign in only if you meant to.",
        secret,
    )


def _login_page(note: str = "", secret: str = "", status: int = 200) -> Response:
    """The login form, with `note` (HTML) above it and its token field filled with `secret`."""
    text = _static("login.html")
    if note:
        text = text.replace("<!--link-->", f'<p id="link-note">{note}</p>', 1)
    if secret:
        text = text.replace('value=""', f'value="{html.escape(secret, quote=True)}"', 1)
    out = _page(text, status)
    out.headers["Cache-Control"] = "no-store"  # it may hold a token
    return out


# The pages load their script and stylesheet from the service and nothing else: no inline
# script or style (the script sets styles through the CSSOM), no other origin, no <base>, forms
# posted only here, and never inside another site's frame (where a page could get a click on
# its buttons).
PAGE_POLICY = "; ".join(
    [
        "default-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


def _page(text: str, status: int = 200) -> Response:
    """An HTML page of the dashboard's, with its Content-Security-Policy (`PAGE_POLICY`), in no
    frame, and sending no Referer (a login link's URL holds a token)."""
    return HTMLResponse(
        text,
        status_code=status,
        headers={
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": PAGE_POLICY,
            "Referrer-Policy": "no-referrer",
        },
    )


def _posted_elsewhere(request: Request) -> bool:
    """Whether a browser says another page posted `request`: by `Sec-Fetch-Site`, else (a
    browser that does not send it) by an `Origin` other than the request's own scheme, host and
    port. A request with neither is no browser's form post."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    theirs = _origin(origin)
    return theirs is None or theirs != _origin(f"{request.url.scheme}://{request.url.netloc}")


def _origin(url: str) -> tuple[str, str, int] | None:
    """An origin's scheme, host and port (the scheme's default when not written); None for
    one that is not a URL (`null`, from a sandboxed frame or a redirect)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.scheme, parts.hostname, port


async def _bounded_body(request: Request, max_bytes: int) -> bytes | None:
    """The request's body, or None once it is over `max_bytes` (a declared length over it
    before anything is read; a streamed one as soon as it passes it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)


def _login(svc: Service, secret: str, request: Request) -> Response:
    """A valid token becomes an HttpOnly, SameSite=Strict cookie that names it, not the token
    itself (scripts cannot read it; it stands only for the dashboard's reads, `auth.reader`),
    Secure when served over TLS, and a redirect to the page; a bad one, the login form
    again. The request is already charged to its peer's rate budget."""
    try:
        info = tokens.verify(svc.store, secret.strip(), time.time())
    except tokens.TokenRefused:
        return _login_page(status=401)
    out = RedirectResponse("/", status_code=303)
    secure = request.url.scheme == "https"
    # Not the token: the browser sends it to every port of the host (`service/tokens.py`).
    cookie = tokens.login_cookie(svc.store, secret.strip(), info.id)
    out.set_cookie(
        cookie_name(request), cookie, httponly=True, samesite="strict", path="/", secure=secure
    )
    return out


def _static(name: str) -> str:
    return (resources.files("aisched.service") / "static" / name).read_text(encoding="utf-8")


def _finite(v: Any) -> Any:
    """JSON has no NaN or infinity; an odd figure becomes null rather than a 500."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v

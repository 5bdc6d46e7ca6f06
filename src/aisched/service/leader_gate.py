"""The API's gate for instances that do not lead: standbys answer reads and refuse writes.

`install(app, svc)` (one line of `create_app`) adds a middleware: while this instance does not
lead (standby, starting, deposed), a request that may change state (any method but GET, HEAD,
OPTIONS) is answered 421 Misdirected Request with a problem JSON whose `leader` field is the
leader's address (and the header `Aisched-Leader`), or 503 with `leader: ""` when no instance
holds a live lease (a takeover under way: retry). Nothing of the request reaches the routes.
Reads are served from the shared database: jobs, events, logs and tokens are the leader's;
`/v1/nodes` and `/v1/queues` show this instance's own view (nothing allocated). Liveness and
readiness say the role, term and leader (`routes/system.py`); only a leader is ready, so a load
balancer sends writers to the leader alone.

Why 421 and not a redirect: a 307 would make every HTTP client resend its body (and token)
to whatever address it is given, silently; a 421 with the address says who leads and leaves
the choice to the client (the CLI sends the request there once, `cli.client`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from aisched.service.app import Service

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def install(app: FastAPI, svc: Service) -> None:
    """Add the gate to `app` (see the module docstring)."""
    app.add_middleware(LeaderGate, svc=svc)


def not_leader(svc: Service) -> str:
    lead = svc.leadership
    where = lead.leader_address()
    if where:
        return (
            f"this instance is a {lead.role.value}: the leader is {where} (term "
            f"{lead.seen_term()}); send changes there"
        )
    return f"this instance is a {lead.role.value} and no instance leads right now; retry soon"


def not_leader_answer(svc: Service) -> JSONResponse:
    """The gate's answer: 421 naming the leader, or 503 with `leader: ""` while none leads."""
    where = svc.leadership.leader_address()
    return JSONResponse(
        {"error": not_leader(svc), "problems": [], "leader": where},
        status_code=421 if where else 503,
        headers={"aisched-leader": where} if where else None,
    )


class LeaderGate:
    """The middleware of the module docstring (1)."""

    def __init__(self, app: ASGIApp, svc: Service) -> None:
        self.app = app
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in SAFE_METHODS
            or self.svc.leadership.leading
        ):
            await self.app(scope, receive, send)
            return
        await not_leader_answer(self.svc)(scope, receive, send)

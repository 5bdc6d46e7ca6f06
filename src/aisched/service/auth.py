"""Who may do what, as FastAPI dependencies: the caller's identity and the permission rules.

Identity (`caller`): on the Unix socket, the kernel's peer credentials (`service/protocol.py`
puts them in the scope); over TCP, a bearer token (`Authorization: Bearer ...`). The
dashboard's HttpOnly cookie made from a token counts only for the dashboard's own reads
(`reader`): a browser sends a cookie with any request a page makes, whatever page, and
SameSite does not tell one port of a host from another, so a page another local user serves on
127.0.0.1 could otherwise submit and cancel jobs as whoever opened the dashboard. A header it
cannot send across origins without the service's consent, which it never gives.
`/v1/healthz` and `/v1/readyz` need none of these. Each identified caller's requests are
charged here to their rate budget (`service/ratelimit.py`): past it, 429 with Retry-After. A
missing or bad token is a 401; a caller without the right is a 403. Neither answer says
whether the job asked about exists: identity is settled before any job is looked up. An answer
that goes on streaming (a followed log) asks `still_valid` as it goes: a token revoked or
expired since the request began ends it, as it ends a dashboard session.

Rules: a user acts on their own jobs (their name's, submitted as their uid: `own_job`); admins
on all. Every job is listed for every caller
(without its command, environment and logs, like `squeue`). A service that does not run as
root can run jobs only as its own user, and says so to anyone else. Queues may name who may
submit to them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from aisched.model.job import account_key
from aisched.service import tokens
from aisched.service.app import Service
from aisched.service.identity import (
    Caller,
    from_peer,
    from_token,
    group_name,
    same_account,
    service_user,
)
from aisched.service.protocol import CLIENT_SCOPE_KEY, PEER_SCOPE_KEY, describe_key
from aisched.service.ratelimit import RequestLimits
from aisched.store.codec import submitter_uid
from aisched.store.db import Store

COOKIE = "aisched_token"  # the dashboard's cookie, named per port: `cookie_name`
READS = frozenset({"GET", "HEAD"})  # all a read-only token may send


class Unauthorized(HTTPException):
    def __init__(self, detail: str) -> None:
        super().__init__(401, detail, headers={"WWW-Authenticate": "Bearer"})


def caller(request: Request) -> Caller:
    """Who is calling, from the socket's peer or the bearer header; never from a cookie."""
    return _identify(request, bearer(request))


def reader(request: Request) -> Caller:
    """Who is calling a read of the dashboard's: as `caller`, or from the dashboard's cookie.
    Only for GET routes that change nothing and answer only to the page (a cross-origin page
    may send the cookie but cannot read the answer)."""
    secret = bearer(request)
    if secret is None and not request.headers.get("authorization"):
        cookie = request.cookies.get(cookie_name(request))
        if cookie is not None:
            return _identify(request, cookie, tokens.verify_cookie)
    return _identify(request, secret)


def cookie_name(request: Request) -> str:
    """The name of the dashboard's cookie for the port `request` came in on (the socket's own,
    never the Host header's). A browser keeps one cookie of a name per host, whatever its port:
    under one name, two services on one host (two ports) signed each other's dashboards out."""
    server = request.scope.get("server")
    port = server[1] if server and len(server) > 1 else None
    return f"{COOKIE}_{port}" if port else COOKIE


def _identify(
    request: Request,
    secret: str | None,
    verify: Callable[[Store, str, float], tokens.TokenInfo] = tokens.verify,
) -> Caller:
    svc: Service = request.app.state.service
    peer = request.scope.get(PEER_SCOPE_KEY)
    if peer is not None:
        return _charged(request, from_peer(peer, svc.admins))
    if secret is None:
        charge_unidentified(request)
        raise Unauthorized(
            "authentication required: send a token (Authorization: Bearer ...; "
            "`aisched token create` makes one), or use the local Unix socket"
        )
    try:
        info = verify(svc.store, secret, time.time())
    except tokens.TokenRefused as e:
        charge_unidentified(request)
        raise Unauthorized(
            str(e) or "the token is not valid (unknown, revoked or expired)"
        ) from None
    request.state.credential = (verify, secret)  # asked again by `still_valid`
    who = _charged(request, from_token(info.user, info.admin, svc.admins))
    if info.read_only and request.method not in READS:
        # Here, where every route learns who calls: no route can forget to check it.
        raise HTTPException(
            403, f"token {info.id} is read-only: it may read (GET), not {request.method}"
        )
    return who


def still_valid(request: Request) -> bool:
    """Whether the token (or dashboard cookie) `request` was identified by is still live: not
    revoked, not expired. One indexed read of the store; call it from a worker thread. A
    caller on the socket is the kernel's word for as long as its connection lasts."""
    credential = getattr(request.state, "credential", None)
    if credential is None:  # identified by the socket's peer
        return True
    verify, secret = credential
    svc: Service = request.app.state.service
    try:
        verify(svc.store, secret, time.time())
    except tokens.TokenRefused:
        return False
    return True


def _charged(request: Request, who: Caller) -> Caller:
    """`who`, once the request is charged to their rate budget. Here, like the read-only
    check, so that no route can miss it; before any route's work. Admins are not limited:
    they can already cancel every job and reconfigure the service, so a limit would protect
    no one from them, and their tools (monitoring, an operator's clean-up under load) must
    not be throttled when the service is busiest."""
    if not who.admin:
        # The account, whether by socket or by token: one budget; by name and uid, so that an
        # account given a deleted one's name does not inherit a budget that one spent.
        _charge(request, account_key(who.user, who.uid), who.user)
    return who


def charge_unidentified(request: Request) -> None:
    """Charge a request without a valid identity to its connection's peer (429 past its
    budget), so that guessing tokens is slowed as much as any flood: the local user who owns
    a loopback client's socket, else the address (`service/protocol.py`, `peer_key`). A
    separate budget from the user's own (their account's), which a token's requests take from."""
    key = request.scope.get(CLIENT_SCOPE_KEY)
    if not key:  # not through the service's protocol (the app tested in process)
        key = f"address {request.client.host if request.client else 'unknown'}"
    _charge(request, key, describe_key(key))


def _charge(request: Request, key: str, who: str | None = None) -> None:
    limits: RequestLimits | None = getattr(request.app.state, "rate_limits", None)
    refusal = limits.check(key, request.method, request.url.path) if limits else None
    if refusal is None:
        return
    svc: Service = request.app.state.service
    svc.metrics.rate_limited.labels(refusal.budget.name).inc()
    raise HTTPException(
        429, refusal.message(who or key), headers={"Retry-After": str(refusal.retry_after_s)}
    )


def bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None
    return None


CallerDep = Annotated[Caller, Depends(caller)]
ReaderDep = Annotated[Caller, Depends(reader)]


def require_admin(who: Caller, what: str) -> None:
    if not who.admin:
        raise HTTPException(403, f"only admins may {what}; {who.user} is not one")


def own_job(who: Caller, row: Mapping[str, Any]) -> bool:
    """Whether the job stored as `row` is `who`'s own: their name and, where the job recorded
    its submitter's uid, their uid (`identity.same_account`), whether or not they are an
    admin. Every owner check goes through here (or `owns`), so that a name given to a new
    account hands it none of the old account's jobs."""
    return same_account(who.user, who.uid, row["user"], submitter_uid(row["spec"]))


def owns(who: Caller, row: Mapping[str, Any]) -> bool:
    """Whether `who` may see and act on all of the job stored as `row`: an admin, or its
    owner (`own_job`)."""
    return who.admin or own_job(who, row)


def require_owner(who: Caller, job_id: str, row: Mapping[str, Any], what: str) -> None:
    if owns(who, row):
        return
    owner = row["user"]
    if owner != who.user:
        raise HTTPException(
            403, f"job {job_id} belongs to {owner}: only {owner} and admins may {what}"
        )
    you = "have no account here" if who.uid is None else f"are uid {who.uid}"
    raise HTTPException(
        403,
        f"job {job_id} was submitted by {owner} as uid {submitter_uid(row['spec'])}, and you "
        f"{you} (the account was deleted or its name given to another): only that account "
        f"and admins may {what}",
    )


def may_run_jobs(who: Caller) -> str | None:
    """Why `who` cannot have jobs run by this service, or None. Jobs run as their submitter,
    so a service that is not root can run only its own user's."""
    if who.uid is None:
        return f"user {who.user} has no account on this machine, so no job can run as {who.user}"
    me = os.geteuid()
    if me != 0 and who.uid != me:
        return (
            f"this aisched runs as {service_user()}, so it can run jobs only as "
            f"{service_user()}, not as {who.user}; run it as root to share this machine "
            "(docs/security.md)"
        )
    return None


def may_submit_to(svc: Service, who: Caller, queue: str) -> str | None:
    """Why `who` may not submit to `queue` (or one of its parents), or None."""
    if who.admin:
        return None
    for name in svc.scheduler.queues.path(queue) if svc.scheduler.queues.has(queue) else ():
        acl = svc.config.queue_acl(name)
        if acl is None:
            continue
        users, groups = acl
        if who.user in users or any(group_name(g) in groups for g in who.groups):
            continue
        allowed = [*(f"user {u}" for u in sorted(users)), *(f"group {g}" for g in sorted(groups))]
        return (
            f"queue {name!r} accepts jobs only from {', '.join(allowed) or 'admins'}; "
            f"{who.user} is not among them"
        )
    return None


def may_ask_priority(svc: Service, who: Caller, queue: str, priority: int) -> str | None:
    """Why `who` may not ask for `priority` in `queue`, or None: above the queue's
    `max_priority` (0 unless an admin set one), only admins may, as a higher priority evicts
    other users' work there."""
    if who.admin:
        return None
    queues = svc.scheduler.queues
    cap = svc.config.max_priority(queues.path(queue) if queues.has(queue) else (queue,))
    if priority <= cap:
        return None
    return (
        f"priority {priority} is above the {cap} that queue {queue!r} lets users ask for "
        "(its max_priority: a higher priority evicts other users' jobs, so an admin sets it)"
    )

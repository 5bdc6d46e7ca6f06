"""Tokens and the audit log (`/v1/tokens`, `/v1/audit`).

Admins create tokens for anyone and read the audit log; a user lists and revokes their own
tokens (their account's: made for their name and, where the token kept one, their uid). A
token's secret is in the answer that creates it and nowhere else, ever (the store keeps its
hash: `service/tokens.py`). Every create and revoke goes to the audit log.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from aisched.service import tokens
from aisched.service.app import Service
from aisched.service.auth import CallerDep, require_admin
from aisched.service.defaults import MAX_LIST_LIMIT
from aisched.service.identity import Caller, same_account
from aisched.service.routes.common import audit, problem
from aisched.service.schemas import AuditOut, TokenCreated, TokenIn, TokenOut

MAX_EXPIRY_S = 10 * 365 * 86400.0


def tokens_router(svc: Service) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/tokens", status_code=201, response_model=TokenCreated)
    def create_token(body: TokenIn, who: CallerDep) -> Response:
        """A new token for `user`; its secret is in this answer and nowhere else, ever."""
        require_admin(who, "create tokens")
        now = time.time()
        if body.expires_in_s is not None and not 0 < body.expires_in_s <= MAX_EXPIRY_S:
            # NaN and infinity too: stored, they never expire and break every listing after.
            return problem(
                422,
                "invalid request",
                [f"expires_in_s: must be above 0 and at most {MAX_EXPIRY_S:.0f} (10 years), "
                 f"got {body.expires_in_s}; leave it out for a token that does not expire"],
            )  # fmt: skip
        expires = None if body.expires_in_s is None else now + body.expires_in_s
        secret, row = tokens.create(
            svc.store,
            body.user,
            admin=body.admin,
            created_by=who.user,
            now=now,
            expires_at=expires,
            note=body.note,
            read_only=body.read_only,
        )
        audit(
            svc,
            who,
            "token create",
            f"token {row['id']}",
            body.user,
            ", ".join(w for w, on in (("admin", body.admin), ("read-only", body.read_only)) if on),
        )
        out = TokenCreated(**_token_out(row).model_dump(), token=secret)
        return JSONResponse(status_code=201, content=out.model_dump())

    @router.get("/v1/tokens", response_model=list[TokenOut])
    def list_tokens(who: CallerDep) -> Response:
        with svc.store.read() as tx:
            rows = tx.list_tokens(None if who.admin else who.user)
        if not who.admin:
            rows = [r for r in rows if _of(who, r)]
        return JSONResponse([_token_out(r).model_dump() for r in rows])

    @router.post("/v1/tokens/{token_id}/revoke", response_model=TokenOut)
    def revoke_token(token_id: str, who: CallerDep) -> Response:
        with svc.store.read() as tx:
            mine = [r for r in tx.list_tokens(who.user) if r["id"] == token_id and _of(who, r)]
        if not who.admin and not mine:
            raise HTTPException(403, "only admins may revoke another account's token")
        with svc.store.tx() as tx:
            row = tx.revoke_token(token_id, time.time())
        if row is None:
            return problem(404, f"no token {token_id}")
        audit(svc, who, "token revoke", f"token {token_id}", row["user"])
        return JSONResponse(_token_out(row).model_dump())

    @router.get("/v1/audit", response_model=list[AuditOut])
    def audit_log(
        who: CallerDep, limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 1000
    ) -> Response:
        require_admin(who, "read the audit log")
        with svc.store.read() as tx:
            rows = tx.audit_log(limit)
        return JSONResponse([AuditOut(**r).model_dump() for r in rows])

    return router


def _of(who: Caller, row: dict[str, Any]) -> bool:
    """Whether the token `row` is `who`'s: made for their name and, where it kept the uid the
    name had then, for their uid (a name deleted and given to another account lists and
    revokes none of the old account's tokens)."""
    return same_account(who.user, who.uid, row["user"], row.get("uid"))


def _token_out(row: dict[str, Any]) -> TokenOut:
    return TokenOut(
        id=row["id"],
        user=row["user"],
        admin=bool(row["admin"]),
        read_only=bool(row.get("read_only")),
        created_at=row["created_at"],
        created_by=row["created_by"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        note=row["note"],
    )

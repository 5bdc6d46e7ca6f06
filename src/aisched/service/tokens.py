"""API bearer tokens: made by an admin, shown once, kept only as a hash.

A token is `ais_` + 32 random bytes (urlsafe base64) from `secrets`. At rest only its SHA-256
is stored: the secret has 256 bits of entropy, so a slow password hash (argon2, bcrypt) would
add cost to every request and no protection; a database that leaks gives no usable token.
Lookups are by digest, so no secret is ever compared byte by byte in Python.

The dashboard's cookie is not the token: a browser sends the cookies of 127.0.0.1 to every
port of it, so to whatever page another local user serves there, who could then send the
token itself and act as its user. The cookie names the token and carries an HMAC keyed with
the secret (`dashboard_cookie`); the store keeps only that MAC's SHA-256 (`cookie_digest`,
written when the token is made, or at a login for a token older than it), so a leaked
database yields no usable cookie either. (Its MAC used to be keyed with the token's digest,
which the database holds.) The cookie stands only for the dashboard's reads
(`service/auth.py`) and is no token anywhere else.

A token names its user, and an account is a uid: the uid the name had when the token was made
is kept in its row (`uid`), and the token is refused once the name names another uid or
none (the account deleted, its name given to someone else). A token
made for a name with no account on this machine, or before uids were kept, has none and is not
bound.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from aisched.service.identity import local_uid
from aisched.store.db import Row, Store

PREFIX = "ais_"
COOKIE_PREFIX = "aisd_"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    user: str
    admin: bool
    read_only: bool = False
    uid: int | None = None  # its user's uid when it was made (None: not known, not bound)


class TokenRefused(Exception):
    """The bearer token is unknown, revoked or expired (the message does not say which), or
    its user's name names another account now (the message says so: `TokenAccountGone`)."""


class TokenAccountGone(TokenRefused):
    """The token's user name names another uid than when the token was made, or none."""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def create(
    store: Store,
    user: str,
    *,
    admin: bool,
    created_by: str,
    now: float,
    expires_at: float | None = None,
    note: str | None = None,
    read_only: bool = False,
) -> tuple[str, Row]:
    """A new token for `user`, bound to the uid the name has here now (if any): returns (the
    secret, shown once; its stored row)."""
    secret = PREFIX + secrets.token_urlsafe(32)
    row: Row = {
        "id": secrets.token_hex(4),
        "digest": digest(secret),
        "cookie_digest": digest(_cookie_mac(secret)),
        "user": user,
        "admin": int(admin),
        "read_only": int(read_only),
        "created_at": now,
        "created_by": created_by,
        "expires_at": expires_at,
        "revoked_at": None,
        "note": note,
        "uid": local_uid(user),
    }
    with store.tx() as tx:
        tx.add_token(row)
    return secret, row


def verify(store: Store, secret: str, now: float) -> TokenInfo:
    if not secret.startswith(PREFIX) or len(secret) > 256:
        raise TokenRefused
    with store.read() as tx:
        row = tx.token_by_digest(digest(secret))
    return _live(row, now)


def dashboard_cookie(secret: str, token_id: str) -> str:
    """What the dashboard's cookie holds for the token `secret` (of id `token_id`)."""
    return f"{COOKIE_PREFIX}{token_id}.{_cookie_mac(secret)}"


def login_cookie(store: Store, secret: str, token_id: str) -> str:
    """`dashboard_cookie`, for a login with the verified token `secret`: its digest is
    recorded for a token made before the store kept one (until then its cookies are
    refused)."""
    mac = _cookie_mac(secret)
    with store.read() as tx:
        row = tx.token_by_id(token_id)
    if row is not None and row.get("cookie_digest") is None:  # a write only where needed
        with store.tx() as tx:
            tx.set_cookie_digest(token_id, digest(mac))
    return f"{COOKIE_PREFIX}{token_id}.{mac}"


def verify_cookie(store: Store, cookie: str, now: float) -> TokenInfo:
    """The token a dashboard cookie stands for, if it is still live."""
    token_id, _, mac = cookie.removeprefix(COOKIE_PREFIX).partition(".")
    if not cookie.startswith(COOKIE_PREFIX) or len(cookie) > 256 or not mac:
        raise TokenRefused
    with store.read() as tx:
        row = tx.token_by_id(token_id)
    if row is None or row.get("cookie_digest") is None:
        raise TokenRefused
    if not hmac.compare_digest(row["cookie_digest"], digest(mac)):
        raise TokenRefused
    return _live(row, now)


def _cookie_mac(secret: str) -> str:
    """Keyed with the secret, which the service sees only when a token is made or sent, never
    with anything it stores."""
    key = secret.encode("utf-8", "surrogateescape")
    return hmac.new(key, b"aisched dashboard cookie", "sha256").hexdigest()


def _live(row: Row | None, now: float) -> TokenInfo:
    if row is None or row["revoked_at"] is not None:
        raise TokenRefused
    uid = row.get("uid")
    if row["expires_at"] is not None and row["expires_at"] <= now:
        raise TokenRefused
    if uid is not None and (now_uid := local_uid(row["user"])) != uid:
        now_is = "has no account here" if now_uid is None else f"is uid {now_uid}"
        raise TokenAccountGone(
            f"token {row['id']} was made for {row['user']} as uid {uid}, and {row['user']} "
            f"{now_is} now (the account was deleted or its name given to another): it is "
            "refused; an admin may make a new one"
        )
    return TokenInfo(
        id=row["id"],
        user=row["user"],
        admin=bool(row["admin"]),
        read_only=bool(row.get("read_only")),
        uid=uid,
    )

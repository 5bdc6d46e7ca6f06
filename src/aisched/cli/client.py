"""The CLI's HTTP client for the service's REST API.

Where the service is: `--server`, else `$AISCHED_SERVER` (either `unix:PATH` or
`http(s)://HOST:PORT`), else what a local `aisched up` of this user wrote to
`$AISCHED_HOME/server.json`, else the system service's socket (`/run/aisched/aisched.sock`),
else the default loopback port. On a Unix socket the service knows who we are from the kernel;
over TCP we send a token: `$AISCHED_TOKEN`, else the file `$AISCHED_TOKEN_FILE` or
`$AISCHED_HOME/token`, which must be private (0600). A server on this machine is sent nothing
unless root or this user runs it, checked on each connection before it is used
(`owned_connections`): any local user may listen on a free port (the default one too, while
the system service is down), and would get the token, the commands and the `--env` values
sent to it. A server on another machine is reached through the proxy the environment names,
if any, as httpx would (`owned_connections.environment_proxy`). Every failure becomes a
`CLIError` with the service's own message (its `Problem` lines), never a traceback.

Several instances (docs/ha.md): `--server` and `$AISCHED_SERVER` take a comma-separated list.
A request goes to the first that answers (the next is tried when one cannot be reached), and
a change that a standby refuses (421, naming the leader) is sent again, once, to the leader it
names: only a leader acts on changes, and every instance reads. While no leader can be reached
(a takeover under way), the request is asked again each second, for up to a minute.

A read past the caller's rate limit (429) waits the Retry-After it is given and is sent again,
a few times; a change is not (a submission, which carries an Idempotency-Key, is: see
`send_retrying`), and the limit's one line says when to try again.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from aisched.cli.errors import EXIT_FAILURE, CLIError, NotSent, answered
from aisched.cli.owned_connections import OwnerCheckedTransport, environment_proxy
from aisched.service.defaults import DEFAULT_PORT, SYSTEM_SOCKET, default_home

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
UNIX = "unix:"
# A read refused by the service's rate limit (429) is sent again after its Retry-After, this
# many times, if it asks for no longer a wait than this; else the limit's own line is the error.
RATE_LIMIT_RETRIES = 3
RATE_LIMIT_MAX_WAIT_S = 30.0
# How long a request waits for a new leader while none can be reached: a standby takes over
# once the dead leader's lease runs out (lease_ttl, 8 s by default, and a poll).
TAKEOVER_WAIT_S = 60.0
TRUST_HINT = "a private CA is trusted with SSL_CERT_FILE=CA.pem (docs/security.md)"


def server_url(explicit: str | None) -> str:
    if explicit:
        return explicit.rstrip("/")
    env = os.environ.get("AISCHED_SERVER")
    if env:
        return env.rstrip("/")
    announced = default_home() / "server.json"
    try:
        url = json.loads(announced.read_text(encoding="utf-8"))["url"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    else:
        if not isinstance(url, str) or not url.startswith((UNIX, "http://", "https://")):
            raise CLIError(
                f"{announced}: its url {url!r} is no server's address (aisched up writes "
                "unix:PATH or http(s)://HOST:PORT there); remove the file, or give --server"
            )
        return url.rstrip("/")
    if SYSTEM_SOCKET.exists():
        return UNIX + str(SYSTEM_SOCKET)
    return DEFAULT_URL


def read_token() -> str | None:
    """The token to send over TCP: `$AISCHED_TOKEN`, else a private token file."""
    env = os.environ.get("AISCHED_TOKEN")
    if env:
        return _token(env.strip(), "AISCHED_TOKEN")
    named = os.environ.get("AISCHED_TOKEN_FILE")
    path = Path(named).expanduser() if named else default_home() / "token"
    try:
        st = path.stat()
    except OSError:
        if named:
            raise CLIError(f"AISCHED_TOKEN_FILE {path}: cannot read it") from None
        return None
    if not stat.S_ISREG(st.st_mode):
        raise CLIError(f"{path}: the token file is not a regular file")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise CLIError(
            f"{path}: the token file is readable by others; make it private: chmod 600 {path}"
        )
    try:
        return _token(path.read_text(encoding="utf-8").strip(), str(path)) or None
    except OSError as e:
        raise CLIError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path}: not UTF-8 text") from None


def _token(token: str, where: str) -> str:
    """A token as it may go in a header: printable ASCII, no spaces or line breaks."""
    if token and not all("!" <= c <= "~" for c in token):
        raise CLIError(
            f"{where}: not a token (a token is one word of printable ASCII, as "
            "`aisched token create` prints it)"
        )
    return token


def add_server_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        metavar="URL",
        help="the aisched service: unix:PATH or http(s)://HOST:PORT, or several, comma-"
        "separated (a standby's leader is followed; default: $AISCHED_SERVER, else the local "
        "`aisched up`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


class Client:
    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.servers = [u.strip().rstrip("/") for u in url.split(",") if u.strip()] or [url]
        self.timeout_s = timeout_s
        # Why each server tried for the last request could not be reached, in turn.
        self.unreached: dict[str, httpx.TransportError] = {}
        self._connect(self.servers[0])

    def _connect(self, url: str) -> None:
        self.url = url
        if url == UNIX:
            raise CLIError(f"--server {url}: give the socket's path after unix:")
        if url.startswith(UNIX):
            # The host is a placeholder: the transport goes to the socket.
            transport = OwnerCheckedTransport(url, uds=url[len(UNIX) :])
            self.http = httpx.Client(
                transport=transport, base_url="http://aisched", timeout=self.timeout_s
            )
        elif url.startswith(("http://", "https://")):
            token = read_token()
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            try:
                # Given a transport, httpx takes no proxy from the environment: the
                # transport goes through the one httpx would have taken, if any.
                self.http = httpx.Client(
                    transport=OwnerCheckedTransport(url, proxy=environment_proxy(url)),
                    base_url=url,
                    timeout=self.timeout_s,
                    headers=headers,
                )
            except httpx.InvalidURL as e:
                raise CLIError(f"--server {url}: not a valid URL: {e}") from None
        elif url.startswith("/"):
            raise CLIError(f"--server {url}: a socket is named unix:{url}")
        else:
            raise CLIError(f"--server {url}: expected unix:PATH or http(s)://HOST:PORT")

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request, to the first server that can be reached, and to the leader when a
        standby refuses a change (see the module docstring). While no leader can be reached
        (the one a standby names is gone, or no instance holds the lease), it is asked again
        each second until one is, for up to `TAKEOVER_WAIT_S`: a standby takes over once the
        lease runs out. A request that never reached a server is safe to send again."""
        deadline: float | None = None
        while True:
            r, gone = self._ask(method, path, **kwargs)
            if gone is None:
                return r
            if deadline is None:
                deadline = time.monotonic() + TAKEOVER_WAIT_S
                print(f"aisched: {gone}; waiting for a standby to take over", file=sys.stderr)
            elif time.monotonic() >= deadline:
                raise CLIError(
                    f"{gone}, and no instance took over within {TAKEOVER_WAIT_S:g} s "
                    "(their readiness, GET /v1/readyz, says why)",
                    EXIT_FAILURE,
                )
            time.sleep(1.0)

    def _ask(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, str | None]:
        """The answer of the first server that can be reached, or of the leader a standby
        names; with it, why no leader could be reached (or None when one answered)."""
        first = self.servers.index(self.url) if self.url in self.servers else 0
        order = self.servers[first:] + self.servers[:first]
        self.unreached = {}
        for k, url in enumerate(order):
            if url != self.url:
                self._connect(url)
            try:
                r = self.http.request(method, path, **kwargs)
            except httpx.TransportError as e:
                self.unreached[url] = e
                if k == len(order) - 1:
                    raise
                continue
            leader = _leader_named(r)
            if leader is None:
                if r.status_code == 503 and _no_leader(r):
                    return r, "no instance holds the lease"
                return r, None
            if leader == self.url:
                return r, None
            if url.startswith(UNIX) and read_token() is None:
                raise CLIError(
                    f"{url} is a standby: changes go to the leader at {leader}, which needs a "
                    "token over TCP (AISCHED_TOKEN or a token file: docs/security.md), or give "
                    "--server the leader's own socket",
                    2,
                )
            self._connect(leader)
            try:
                return self.http.request(method, path, **kwargs), None
            except httpx.ConnectError:  # never sent: the leader is gone
                self._connect(url)  # the next try asks the instances again, from this one
                return r, f"the leader {leader} cannot be reached"
            except httpx.TimeoutException as e:
                # Sent, and no answer: a leader paused (SIGSTOP, a frozen VM) or cut off, whose
                # lease a standby takes once it runs out. Asked again, from the instance that
                # named it, only if sending it twice does no harm.
                if not _safe_to_resend(method, path, kwargs):
                    raise CLIError(
                        f"the leader {leader} took the request and did not answer "
                        f"({e.__class__.__name__}): it may be paused or cut off, and the "
                        "change may or may not be made; see what it is now, then try again",
                        EXIT_FAILURE,
                    ) from None
                self._connect(url)
                return r, f"the leader {leader} does not answer ({e.__class__.__name__})"
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Client:
        return cls(server_url(getattr(args, "server", None)))

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._json(self._send(method, path, **kwargs))

    def _json(self, r: httpx.Response) -> Any:
        """The answer's JSON; an answer that has none is not from an aisched service."""
        try:
            body = r.json()
        except ValueError:
            raise CLIError(
                f"{self.url} answered {r.request.method} {r.request.url.path} with "
                f"{r.status_code} without JSON: it does not look like an aisched service "
                "(--server or AISCHED_SERVER choose another)",
                EXIT_FAILURE,
            ) from None
        answered(self.url, r.request.method, r.request.url.path)
        return body

    def text(self, path: str, params: dict[str, Any]) -> str:
        return self._send("GET", path, params=params).text

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = self._request(method, path, **kwargs)
            for _ in range(RATE_LIMIT_RETRIES if method in ("GET", "HEAD") else 0):
                wait = _retry_after(r)
                if wait is None:
                    break
                time.sleep(wait)  # a read is safe to repeat; the limit was hit before any work
                r = self._request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        if r.status_code >= 400:
            raise _refused(r, self.url)
        if r.is_redirect:  # aisched redirects nothing it is asked by its own commands
            raise CLIError(
                f"{self.url} answered {r.status_code} (a redirect to "
                f"{r.headers.get('location', 'nowhere')}): it does not look like an aisched "
                "service (--server or AISCHED_SERVER choose another)",
                EXIT_FAILURE,
            )
        return r

    def _unreachable(self, e: httpx.TransportError) -> CLIError:
        unreached = self.unreached
        if len(unreached) > 1:  # each instance, with its reason: the last's alone misleads
            why = "; ".join(f"{url} ({_why_unreached(err)})" for url, err in unreached.items())
            distrusted = any(_tls_failure(err) is not None for err in unreached.values())
            return CLIError(
                f"cannot reach any instance of the aisched service: {why}; "
                + (TRUST_HINT if distrusted else "is `aisched up` running?"),
                EXIT_FAILURE,
            )
        tls = _tls_failure(e)
        if tls is not None:  # up, but not trusted: "is it running?" would send the user astray
            return CLIError(
                f"cannot reach the aisched service at {self.url}: its TLS certificate was "
                f"refused ({tls}); {TRUST_HINT}",
                EXIT_FAILURE,
            )
        return CLIError(
            f"cannot reach the aisched service at {self.url} ({e.__class__.__name__}); "
            "is `aisched up` running? (--server or AISCHED_SERVER choose another)",
            EXIT_FAILURE,
        )

    def send_retrying(
        self, method: str, path: str, *, tries: int, timeout_s: float, **kwargs: Any
    ) -> Any:
        """A request that is safe to repeat (it carries an Idempotency-Key): a time-out or a
        503 (the service cannot store it now) is tried again, up to `tries` times, waiting
        1, 2, 4... s in between, and a rate limit's 429 after its Retry-After; any other
        answer is final, as in `request`."""
        sent = False  # some try may have reached the service
        for attempt in range(tries):
            last = attempt == tries - 1
            try:
                r = self._request(method, path, timeout=timeout_s, **kwargs)
            except httpx.TimeoutException as e:
                sent |= not isinstance(e, httpx.ConnectTimeout)
                if last:
                    raise CLIError(
                        f"the aisched service at {self.url} did not answer within "
                        f"{timeout_s:g} s, {tries} times; its readiness (GET /v1/readyz) says why",
                        EXIT_FAILURE,
                    ) from None
            except httpx.TransportError as e:
                try:
                    return self.request(method, path, **kwargs)  # not reached: say so, as usual
                except CLIError as err:
                    if sent or not isinstance(e, httpx.ConnectError):
                        raise
                    raise NotSent(str(err), err.status) from None
            else:
                sent = True
                wait = _retry_after(r)
                if wait is not None and not last:
                    time.sleep(wait)  # refused before any work, and the key makes it safe
                    continue
                if r.status_code != 503 or last:
                    if r.status_code >= 400:
                        raise _refused(r, self.url)
                    return self._json(r)
            time.sleep(min(2.0**attempt, 8.0))
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, path: str, params: dict[str, Any]) -> Iterator[str]:
        """The text of a streamed answer (a followed log) as it comes. Given several instances,
        a stream cut by the loss of one goes on from another (they read one data directory),
        past what was already given: a followed log is read again from its attempt's start."""
        given = 0  # characters yielded so far
        lost_at: float | None = None
        while True:
            skip = given
            try:
                for chunk in self._stream_once(path, params):
                    lost_at = None
                    if skip >= len(chunk):
                        skip -= len(chunk)
                        continue
                    chunk, skip = chunk[skip:], 0
                    given += len(chunk)
                    yield chunk
                return
            except httpx.TransportError as e:
                lost = f"lost the aisched service at {self.url} ({_why_unreached(e)})"
                if len(self.servers) < 2:
                    raise (
                        self._unreachable(e) if not given else CLIError(lost, EXIT_FAILURE)
                    ) from None
                if lost_at is None:
                    lost_at = time.monotonic()
                    print(f"aisched: {lost}; going on with another instance", file=sys.stderr)
                elif time.monotonic() - lost_at > TAKEOVER_WAIT_S:
                    raise CLIError(lost, EXIT_FAILURE) from None
                time.sleep(1.0)
                try:
                    self._ask("GET", "/v1/healthz")  # on to the first instance that answers
                except httpx.TransportError:
                    continue

    def _stream_once(self, path: str, params: dict[str, Any]) -> Iterator[str]:
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            with self.http.stream("GET", path, params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    wait = _retry_after(r) if attempt < RATE_LIMIT_RETRIES else None
                    if wait is not None:
                        time.sleep(wait)
                        continue
                    raise _refused(r, self.url)
                yield from r.iter_text()
                return


# Changes that leave the same state when made twice: a second cancel of a job finds it
# cancelled (or ending) and changes nothing.
_IDEMPOTENT_CHANGES = ("/cancel",)


def _safe_to_resend(method: str, path: str, kwargs: dict[str, Any]) -> bool:
    """Whether a request whose answer never came may be sent again: a read, a change that is
    the same made twice, or one that carries an Idempotency-Key (a submission)."""
    if method in ("GET", "HEAD", "PUT", "DELETE"):
        return True
    headers = {k.lower() for k in (kwargs.get("headers") or {})}
    return "idempotency-key" in headers or path.endswith(_IDEMPOTENT_CHANGES)


def _why_unreached(e: httpx.TransportError) -> str:
    """Why a server could not be reached, in a few words: its certificate's refusal and why,
    else the kind of failure."""
    tls = _tls_failure(e)
    return e.__class__.__name__ if tls is None else f"its TLS certificate was refused: {tls}"


def _tls_failure(e: BaseException) -> str | None:
    """Why the TLS handshake behind `e` failed (the certificate's verification above all), or
    None when `e` is no TLS failure. httpx keeps the `ssl` error as the cause of its own."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {seen.verify_message}"
        if isinstance(seen, ssl.SSLError):
            return seen.reason or str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def _retry_after(r: httpx.Response) -> float | None:
    """The seconds a rate limit's 429 asks us to wait, or None for any other answer and for a
    wait longer than we would sit through (its line then says when to try again). Only the
    rate limit's 429 carries Retry-After; a user's job limit's does not, and waiting would not
    help it."""
    if r.status_code != 429:
        return None
    try:
        wait = max(float(r.headers["retry-after"]), 0.0)
    except (KeyError, ValueError):
        return None
    return wait if wait <= RATE_LIMIT_MAX_WAIT_S else None


def _leader_named(r: httpx.Response) -> str | None:
    """The leader a standby's 421 names (an http(s) URL), else None."""
    if r.status_code != 421:
        return None
    try:
        leader = r.json().get("leader")
    except (ValueError, AttributeError):
        return None
    if isinstance(leader, str) and leader.startswith(("http://", "https://")):
        return leader.rstrip("/")
    return None


def _no_leader(r: httpx.Response) -> bool:
    """A standby's 503 while no instance holds a live lease (`leader: ""`)."""
    try:
        return bool(r.json().get("leader") == "")
    except (ValueError, AttributeError):
        return False


def _refused(r: httpx.Response, server: str) -> CLIError:
    """The CLIError for an answer of 400 or more: the service's problem text, exit status 2 (or
    1 for a 5xx); an answer without JSON is no aisched service's: status 1, naming `server`,
    the endpoint and the answer's first line."""
    try:
        body = r.json()
    except ValueError:
        first = (r.text.strip().splitlines() or [""])[0][:200]
        return CLIError(
            f"{server} answered {r.request.method} {r.request.url.path} with {r.status_code} "
            f"without JSON ({first!r}): it does not look like an aisched service (--server or "
            "AISCHED_SERVER choose another)",
            EXIT_FAILURE,
        )
    return CLIError(
        _problem_text(body, r.status_code),
        EXIT_FAILURE if r.status_code >= 500 else 2,
        kept_nothing=r.headers.get("aisched-kept") == "nothing",
    )


def _problem_text(body: Any, status: int) -> str:
    if isinstance(body, dict) and "error" in body:
        lines = [str(body["error"])]
        problems = body.get("problems")
        if isinstance(problems, list):  # else not aisched's: its error alone
            lines.extend(str(p) for p in problems)
        return "\n".join(lines)
    return f"the service answered {status}: {body}"

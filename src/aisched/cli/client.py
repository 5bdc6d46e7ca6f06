"""The CLI's HTTP client for the service's REST API.

Where the service is: `--server URL`, else `$AISCHED_SERVER`, else the address a local
`aisched up` wrote to `$AISCHED_HOME/server.json`, else the default loopback port. Every failure
becomes a `CLIError` with the service's own message (its `Problem` lines), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx

from aisched.cli.errors import EXIT_FAILURE, CLIError
from aisched.service.defaults import DEFAULT_PORT, default_home

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def server_url(explicit: str | None) -> str:
    if explicit:
        return explicit.rstrip("/")
    env = os.environ.get("AISCHED_SERVER")
    if env:
        return env.rstrip("/")
    try:
        data = json.loads((default_home() / "server.json").read_text(encoding="utf-8"))
        return str(data["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_URL


def add_server_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        metavar="URL",
        help="the aisched service (default: $AISCHED_SERVER, else the local `aisched up`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


class Client:
    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=timeout_s)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Client:
        return cls(server_url(getattr(args, "server", None)))

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def text(self, path: str, params: dict[str, Any]) -> str:
        return self._send("GET", path, params=params).text

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise CLIError(
                f"cannot reach the aisched service at {self.url} ({e.__class__.__name__}); "
                "is `aisched up` running? (--server or AISCHED_SERVER choose another)",
                EXIT_FAILURE,
            ) from None
        if r.status_code >= 400:
            raise CLIError(_problem_text(r), EXIT_FAILURE if r.status_code >= 500 else 2)
        return r

    def send_retrying(
        self, method: str, path: str, *, tries: int, timeout_s: float, **kwargs: Any
    ) -> Any:
        """A request that is safe to repeat (it carries an Idempotency-Key): a time-out or a
        503 (the service cannot store it now) is tried again, up to `tries` times, waiting
        1, 2, 4... s in between; any other answer is final, as in `request`."""
        for attempt in range(tries):
            last = attempt == tries - 1
            try:
                r = self.http.request(method, path, timeout=timeout_s, **kwargs)
            except httpx.TimeoutException:
                if last:
                    raise CLIError(
                        f"the aisched service at {self.url} did not answer within "
                        f"{timeout_s:g} s, {tries} times; see `curl {self.url}/v1/readyz`",
                        EXIT_FAILURE,
                    ) from None
            except httpx.TransportError:
                return self.request(method, path, **kwargs)  # not reached: say so, as usual
            else:
                if r.status_code != 503 or last:
                    if r.status_code >= 400:
                        raise CLIError(
                            _problem_text(r), EXIT_FAILURE if r.status_code >= 500 else 2
                        )
                    return r.json()
            time.sleep(min(2.0**attempt, 8.0))
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, path: str, params: dict[str, Any]) -> Iterator[str]:
        try:
            with self.http.stream("GET", path, params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise CLIError(_problem_text(r))
                yield from r.iter_text()
        except httpx.TransportError as e:
            raise CLIError(
                f"lost the aisched service at {self.url} ({e.__class__.__name__})", EXIT_FAILURE
            ) from None


def _problem_text(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return f"the service answered {r.status_code}: {r.text[:500]}"
    if isinstance(body, dict) and "error" in body:
        lines = [str(body["error"])]
        lines.extend(str(p) for p in body.get("problems") or [])
        return "\n".join(lines)
    return f"the service answered {r.status_code}: {body}"

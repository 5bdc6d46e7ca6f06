"""Limits on what a request may cost the service, applied before a handler sees it.

- `BodyLimit` (ASGI middleware): a body over `max_bytes` is answered 413 without being read
  whole. A Content-Length over the limit is refused before any of the body is read; a chunked
  body is counted while it streams and refused the moment it passes the limit. A client that
  stalls for `read_timeout_s` in the middle of a body gets 408.
- `check_depth`: JSON nested deeper than `MAX_DEPTH` is refused (a 422 from the handler)
  before the parser recurses into it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_DEPTH = 64


class _TooLarge(Exception):
    pass


class _Stalled(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and (length < 0 or length > self.max_bytes):
            await problem_response(
                send, 413, f"the request body is larger than {self.max_bytes} bytes"
            )
            return
        seen = 0
        started = False
        body_read = False

        async def limited_receive() -> Message:
            nonlocal seen, body_read
            if body_read:
                # What comes now is the client leaving, which a streamed answer (`logs -f`)
                # waits for as long as it streams: no stall to time out (it cut every
                # followed log at 30 s).
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), self.read_timeout_s)
            except TimeoutError:
                raise _Stalled from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
                body_read = not msg.get("more_body", False)
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await problem_response(
                    send, 413, f"the request body is larger than {self.max_bytes} bytes"
                )
        except _Stalled:
            if not started:
                await problem_response(
                    send, 408, f"the request body stalled for {self.read_timeout_s:g} s"
                )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


async def problem_response(send: Send, status: int, error: str) -> None:
    """A Problem document sent as the whole answer, by a middleware, before any of another."""
    body = json.dumps({"error": error, "problems": []}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-content-type-options", b"nosniff"),  # outside NoSniff too (hosts)
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def check_depth(data: bytes | str, max_depth: int = MAX_DEPTH) -> str | None:
    """Why `data` (JSON text) nests too deep, saying where (line and column of the first
    bracket past the bound), or None. One pass over the text, skipping strings, so it costs
    less than the parse it protects."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    depth = 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                line = text.count("\n", 0, i) + 1
                column = i - text.rfind("\n", 0, i)
                return f"nested deeper than {max_depth} levels at line {line}, column {column}"
        elif ch in "]}":
            depth -= 1
    return None

"""`limits.BodyLimit`'s stall timeout is for a body that stops arriving, not for a client that
stays: once the body is read, a streamed answer (`aisched logs -f`) waits for the client to
leave as long as it streams. The timeout cut every followed log at 30 s."""

from __future__ import annotations

import asyncio
from typing import Any

from aisched.service.limits import BodyLimit, Message

SCOPE = {"type": "http", "headers": []}


def _client(first_after_s: float, leave_after_s: float) -> Any:
    """An ASGI `receive`: the (empty) body after `first_after_s`, then the client's leaving
    after `leave_after_s` more."""
    said: list[Message] = []

    async def receive() -> Message:
        if not said:
            await asyncio.sleep(first_after_s)
            said.append({"type": "http.request", "body": b"", "more_body": False})
            return said[-1]
        await asyncio.sleep(leave_after_s)
        return {"type": "http.disconnect"}

    return receive


async def _streaming_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()  # the body
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"line\n", "more_body": True})
    assert (await receive())["type"] == "http.disconnect"
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _served(first_after_s: float, leave_after_s: float) -> list[Message]:
    sent: list[Message] = []

    async def send(msg: Message) -> None:
        sent.append(msg)

    limit = BodyLimit(_streaming_app, 100, read_timeout_s=0.1)
    asyncio.run(limit(SCOPE, _client(first_after_s, leave_after_s), send))
    return sent


def test_a_streamed_answer_waits_past_the_stall_timeout_for_the_client_to_leave() -> None:
    sent = _served(0.0, 0.3)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [200]
    assert [m["body"] for m in sent if m["type"] == "http.response.body"] == [b"line\n", b""]


def test_a_body_that_stalls_is_still_refused() -> None:
    sent = _served(0.3, 0.0)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [408]

"""Headers every answer of the service carries, whichever part of it answers.

`X-Content-Type-Options: nosniff` on every response: a browser takes each answer for what its
Content-Type says (a job's log served as text is never run as a script or a page, whatever it
holds). Added by an ASGI middleware around the whole app, so the answers of the other
middlewares (413, 408, 421, 429) carry it too. The dashboard's HTML pages add their own
(`dashboard._page`: the Content-Security-Policy, Referrer-Policy and frame options).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOSNIFF = (b"x-content-type-options", b"nosniff")


class NoSniff:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_nosniff(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                headers = list(msg.get("headers", ()))
                if not any(bytes(k).lower() == NOSNIFF[0] for k, _ in headers):
                    msg = {**msg, "headers": [*headers, NOSNIFF]}
            await send(msg)

        await self.app(scope, receive, send_nosniff)

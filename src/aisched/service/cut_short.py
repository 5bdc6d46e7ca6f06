"""Requests cut short by the service's stop: answered with a Problem, not uvicorn's bare 500.

Past the stop's grace, uvicorn cancels the requests still running (a submission waiting on a
locked store, say), and answers each that has sent nothing with a plain-text 500, which the CLI
takes for a server that is not aisched. This middleware, the outermost, answers them 503 with
what is known: the request did not finish, and a submission may not be stored; sent again with
the same Idempotency-Key once the service is back, it gives the job if it was, else makes it.
"""

from __future__ import annotations

import asyncio

from aisched.service.limits import ASGIApp, Message, Receive, Scope, Send, problem_response

CUT_SHORT = (
    "the service stopped before it finished this request: what it asked for may not be done "
    "(a submission may not be stored); send it again once the service is back (a submission "
    "with the same Idempotency-Key gives the job it made, if it made one)"
)


class AnswerWhenCutShort:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if started:
                raise
            await problem_response(send, 503, CUT_SHORT)

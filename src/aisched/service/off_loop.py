"""A request's blocking work, off the event loop: one worker thread at a time per caller.

Reading a submission is pure-Python work (YAML, validation) and file lookups as the submitter
(a child process each). On the event loop, one 1 MiB job file of tiny nested lists took 13 s
to parse, and every other user's request, the probes' too, waited for it. In a worker thread
the loop answers the others meanwhile; one at a time per caller, a caller's flood of such
requests waits on itself instead of taking every worker thread. The thread is not abandoned
when its client goes away, so a caller never holds more than one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


class OnePerCaller:
    """`run(caller, fn)`: `fn()` in a worker thread, after that caller's earlier ones."""

    def __init__(self) -> None:
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # caller: (lock, requests)

    async def run(self, caller: str, fn: Callable[[], T]) -> T:
        lock, n = self._turns.get(caller, (asyncio.Lock(), 0))
        self._turns[caller] = (lock, n + 1)
        try:
            async with lock:
                return await run_in_threadpool(fn)
        finally:
            lock, n = self._turns[caller]
            if n == 1:
                del self._turns[caller]
            else:
                self._turns[caller] = (lock, n - 1)

"""`OnePerCaller`: a caller's blocking work runs in a thread, one at a time per caller."""

from __future__ import annotations

import asyncio
import threading

from aisched.service.off_loop import OnePerCaller


def test_one_callers_work_waits_on_itself_and_another_callers_does_not() -> None:
    turns = OnePerCaller()
    release = threading.Event()
    running: list[str] = []

    def work(name: str) -> str:
        running.append(name)
        release.wait(10)
        return name

    async def scenario() -> list[str]:
        first = asyncio.create_task(turns.run("alice", lambda: work("alice-1")))
        second = asyncio.create_task(turns.run("alice", lambda: work("alice-2")))
        other = asyncio.create_task(turns.run("bob", lambda: work("bob-1")))
        while len(running) < 2:  # the loop answers meanwhile: it is not blocked by the work
            await asyncio.sleep(0.01)
        seen = sorted(running)
        release.set()
        assert await asyncio.gather(first, second, other) == ["alice-1", "alice-2", "bob-1"]
        return seen

    # alice's second waits for her first; bob's runs beside it.
    assert asyncio.run(scenario()) == ["alice-1", "bob-1"]
    assert turns._turns == {}  # nothing kept for callers with nothing running


def test_an_error_is_raised_to_its_caller_and_frees_the_turn() -> None:
    turns = OnePerCaller()

    def fail() -> None:
        raise ValueError("bad")

    async def scenario() -> str:
        try:
            await turns.run("alice", fail)
        except ValueError as e:
            return str(e) + " " + await turns.run("alice", lambda: "then fine")
        return "no error"

    assert asyncio.run(scenario()) == "bad then fine"

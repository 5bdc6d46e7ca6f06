"""A request waiting for the loop's answer (`admission.until_stored`) is told at once when
the loop has ended (a deposed leader's, a stopping service's), and waits while the loop has
not started yet (a new leader recovering): a cancel sent then was answered "the service is
stopping" though the loop answered it a moment later."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest
from world import World, make_scheduler

from aisched.service.admission import LoopEnded, until_stored


def test_a_loop_not_yet_started_has_not_ended_and_a_stopped_one_has(w: World) -> None:
    sched = make_scheduler(w.store, w.fx, w.clock, w.home)
    assert not sched.ended()  # recovering: commands wait for it
    sched.start()
    assert not sched.ended()
    sched.shutdown()
    assert sched.ended()


def test_the_wait_goes_on_while_the_loop_has_not_ended_and_stops_once_it_has() -> None:
    answered: Future[str] = Future()
    threading.Timer(0.4, answered.set_result, ("stored",)).start()
    got = asyncio.run(until_stored(answered, lambda: False, loop_ended=lambda: False))
    assert got == "stored"
    never: Future[str] = Future()
    with pytest.raises(LoopEnded):
        asyncio.run(until_stored(never, lambda: False, loop_ended=lambda: True))
    done: Future[str] = Future()
    done.set_result("stored as it ended")
    assert asyncio.run(until_stored(done, lambda: False, loop_ended=lambda: True)) == (
        "stored as it ended"
    )

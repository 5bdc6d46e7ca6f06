"""The container engine's probe: a failure holds for a while, then a container task starts a
new probe in the background; a found engine is kept. The real engine's side is in
tests/e2e/test_containers.py (`test_an_engine_that_failed_its_first_probe_...`)."""

from __future__ import annotations

import threading

from aisched.executors.container import ContainersOff, Engine, EngineError
from aisched.executors.engine_probe import EngineProbe

PODMAN = Engine(name="podman", binary="/usr/bin/podman", notes=("container engine: podman",))


class Answers:
    """The probe's answers in turn (an EngineError to raise, or the engine), each one given
    only once the test releases it, so a probe in the background can be caught running."""

    def __init__(self, *answers: Engine | EngineError) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.release = threading.Event()
        self.release.set()

    def __call__(self) -> Engine:
        self.calls += 1
        self.release.wait(10)
        answer = self.answers.pop(0)
        if isinstance(answer, EngineError):
            raise answer
        return answer


def wait_done(probe: EngineProbe) -> None:
    """Until no probe runs in the background."""
    t = probe._probing
    if t is not None:
        t.join(10)
        assert not t.is_alive()


def test_a_failure_holds_then_a_container_task_starts_a_new_probe_in_the_background() -> None:
    now = [100.0]
    answers = Answers(EngineError("podman does not work here: no answer in 30s"), PODMAN)
    swept: list[Engine] = []
    probe = EngineProbe(answers, swept.append, reprobe_after_s=10, clock=lambda: now[0])

    assert probe.first() is None  # the start's probe, here and now
    assert probe.notes == (
        "container tasks cannot run: podman does not work here: no answer in 30s",
    )
    now[0] = 104.2
    assert probe.engine() == (
        "podman does not work here: no answer in 30s "
        "(probed again for a container task launched 6 s from now)"
    )
    assert answers.calls == 1

    now[0] = 110.0
    answers.release.clear()
    why = probe.engine()
    assert why == "podman does not work here: no answer in 30s (the engine is being probed again)"
    # A second task while it runs starts no second probe.
    assert probe.engine() == why
    answers.release.set()
    wait_done(probe)
    assert answers.calls == 2

    assert probe.engine() is PODMAN
    assert swept == [PODMAN]  # the old containers were swept before the engine was handed out
    assert probe.notes == ("container engine: podman",)
    assert probe.first() is PODMAN and answers.calls == 2


def test_a_probe_that_fails_again_holds_its_new_failure_from_its_own_end() -> None:
    now = [0.0]
    answers = Answers(EngineError("first"), EngineError("second"))
    probe = EngineProbe(answers, lambda e: None, reprobe_after_s=10, clock=lambda: now[0])
    probe.first()
    now[0] = 20.0
    probe.engine()
    wait_done(probe)
    assert probe.notes == ("container tasks cannot run: second",)
    now[0] = 25.0
    assert probe.engine() == "second (probed again for a container task launched 5 s from now)"
    assert answers.calls == 2


def test_a_probe_that_raises_a_bug_leaves_containers_off_and_says_so() -> None:
    def broken() -> Engine:
        raise KeyError("Host")

    probe = EngineProbe(broken, lambda e: None)
    assert probe.first() is None
    assert probe.notes == ("container tasks cannot run: KeyError('Host')",)


def test_the_first_probe_is_made_once_whoever_asks() -> None:
    answers = Answers(PODMAN)
    probe = EngineProbe(answers, lambda e: None)
    answers.release.clear()
    asked = [threading.Thread(target=probe.first) for _ in range(4)]
    for t in asked:
        t.start()
    answers.release.set()
    for t in asked:
        t.join(10)
    assert probe.engine() is PODMAN
    assert answers.calls == 1


def test_containers_turned_off_are_said_so_and_never_probed_again() -> None:
    # `container_runtime: none` was answered as a failed probe, "probed again" at each task.
    now = [100.0]
    answers = Answers(ContainersOff("container tasks are off on this node"), PODMAN)
    probe = EngineProbe(answers, lambda _: None, reprobe_after_s=10, clock=lambda: now[0])
    assert probe.first() is None
    now[0] = 500.0
    assert probe.engine() == "container tasks are off on this node"
    wait_done(probe)
    assert (probe.off, answers.calls) == (True, 1)

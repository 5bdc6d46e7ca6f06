"""Two cancels of one job applied in the same step of the loop: the first ends it, the second is
refused with 409 naming the state it ended in. The store still holds the job as it was until
the step's batch is stored, and the second was answered from there: 409 "has already ended
(pending)"."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from threading import Event

import httpx
from clients import client_for
from fastapi.testclient import TestClient

from aisched.executors.base import TaskExited
from aisched.model.cluster import Node
from aisched.service.app import Service
from aisched.testing.fakes import FakeExecutor, fake_node


class HeldExecutor(FakeExecutor):
    """Holds the loop, when asked, in the next step's poll: the commands queued meanwhile are
    all applied in the step after, together."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__(nodes)
        self.hold, self.holding, self.release = Event(), Event(), Event()

    def poll(self) -> list[TaskExited]:
        if self.hold.is_set():
            self.hold.clear()
            self.holding.set()
            self.release.wait(30)
        return super().poll()


@contextmanager
def one_step(svc: Service, fx: HeldExecutor, commands: int) -> Iterator[None]:
    """The requests made inside reach the loop as `commands` commands of one step."""
    fx.holding.clear()
    fx.release.clear()
    fx.hold.set()
    svc.scheduler.wake.set()
    assert fx.holding.wait(30), "the loop never polled"
    try:
        yield
        queued(svc, commands)
    finally:
        fx.release.set()


def queued(svc: Service, commands: int) -> None:
    """Wait until `commands` commands wait for the loop."""
    deadline = time.monotonic() + 30
    while svc.scheduler.commands.qsize() < commands:
        assert time.monotonic() < deadline, "the requests never reached the loop"
        time.sleep(0.01)


def wait(client: TestClient, job_id: str, state: str) -> None:
    deadline = time.monotonic() + 10
    while (got := client.get(f"/v1/jobs/{job_id}").json()["state"]) != state:
        assert time.monotonic() < deadline, f"job {job_id} is {got}, not {state}"
        time.sleep(0.02)


def answers(futures: list[Future[httpx.Response]]) -> list[tuple[int, dict[str, object]]]:
    return sorted((f.result(30).status_code, f.result(30).json()) for f in futures)


Post = Callable[..., httpx.Response]
OpenService = Callable[..., Service]  # the `open_service` fixture


def test_the_second_cancel_in_a_step_is_refused_as_already_ended(
    open_service: OpenService,
) -> None:
    fx = HeldExecutor([fake_node(gpus=4)])
    svc = open_service(fx)
    client = client_for(svc)
    big = client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 4}}).json()["id"]
    wait(client, big, "running")
    waiting = [
        client.post("/v1/jobs", json={"command": ["x"], "resources": {"gpus": 1}}).json()["id"]
        for _ in range(2)
    ]
    for job_id in waiting:
        wait(client, job_id, "pending")
    first, second = waiting
    ended = {"error": f"job {first} has already ended (cancelled)", "problems": []}

    # Two cancels of one pending job.
    posts: list[Post] = [client_for(svc).post, client_for(svc).post]
    with ThreadPoolExecutor(2) as pool, one_step(svc, fx, 2):
        sent = [pool.submit(post, f"/v1/jobs/{first}/cancel") for post in posts]
    assert answers(sent) == [(202, {"id": first, "state": "cancelled"}), (409, ended)]

    # A bulk cancel that takes the job, then its own cancel.
    ended = {"error": f"job {second} has already ended (cancelled)", "problems": []}
    with ThreadPoolExecutor(2) as pool, one_step(svc, fx, 2):
        bulk = pool.submit(posts[0], "/v1/jobs/cancel", json={"state": "pending"})
        queued(svc, 1)  # the bulk cancel first
        one = pool.submit(posts[1], f"/v1/jobs/{second}/cancel")
    assert bulk.result(30).json()["jobs"] == [{"id": second, "state": "cancelled"}]
    assert (one.result(30).status_code, one.result(30).json()) == (409, ended)

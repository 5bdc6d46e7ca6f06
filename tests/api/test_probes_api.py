"""The probes, and `/metrics` with its readiness, answer while every worker thread of the app
is taken.

A sync route (or a sync dependency) waits for one of anyio's worker threads, 40 in all; slow
store reads and large job files hold them. A liveness probe queued behind them got no answer,
and a supervisor killed a service that was only busy; a scrape got none either, and the graphs
went blank while the service was busiest.
"""

from __future__ import annotations

import threading

import anyio
import anyio.to_thread
import httpx
import pytest
from clients import token_for
from fastapi import FastAPI

from aisched.service.api import create_app
from aisched.service.app import Service
from aisched.service.identity import service_user

THREADS = 2  # the worker threads of this test's event loop, all held


async def probe_with_every_thread_held(
    app: FastAPI, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """GET `path` of `app` while blocked work holds every worker thread; fails as soon as the
    request waits for one (it would wait as long as the work blocks)."""
    limiter = anyio.to_thread.current_default_thread_limiter()  # this event loop's own
    limiter.total_tokens = THREADS
    release = threading.Event()
    answer: list[httpx.Response] = []

    async def probe() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://x", headers=headers
        ) as c:
            answer.append(await c.get(path))

    waited = False
    async with anyio.create_task_group() as tg:
        try:
            for _ in range(THREADS):
                tg.start_soon(anyio.to_thread.run_sync, release.wait)
            while limiter.borrowed_tokens < THREADS:
                await anyio.sleep(0.01)
            tg.start_soon(probe)
            while not answer and not waited:
                waited = limiter.statistics().tasks_waiting > 0
                await anyio.sleep(0.01)
        finally:
            release.set()  # the held threads end (a worker thread cannot be cancelled)
    assert not waited, f"{path} waited for a worker thread"
    return answer[0]


@pytest.mark.parametrize("path", ["/v1/healthz", "/v1/readyz"])
def test_a_probe_answers_while_every_worker_thread_is_held(svc: Service, path: str) -> None:
    r = anyio.run(probe_with_every_thread_held, create_app(svc), path)
    assert r.status_code == 200
    assert r.json()["ok" if path == "/v1/healthz" else "ready"] is True


def test_metrics_answer_while_every_worker_thread_is_held(svc: Service) -> None:
    token = token_for(svc, service_user(), admin=True)
    auth = {"Authorization": f"Bearer {token}"}
    r = anyio.run(probe_with_every_thread_held, create_app(svc), "/metrics", auth)
    assert r.status_code == 200
    assert "aisched_ready 1.0" in r.text.splitlines()
    r = anyio.run(probe_with_every_thread_held, create_app(svc), "/metrics")
    assert r.status_code == 401  # who asks is still settled first

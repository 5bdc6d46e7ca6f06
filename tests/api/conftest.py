"""The API tests' service: the real app, store and loop thread over the fake executor.

`client` talks to the app in process as an admin with a real token (made in the store, checked
by the app like any other); `client_as(user)` gives a client with a plain user's token."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clients import client_for
from fastapi.testclient import TestClient

from aisched.service.app import Service
from aisched.service.config import load_config
from aisched.testing.fakes import FakeExecutor, fake_node

OpenService = Callable[..., Service]


@pytest.fixture
def fx() -> FakeExecutor:
    return FakeExecutor([fake_node(gpus=4)])


@pytest.fixture
def open_service(tmp_path: Path, database_url: str | None) -> Iterator[OpenService]:
    """Start a service over an executor with extra config keys, on each store (ids sqlite,
    postgresql); closed after the test."""
    opened: list[Service] = []

    def start(executor: FakeExecutor, **extra: Any) -> Service:
        base = {"data_dir": str(tmp_path), "cycle_interval": "0.2s", "database": database_url}
        cfg = load_config(None, {**base, **extra})
        svc = Service.open(cfg, executor=executor)
        opened.append(svc)
        svc.start()
        return svc

    yield start
    for svc in reversed(opened):
        svc.close()


@pytest.fixture
def svc(open_service: OpenService, fx: FakeExecutor) -> Service:
    return open_service(fx)


@pytest.fixture
def client(svc: Service) -> TestClient:
    return client_for(svc)


@pytest.fixture
def client_as(svc: Service) -> Callable[[str], TestClient]:
    return lambda user: client_for(svc, user)

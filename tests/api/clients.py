"""The API tests' in-process clients, with real tokens (made in the service's store, checked
by the app like any other)."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from aisched.service import tokens
from aisched.service.api import create_app
from aisched.service.app import Service
from aisched.service.identity import service_user


def token_for(svc: Service, user: str, *, admin: bool = False) -> str:
    secret, _ = tokens.create(svc.store, user, admin=admin, created_by="test", now=time.time())
    return secret


def client_for(svc: Service, user: str | None = None, *, admin: bool = False) -> TestClient:
    """The app of `svc`, as `user` (default: the service's own user, an admin)."""
    if user is None:
        user, admin = service_user(), True
    token = token_for(svc, user, admin=admin)
    return TestClient(create_app(svc), headers={"Authorization": f"Bearer {token}"})

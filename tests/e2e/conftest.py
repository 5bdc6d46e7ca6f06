"""Each test gets its own service: its own data directory and port, 4 declared GPUs, 4 CPUs
and 8 GiB, so the whole flow runs on a machine without GPUs. Tasks outlive the service by
design (the next start adopts them), so teardown cancels every live job before stopping it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import browser  # noqa: F401 - the dashboard tests' Chromium
from harness import Service, local_service
from users import local_users  # noqa: F401 - the real local users' fixture


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with local_service(tmp_path) as svc:
        yield svc

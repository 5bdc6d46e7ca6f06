"""Each test gets its own service: its own data directory and port, 4 declared GPUs, 4 CPUs
and 8 GiB, so the whole flow runs on a machine without GPUs. Tasks outlive the service by
design (the next start adopts them), so teardown cancels every live job before stopping it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, cancel_all, free_port


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    work = tmp_path / "work"
    work.mkdir()
    svc = Service(
        tmp_path / "home", free_port(), work, ["--gpus", "4", "--cpus", "4", "--mem", "8G"]
    )
    svc.home.mkdir()
    svc.start()
    try:
        yield svc
    finally:
        cancel_all(svc)
        svc.stop()

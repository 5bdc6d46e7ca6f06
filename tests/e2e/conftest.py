"""Each test gets its own service: its own data directory and port, 4 declared GPUs, 4 CPUs
and 8 GiB, so the whole flow runs on a machine without GPUs. Tasks outlive the service by
design (the next start adopts them), so teardown cancels every live job before stopping it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Service, free_port, wait_for


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
        _cancel_all(svc)
        svc.stop()


def _cancel_all(svc: Service) -> None:
    if svc.proc is None or svc.proc.poll() is not None:
        try:
            svc.start()
        except AssertionError:
            return
    try:
        live = httpx.get(f"{svc.url}/v1/jobs", timeout=5).json()["jobs"]
        for j in live:
            httpx.post(f"{svc.url}/v1/jobs/{j['id']}/cancel", timeout=5)
        wait_for(
            "every job to end",
            lambda: not httpx.get(f"{svc.url}/v1/jobs", timeout=5).json()["jobs"],
            timeout_s=30,
        )
    except (httpx.HTTPError, AssertionError):
        pass

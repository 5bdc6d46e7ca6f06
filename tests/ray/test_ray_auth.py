"""Ray's token authentication on a shared cluster: a client without the token is refused by
the cluster these tests run (as a shared one must be started), and `aisched up` as root
refuses a cluster that takes such clients, since any local user reaching it could run
commands as root through it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import free_port
from ray_harness import RayCluster

from aisched.executors.ray_auth import open_to_anyone


def test_the_shared_cluster_refuses_a_client_without_its_token(ray_cluster: RayCluster) -> None:
    assert open_to_anyone(ray_cluster.address) is False


@pytest.fixture
def open_cluster() -> Iterator[str]:
    """A one-node Ray head started the way Ray starts by default: no token asked."""
    if shutil.which("ray") is None and not (Path(sys.executable).parent / "ray").exists():
        pytest.skip("the ray command is not installed")
    port = free_port()
    temp = tempfile.mkdtemp(prefix="rayo-", dir="/tmp")  # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    ray = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
         "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
        env={**env, "RAY_AUTH_MODE": "disabled"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if open_to_anyone(address):
                    break
            except RuntimeError:
                pass
            assert time.monotonic() < deadline, "the open Ray head did not start"
            time.sleep(0.5)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:  # `ray start --block` outlived 30 s of SIGTERM in every CI run: SIGKILL after 5
            head.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is for a service run as root")
def test_aisched_up_as_root_refuses_a_cluster_that_asks_for_no_token(
    open_cluster: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    up = subprocess.run(
        [sys.executable, "-m", "aisched", "up", "--ray", open_cluster, "--data-dir",
         str(tmp_path / "home"), "--port", str(free_port()), "--socket", ""],
        env={**env, "RAY_AUTH_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert up.returncode == 2, up.stderr
    assert (
        f"the Ray cluster at {open_cluster} takes requests without a token: any local user of "
        "its machines who reaches it could run commands as root there"
    ) in up.stderr
    assert "RAY_AUTH_MODE=token" in up.stderr

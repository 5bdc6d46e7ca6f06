"""Container jobs on the real multi-node Ray cluster of this folder: each task's actor runs
podman on its node (here every node is this machine, so it is the same podman)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from harness import Service

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from container_image import MARKER, MARKER_TEXT, build_test_image, missing_tools  # noqa: E402

pytestmark = pytest.mark.skipif(
    (why := missing_tools()) is not None or os.geteuid() != 0,
    reason=why or "the container tests run rootful podman (CI runs as root)",
)


def test_a_gang_in_an_image_runs_on_two_ray_nodes(ray_service: Service) -> None:
    svc = ray_service
    image = build_test_image()
    job = (
        f"name: ray-image\nimage: {image}\nreplicas: 2\nrestart: {{policy: never}}\n"
        "topology: {spread: node}\nresources: {cpus: 0.5, mem: 256M}\n"
        f"command: 'cat {MARKER}; echo rank $RANK of $WORLD_SIZE'\n"
    )
    (svc.work / "ray-image.yaml").write_text(job)
    jid = str(svc.cli_json("submit", "ray-image.yaml")["id"])
    done = svc.wait_state(jid, "succeeded", "failed", timeout_s=120)
    assert done["message"] == "all tasks exited with code 0"
    assert [svc.cli("logs", jid, "--task", f"main-{i}").stdout for i in (0, 1)] == [
        f"{MARKER_TEXT}rank 0 of 2\n",
        f"{MARKER_TEXT}rank 1 of 2\n",
    ]
    assert len({t["node"] for t in svc.job(jid)["tasks"]}) == 2

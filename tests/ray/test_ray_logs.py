"""On a Ray cluster a task's output is capped and rotated too, on its node, as the local
supervisor does it: `limits.log_max_size` per file, `limits.log_max_files` files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness import Service

KIB = 1024


@pytest.mark.up_config({"limits": {"log_max_size": "64K", "log_max_files": 2}})
def test_a_chatty_ray_task_leaves_at_most_the_cap_on_disk(ray_service: Service) -> None:
    script = "line = 'x' * 1023 + '\\n'\nfor _ in range(1024): print(line, end='')\nprint('done')"
    jid = ray_service.run("--", sys.executable, "-c", script)
    job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=90)
    assert job["state"] == "succeeded", job["events"]
    log = Path(job["tasks"][0]["log_path"])
    files = sorted(log.parent.glob(log.name + "*"))
    kept = [p for p in files if p.name in (log.name, log.name + ".1")]
    assert [p.name for p in files if not p.name.endswith((".env", ".engine", ".exit.json"))] == [
        p.name for p in kept
    ]
    assert sum(p.stat().st_size for p in kept) <= 2 * 64 * KIB
    shown = ray_service.cli("logs", jid).stdout
    assert shown.startswith("aisched: log rotated (") and shown.endswith("done\n")

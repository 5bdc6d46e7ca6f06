"""`aisched top --once` against the real service: one frame with the GPUs, queues and reasons."""

from __future__ import annotations

import sys

from harness import Service, wait_for

WAIT = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


def test_top_once_shows_who_holds_each_gpu_and_why_a_job_waits(service: Service) -> None:
    idle = service.cli("top", "--once").stdout
    assert "0:free 1:free 2:free 3:free" in idle and "no job is waiting" in idle
    train = service.run("--gpus", "3", "--name", "train", "--", sys.executable, "-c", WAIT, "go")
    service.wait_state(train, "running")
    evaluate = service.run("--gpus", "2", "--name", "eval", "--", sys.executable, "-c", "pass")
    reason = wait_for("a reason for the waiting job", lambda: service.job(evaluate)["reason"])
    held = sorted(g["index"] for g in service.cli_json("nodes")["nodes"][0]["gpus"] if g["used_by"])

    out = service.cli("top", "--once").stdout
    for index in range(4):
        assert f"{index}:{train if index in held else 'free'}" in out, out
    waiting = next(line for line in out.splitlines() if line.lstrip().startswith(evaluate))
    assert "eval" in waiting and reason in waiting, out
    assert "running 1" in out and "waiting 1" in out and "GPUs 3/4" in out
    assert service.cli_json("top")["pending"][0]["id"] == evaluate
    (service.work / "go").touch()
    service.wait_state(train, "succeeded")

"""`aisched cancel --all-mine / --state` on a real service: one request cancels the pending
jobs at once and stops the running ones, and says how many it took; a pipeline's steps are
all cancelled, and none of them runs."""

from __future__ import annotations

import os
from pathlib import Path

from harness import Service, users_service
from users import User


def test_cancel_all_mine_by_state_on_a_real_service(service: Service) -> None:
    running = service.run("--gpus", "4", "--", "sleep", "100")
    service.wait_state(running, "running")
    pending = [service.run("--gpus", "1", "--", "sleep", "100") for _ in range(3)]
    out = service.cli("cancel", "--all-mine", "--state", "pending").stdout
    assert out == "3 job(s): 3 cancelled, 0 cancelling (tasks stopping)\n"
    assert [service.job(j)["state"] for j in [running, *pending]] == ["running"] + ["cancelled"] * 3
    out = service.cli("cancel", "--all-mine").stdout
    assert out == "1 job(s): 0 cancelled, 1 cancelling (tasks stopping)\n"
    assert service.wait_state(running, "cancelled")["message"] == "cancelled"


def test_cancel_all_mine_cancels_every_step_of_a_pipeline_and_runs_none(
    tmp_path: Path, local_users: dict[str, User]
) -> None:
    # `first` waits behind another user's job; `second` on `first`, `third` on `second`
    # ending in any way. Cancelling `first` must neither cancel `second` on the way (a
    # second end of it, a server error) nor release `third` to run: the user took all three.
    alice = local_users["alice"]
    with users_service(tmp_path) as service:
        blocker = service.run("--gpus", "3", "--", "sleep", "100")
        service.wait_state(blocker, "running")
        pipeline = alice.home / "p2-bulk-cancel.yaml"
        pipeline.write_text(PIPELINE)
        os.chown(pipeline, alice.uid, alice.gid)
        env = {"AISCHED_SERVER": f"unix:{service.socket}"}
        submitted = alice.aisched("submit", pipeline.name, env=env)
        assert submitted.returncode == 0, submitted.stderr
        out = submitted.stdout.split()
        ids = dict(zip(out[1::2], out[0::2], strict=True))  # name -> id
        first, second, third = ids["first"], ids["second"], ids["third"]
        service.wait_state(third, "pending")

        bulk = alice.aisched("cancel", "--all-mine", env=env)
        assert (bulk.returncode, bulk.stdout, bulk.stderr) == (
            0,
            "3 job(s): 3 cancelled, 0 cancelling (tasks stopping)\n",
            "",
        )
        for job_id in (first, second, third):
            job = service.job(job_id)
            assert (job["state"], job["message"], job["started_at"]) == (
                "cancelled",
                "cancelled while pending",
                None,
            )
        assert service.job(blocker)["state"] == "running"
        assert "scheduler step failed" not in service.log.read_text()
        pipeline.unlink()


PIPELINE = """\
name: first
command: ["true"]
resources: {gpus: 2}
---
name: second
command: ["true"]
depends_on: [first]
---
name: third
command: ["true"]
depends_on: [{job: second, condition: any}]
"""

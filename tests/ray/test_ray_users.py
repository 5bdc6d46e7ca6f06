"""On a Ray cluster a job runs as its submitter too: a real local user submits through the
head's Unix socket with the real CLI, and the task's process on its Ray node has the user's
uid, groups and home, and a checkpoint directory the user owns (the Ray workers here run as
root, so they can switch; a worker that cannot refuses the task instead)."""

from __future__ import annotations

import json
from pathlib import Path

from harness import Service, wait_for
from users import User

from aisched.executors.runas import USER_PATH


def test_a_users_job_on_ray_runs_as_that_user(
    ray_service: Service, local_users: dict[str, User]
) -> None:
    alice = local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{ray_service.socket}"}
    proc = alice.aisched(
        "run", "--json", "--", "sh", "-c",
        'id -u; echo "$HOME"; pwd; stat -c %U "$AISCHED_CHECKPOINT_DIR"; echo "$PATH"',
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    jid = str(json.loads(proc.stdout)["id"])
    job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=90)
    assert job["state"] == "succeeded", job
    out = wait_for("its output", lambda: alice.aisched("logs", jid, env=env).stdout)
    # The usual PATH of a user, not the service's (root's) nor the Ray worker's.
    assert out.splitlines() == [
        str(alice.uid), str(alice.home), str(alice.home), alice.name, USER_PATH
    ]  # fmt: skip
    assert Path(job["checkpoint_dir"]).is_relative_to(alice.home)

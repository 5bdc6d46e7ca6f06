"""On a Ray cluster a job runs as its submitter too: a real local user submits through the
head's Unix socket with the real CLI, and the task's process on its Ray node has the user's
uid, groups and home, and a checkpoint directory the user owns (the Ray workers here run as
root, so they can switch; a worker that cannot refuses the task instead)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from harness import Service, wait_for
from users import User

from aisched.executors.ray_executor import _instance, namespace_for
from aisched.executors.runas import USER_PATH
from aisched.executors.supervisor_pins import PIN_ROOT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from container_image import build_test_image, missing_tools  # noqa: E402


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
    assert job["state"] == "succeeded", job["events"]
    out = wait_for("its output", lambda: alice.aisched("logs", jid, env=env).stdout)
    # The usual PATH of a user, not the service's (root's) nor the Ray worker's.
    assert out.splitlines() == [
        str(alice.uid), str(alice.home), str(alice.home), alice.name, USER_PATH
    ]  # fmt: skip
    assert Path(job["checkpoint_dir"]).is_relative_to(alice.home)


def test_a_users_container_on_ray_mounts_the_volume_its_agent_pinned(
    ray_service: Service, local_users: dict[str, User]
) -> None:
    # The agent (root, on the task's node) pins her volume as the supervisor does on one
    # machine (see supervisor_pins.Pins): a directory she swapped for a link would be refused there.
    if (why := missing_tools()) is not None:
        pytest.skip(why)
    alice = local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{ray_service.socket}"}
    data = alice.home / "ray-pinned"
    shutil.rmtree(data, ignore_errors=True)  # a run before this one's
    data.mkdir()
    (data / "mine").write_text("hers\n")
    for p in (data, data / "mine"):
        os.chown(p, alice.uid, alice.gid)
    job_file = alice.home / "ray-pinned.yaml"
    job_file.write_text(
        f"image: {build_test_image()}\nrestart: {{policy: never}}\n"
        f"volumes: [{{host_path: {data}, path: /d}}]\ncommand: 'ls /d; id -u > /d/out'\n"
    )
    proc = alice.aisched("submit", "--json", str(job_file), env=env)
    assert proc.returncode == 0, proc.stderr
    jid = str(json.loads(proc.stdout)["id"])
    job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=120)
    assert job["state"] == "succeeded", job["events"]
    assert wait_for("its output", lambda: alice.aisched("logs", jid, env=env).stdout) == "mine\n"
    assert (data / "out").read_text() == f"{alice.uid}\n"
    # None of its container's (another pytest worker's service may pin a job of this id).
    instance = _instance(namespace_for(str(ray_service.home)))
    assert [n for n in os.listdir(PIN_ROOT) if f"-aisched-{instance}-{jid}." in n] == []


def test_a_users_checkpoint_directory_on_ray_that_another_user_may_swap_is_refused(
    ray_service: Service, local_users: dict[str, User]
) -> None:
    # bob planted alice's ~/.aisched (a directory of his that she may write): her task, on its
    # Ray node, would have made its checkpoint directory in it, for him to read or swap.
    alice, bob = local_users["alice"], local_users["bob"]
    planted = alice.home / ".aisched"
    shutil.rmtree(planted, ignore_errors=True)
    planted.mkdir()
    planted.chmod(0o777)
    os.chown(planted, bob.uid, bob.gid)
    try:
        job_file = alice.home / "ray-ckpt.yaml"
        job_file.write_text(
            "restart: {policy: never}\ncommand: 'echo saved > $AISCHED_CHECKPOINT_DIR/state'\n"
        )
        env = {"AISCHED_SERVER": f"unix:{ray_service.socket}"}
        proc = alice.aisched("submit", "--json", str(job_file), env=env)
        assert proc.returncode == 0, proc.stderr
        jid = str(json.loads(proc.stdout)["id"])
        job = ray_service.wait_state(jid, "succeeded", "failed", timeout_s=90)
        assert job["state"] == "failed", job["events"]
        assert "the checkpoint directory is not that user's alone" in job["message"]
        assert not (Path(job["checkpoint_dir"]) / "state").exists()
    finally:
        shutil.rmtree(planted, ignore_errors=True)

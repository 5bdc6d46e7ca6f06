"""A queue's per-user limit on a real `aisched up`, with real local users (alice, bob)
submitting through the Unix socket: in a queue shared by a team, no one user takes it all."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, local_service
from prometheus_client.parser import text_string_to_metric_families
from users import User

CONFIG = """
queues:
  - name: default
  - name: team
    user_limit: {gpus: 2}
"""

pytestmark = pytest.mark.usefixtures("local_users")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    with local_service(tmp_path, config=CONFIG) as svc:
        yield svc


def as_user(svc: Service, user: User, *args: str) -> subprocess.CompletedProcess[str]:
    return user.aisched(*args, env={"AISCHED_SERVER": f"unix:{svc.socket}"})


def run_as(svc: Service, user: User, *args: str) -> str:
    proc = as_user(svc, user, "run", "--json", "--queue", "team", *args, "--", "sleep", "300")
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["id"])


def test_a_user_at_the_queues_per_user_limit_waits_while_another_user_starts(
    service: Service, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    first = [run_as(service, alice, "--gpus", "1") for _ in range(2)]
    for jid in first:
        service.wait_state(jid, "running")
    third = run_as(service, alice, "--gpus", "1")
    theirs = run_as(service, bob, "--gpus", "1")
    service.wait_state(theirs, "running")
    waiting = service.job(third)
    assert (waiting["state"], waiting["reason_code"], waiting["reason"]) == (
        "pending",
        "wait-queue",
        f"user {alice.name} would exceed queue team's per-user GPU limit",
    )

    # The queue list shows the limit per user beside the queue's usage.
    (team,) = [q for q in service.cli_json("queues")["queues"] if q["name"] == "team"]
    assert (team["user_limit"]["gpus"], team["used"]["gpus"], team["running"]) == (2, 3, 3)
    table = service.cli("queues").stdout
    assert "PER USER" in table and "2 GPU" in table

    # /metrics: the limit, and what each user's running jobs hold against it.
    held = {
        (s.name, s.labels["queue"], s.labels["resource"], s.labels.get("user")): s.value
        for f in text_string_to_metric_families(service.api.get("/metrics").text)
        for s in f.samples
        if f.name in ("aisched_queue_user_limit", "aisched_queue_user_allocated")
    }
    assert held == {
        ("aisched_queue_user_limit", "team", "gpus", None): 2,
        ("aisched_queue_user_allocated", "team", "gpus", alice.name): 2,
        ("aisched_queue_user_allocated", "team", "gpus", bob.name): 1,
    }
    # `aisched top`: each user's line under the queue.
    top = [" ".join(line.split()) for line in service.cli("top", "--once").stdout.splitlines()]
    assert f"{alice.name} 2 of 2 GPU (at the limit)" in top, top
    assert f"{bob.name} 1 of 2 GPU" in top, top

    # A job above the limit on its own is refused at submission, with the reason.
    refused = as_user(service, alice, "run", "--queue", "team", "--gpus", "3", "--", "true")
    assert refused.returncode == 2
    assert "needs more GPU than queue team's per-user limit" in refused.stderr

    # When one of alice's jobs ends, her waiting one takes its place.
    service.cli("cancel", first[0])
    service.wait_state(third, "running")

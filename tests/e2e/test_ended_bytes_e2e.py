"""`limits.user_max_ended_bytes` on a real `aisched up` with real local users (alice, bob): one
user's ended jobs, with the logs their tasks wrote, keep no more than the bound; past it the
user's oldest are forgotten, their logs with them, and no other user's. The bound holds again
after a restart, which measures what is on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, local_service, wait_for
from users import User

pytestmark = pytest.mark.usefixtures("local_users")

# Each job writes 100 KB to its log; with what else it keeps (its document, its log folders,
# its exit record and task files) under 150 KB: two such jobs fit in 300K, three do not.
CONFIG = "limits: {user_max_ended_bytes: 300K}\n"
WRITE = "import sys; sys.stdout.write('x' * 100_000)"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    with local_service(tmp_path, config=CONFIG) as svc:
        yield svc


def ended_job(svc: Service, user: User) -> str:
    proc = user.aisched(
        "run",
        "--json",
        "--",
        user.python,
        "-c",
        WRITE,
        env={"AISCHED_SERVER": f"unix:{svc.socket}"},
    )
    assert proc.returncode == 0, proc.stderr
    job_id = str(json.loads(proc.stdout)["id"])
    svc.wait_state(job_id, "succeeded")
    return job_id


def kept(svc: Service, job_id: str) -> bool:
    return bool(svc.api.get(f"/v1/jobs/{job_id}").status_code == 200)


def settled(svc: Service, gone: list[str], left: list[str]) -> None:
    wait_for(f"jobs {gone} to be forgotten", lambda: not any(kept(svc, j) for j in gone))
    assert all(kept(svc, j) for j in left)
    assert not any((svc.home / "logs" / j).exists() for j in gone)


def test_a_users_oldest_ended_jobs_are_forgotten_past_the_bound_and_no_one_elses(
    service: Service, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    theirs = [ended_job(service, bob) for _ in range(2)]
    mine = [ended_job(service, alice) for _ in range(4)]
    settled(service, gone=mine[:2], left=mine[2:] + theirs)
    logs = alice.aisched("logs", mine[-1], env={"AISCHED_SERVER": f"unix:{service.socket}"})
    assert logs.stdout == "x" * 100_000, logs.stderr
    # A restart measures again what is on disk: one more job of alice's takes her oldest kept.
    service.stop()
    service.start()
    assert all(kept(service, j) for j in mine[2:] + theirs)
    newer = ended_job(service, alice)
    settled(service, gone=mine[:3], left=[mine[3], newer, *theirs])

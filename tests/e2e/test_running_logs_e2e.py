"""`limits.user_max_running_log_bytes` on a real `aisched up` with real local users (alice,
bob): while one user's running jobs' logs together take more than the bound, that user's job
with the most logs is stopped, failed and not retried, its logs kept for her to read; her
other jobs and other users' run on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, local_service, wait_for
from users import User

from aisched.service.running_logs import CHECK_EVERY_S

pytestmark = pytest.mark.usefixtures("local_users")

# Each job writes 120 KB to its log, then waits: with its folders, under 130 KB on disk. Two
# such jobs fit in 300K, three do not, and any two left after one is stopped fit again.
CONFIG = "limits: {user_max_running_log_bytes: 300K}\n"
WRITE = "import sys, time; sys.stdout.write('x' * 120_000); sys.stdout.flush(); time.sleep(600)"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    with local_service(tmp_path, config=CONFIG) as svc:
        yield svc


def writing_job(svc: Service, user: User) -> str:
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
    svc.wait_state(job_id, "running")
    wait_for(f"job {job_id}'s log", lambda: _log_bytes(svc, job_id) >= 120_000)
    return job_id


def _log_bytes(svc: Service, job_id: str) -> int:
    return sum(f.stat().st_size for f in (svc.home / "logs" / job_id).rglob("*.log"))


def test_a_users_job_with_the_most_logs_is_stopped_past_the_bound_and_no_one_elses(
    service: Service, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    theirs = writing_job(service, bob)
    mine = [writing_job(service, alice) for _ in range(3)]
    stopped = wait_for(
        "one of alice's jobs to fail",
        lambda: [j for j in mine if service.job(j)["state"] == "failed"],
    )
    assert len(stopped) == 1
    job = service.job(stopped[0])
    assert "alice's running jobs' logs took" in job["message"], job["message"]
    assert "limits.user_max_running_log_bytes" in job["message"]
    assert "not retried" in job["message"]
    # Its logs stay for her to read; her other two jobs fit the bound and run on, as bob's,
    # past the next check too.
    logs = alice.aisched("logs", stopped[0], env={"AISCHED_SERVER": f"unix:{service.socket}"})
    assert logs.stdout.startswith("x" * 120_000), logs.stderr
    time.sleep(CHECK_EVERY_S + 1)
    for job_id in [j for j in mine if j != stopped[0]] + [theirs]:
        assert service.job(job_id)["state"] == "running"
    metrics = service.api.get("/metrics").text
    assert "aisched_jobs_stopped_for_logs_total 1.0" in metrics

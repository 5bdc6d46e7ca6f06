"""Disk per user on a real `aisched up` with real local users (alice, bob).

`limits.user_max_ended_bytes`: one user's ended jobs, with the logs their tasks wrote, keep no
more than the bound; past it the user's oldest are forgotten, their logs with them, and no other
user's. The bound holds again after a restart, which measures what is on disk.

`limits.user_max_running_log_bytes`: while one user's running jobs' logs together take more
than the bound, that user's job with the most logs is stopped, failed and not retried, its logs
kept for her to read; her other jobs and other users' run on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Service, users_service, wait_for
from users import User

from aisched.service.running_logs import CHECK_EVERY_S

pytestmark = pytest.mark.usefixtures("local_users")

# Each job writes 100 KB to its log; with what else it keeps (its document, its log folders,
# its exit record and task files) under 150 KB: two such jobs fit in 300K, three do not.
ENDED_BOUND = "limits: {user_max_ended_bytes: 300K}\n"
WRITE = "import sys; sys.stdout.write('x' * 100_000)"
# Each job writes 120 KB to its log, then waits: with its folders, under 130 KB on disk. Two
# such jobs fit in 300K, three do not, and any two left after one is stopped fit again.
RUNNING_BOUND = "limits: {user_max_running_log_bytes: 300K}\n"
WRITE_AND_WAIT = (
    "import sys, time; sys.stdout.write('x' * 120_000); sys.stdout.flush(); time.sleep(600)"
)


@pytest.fixture
def service(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Service]:
    with users_service(tmp_path, request.param) as svc:
        yield svc


def ended_job(svc: Service, user: User) -> str:
    job_id = user.run_python(svc.socket, WRITE)
    svc.wait_state(job_id, "succeeded")
    return job_id


def kept(svc: Service, job_id: str) -> bool:
    return bool(svc.api.get(f"/v1/jobs/{job_id}").status_code == 200)


def settled(svc: Service, gone: list[str], left: list[str]) -> None:
    wait_for(f"jobs {gone} to be forgotten", lambda: not any(kept(svc, j) for j in gone))
    assert all(kept(svc, j) for j in left)
    assert not any((svc.home / "logs" / j).exists() for j in gone)


@pytest.mark.parametrize("service", [ENDED_BOUND], indirect=True)
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


def writing_job(svc: Service, user: User) -> str:
    job_id = user.run_python(svc.socket, WRITE_AND_WAIT)
    # Or already failed: the log check may stop the job that takes its user past the bound
    # between two looks at it (a CI failure waited for "running" for ever).
    svc.wait_state(job_id, "running", "failed")
    wait_for(f"job {job_id}'s log", lambda: _log_bytes(svc, job_id) >= 120_000)
    return job_id


def _log_bytes(svc: Service, job_id: str) -> int:
    return sum(f.stat().st_size for f in (svc.home / "logs" / job_id).rglob("*.log"))


@pytest.mark.parametrize("service", [RUNNING_BOUND], indirect=True)
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


# Tries to write into its own task folder (the executor's files, `tasks/JOB`), which the
# running-log bound does not measure, then writes 50 KB of output.
WRITE_THROUGH_TASK_FOLDER = """
import glob, os, sys
job = os.path.join(sys.argv[1], 'tasks', os.environ['AISCHED_JOB_ID'])
for target in [job, *glob.glob(os.path.join(job, '*', os.environ['AISCHED_TASK']))]:
    try:
        with open(os.path.join(target, 'out'), 'w') as f:
            f.write('z' * 50_000)
        print('wrote', target)
    except OSError as exc:
        print('refused', type(exc).__name__)
print('listed' if os.access(job, os.R_OK) else 'unlisted')
sys.stdout.write('y' * 50_000)
"""


@pytest.mark.parametrize("service", [RUNNING_BOUND], indirect=True)
def test_a_task_writes_only_to_its_log_never_through_its_task_folder(
    service: Service, local_users: dict[str, User]
) -> None:
    """The running-log bound measures `logs/JOB` alone: a task's output goes there (its
    supervisor copies it into the capped log), and its task folder (`tasks/JOB`: the request,
    the lock, the exit record, the supervisor's own output) is out of its user's reach, so a
    task cannot write past the bound through it."""
    alice = local_users["alice"]
    proc = alice.aisched(
        "run", "--json", "--", alice.python, "-c", WRITE_THROUGH_TASK_FOLDER, str(service.home),
        env={"AISCHED_SERVER": f"unix:{service.socket}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job_id = str(json.loads(proc.stdout)["id"])
    service.wait_state(job_id, "succeeded")
    logs = alice.aisched("logs", job_id, env={"AISCHED_SERVER": f"unix:{service.socket}"})
    assert logs.stdout == "refused PermissionError\nunlisted\n" + "y" * 50_000, logs.stdout
    task_files = sorted(p for p in (service.home / "tasks" / job_id).rglob("*") if p.is_file())
    assert {p.name for p in task_files} <= {
        "launch.json", "started.json", "exit.json", "supervisor.lock", "supervisor.log",
        ".shm.lock",  # the attempt's, beside its tasks' folders
    }  # fmt: skip
    assert all(b"y" * 1000 not in p.read_bytes() for p in task_files)

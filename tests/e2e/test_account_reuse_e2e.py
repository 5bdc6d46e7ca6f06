"""A user name deleted and given to another account (another uid) does not hand the new
account what the old one left: its waiting jobs do not run as the newcomer, its tokens do not
act for it. Real local users (made and deleted here), the real CLI and a real service.
"""

from __future__ import annotations

import json
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Service, machine_lock, users_service, wait_for
from prometheus_client.parser import text_string_to_metric_families
from users import User, _python_for

NAME = "aisfcreuse"


def _make(uid: int | None = None) -> User:
    subprocess.run(
        [
            "useradd",
            "--create-home",
            "--shell",
            "/bin/sh",
            *(["-u", str(uid)] if uid else []),
            NAME,
        ],
        check=True,
    )
    pw = pwd.getpwnam(NAME)
    draft = User(NAME, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), python="")
    python = _python_for(draft)
    if python is None:
        pytest.skip(f"no Python that user {NAME} can run with this checkout's packages")
    return User(NAME, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), python)


def _delete() -> None:
    subprocess.run(["userdel", "--remove", NAME], check=False, capture_output=True)


def _free_uid(after: int) -> int:
    uid = after + 100
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


@pytest.fixture
def reused_name(local_users: dict[str, User]) -> Iterator[User]:
    """A fresh account of its own, deleted at the end whatever uid it has by then (the
    `local_users` fixture only for its checks: root, useradd, a Python users can run)."""
    with machine_lock("users"):
        _delete()
        user = _make()
    try:
        yield user
    finally:
        with machine_lock("users"):
            _delete()


def _pending_job_of(service: Service, user: User) -> tuple[str, str]:
    """A job of root's holding every GPU, and one of `user`'s waiting behind it."""
    blocker = service.run("--gpus", "4", "--", "sleep", "300")
    service.wait_state(blocker, "running")
    proc = user.aisched(
        "run", "--json", "--gpus", "1", "--", "id", "-u",
        env={"AISCHED_SERVER": f"unix:{service.socket}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = str(json.loads(proc.stdout)["id"])
    assert service.job(job)["state"] == "pending"
    return blocker, job


def _first_end(service: Service, job: str) -> dict[str, object]:
    """The job once its first attempt is over (ended, or waiting for its retry)."""

    def over() -> dict[str, object] | None:
        j = service.job(job)
        return j if j["state"] in ("succeeded", "failed") or j["failures"] else None

    return wait_for(f"job {job}'s first attempt to end", over, 60)  # type: ignore[no-any-return]


def test_a_waiting_job_does_not_run_as_a_new_account_of_its_users_name(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        blocker, job = _pending_job_of(service, reused_name)
        old_uid = reused_name.uid
        with machine_lock("users"):
            _delete()
            newcomer = _make(_free_uid(old_uid))
        service.cli("cancel", blocker)

        ended = _first_end(service, job)
        assert ended["state"] == "failed", service.cli("logs", job, check=False).stdout
        assert ended["attempt"] == 1 and ended["failures"] == 1
        assert (
            f"user '{NAME}' is uid {newcomer.uid} on this machine, not uid {old_uid}, which "
            "submitted the job" in str(ended["message"])
        )
        assert service.cli("logs", job).stdout.strip() == ""  # nothing ran


def test_a_waiting_job_whose_user_is_deleted_fails_without_retries(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        blocker, job = _pending_job_of(service, reused_name)
        with machine_lock("users"):
            _delete()
        service.cli("cancel", blocker)

        ended = _first_end(service, job)
        assert ended["state"] == "failed"
        assert ended["attempt"] == 1 and ended["failures"] == 1
        assert f"user '{NAME}' has no account on this machine" in str(ended["message"])


def test_a_token_made_for_a_user_does_not_act_for_a_new_account_of_that_name(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        old_token = service.cli("token", "create", NAME).stdout.strip()
        tcp = {"AISCHED_SERVER": service.url, "AISCHED_TOKEN": old_token}
        listed = reused_name.aisched("token", "list", "--json", env=tcp)
        assert listed.returncode == 0, listed.stderr
        token_id = json.loads(listed.stdout)[0]["id"]
        old_uid = reused_name.uid
        with machine_lock("users"):
            _delete()
            newcomer = _make(_free_uid(old_uid))

        refused = newcomer.aisched("token", "list", "--json", env=tcp)
        assert refused.returncode != 0
        assert (
            f"token {token_id} was made for {NAME} as uid {old_uid}, and {NAME} is uid "
            f"{newcomer.uid} now" in refused.stderr
        )
        # The dashboard's sign-in takes it no more than the API does.
        login = httpx.post(
            f"{service.url}/login",
            data={"token": old_token},
            headers={"Origin": service.url, "Sec-Fetch-Site": "same-origin"},
        )
        assert login.status_code == 401
        # A token made for the new account is the new account's.
        new_token = service.cli("token", "create", NAME).stdout.strip()
        tcp["AISCHED_TOKEN"] = new_token
        assert newcomer.aisched("token", "list", "--json", env=tcp).returncode == 0

        with machine_lock("users"):
            _delete()
        gone = httpx.get(f"{service.url}/v1/info", headers={"Authorization": f"Bearer {new_token}"})
        assert gone.status_code == 401
        assert f"and {NAME} has no account here now" in gone.json()["error"]


def _ran_job_of(service: Service, user: User) -> str:
    """A job of `user`'s that has ended, having printed `old-output` with `SECRET` set."""
    proc = user.aisched(
        "run", "--json", "--env", "SECRET=old-secret", "--", "sh", "-c", "echo old-output",
        env={"AISCHED_SERVER": f"unix:{service.socket}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = str(json.loads(proc.stdout)["id"])
    service.wait_state(job, "succeeded")
    return job


def test_a_new_account_of_a_users_name_cannot_read_or_cancel_the_old_accounts_jobs(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        ran = _ran_job_of(service, reused_name)
        blocker, waiting = _pending_job_of(service, reused_name)
        old_uid = reused_name.uid
        with machine_lock("users"):
            _delete()
            newcomer = _make(_free_uid(old_uid))
        token = service.cli("token", "create", NAME).stdout.strip()
        by_socket = {"AISCHED_SERVER": f"unix:{service.socket}"}
        by_token = {"AISCHED_SERVER": service.url, "AISCHED_TOKEN": token}
        refusal = (
            f"was submitted by {NAME} as uid {old_uid}, and you are uid {newcomer.uid} (the "
            "account was deleted or its name given to another)"
        )
        for env in (by_socket, by_token):
            shown = newcomer.aisched("show", "--json", ran, env=env)
            assert shown.returncode == 0, shown.stderr
            job = json.loads(shown.stdout)
            assert job["env"] is None and job["events"] == []
            assert all(g["command"] == [] for g in job["groups"])

            logs = newcomer.aisched("logs", ran, env=env)
            assert logs.returncode != 0 and "old-output" not in logs.stdout
            assert f"job {ran} {refusal}: only that account and admins may read its logs" in (
                logs.stderr.replace("\n", " ")
            )

            cancel = newcomer.aisched("cancel", waiting, env=env)
            assert cancel.returncode != 0
            assert refusal in cancel.stderr.replace("\n", " ")
            bulk = newcomer.aisched("cancel", "--all-mine", "--json", env=env)
            assert bulk.returncode == 0, bulk.stderr
            assert json.loads(bulk.stdout)["count"] == 0
        assert service.job(waiting)["state"] == "pending"

        # The old account's jobs are whole to admins.
        job = service.job(ran)
        assert job["env"] == {"main": {"SECRET": "old-secret"}}, job["env"]
        assert job["groups"][0]["command"] == ["sh", "-c", "echo old-output"]
        assert service.cli("logs", ran).stdout.strip() == "old-output"
        service.cli("cancel", waiting, blocker)
        assert service.job(waiting)["state"] == "cancelled"


def test_a_new_account_of_a_users_name_cannot_list_or_revoke_the_old_accounts_tokens(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        service.cli("token", "create", NAME, "--note", "old account's")
        by_socket = {"AISCHED_SERVER": f"unix:{service.socket}"}
        listed = reused_name.aisched("token", "list", "--json", env=by_socket)
        assert listed.returncode == 0, listed.stderr
        (old,) = json.loads(listed.stdout)
        with machine_lock("users"):
            _delete()
            newcomer = _make(_free_uid(reused_name.uid))
        token = service.cli("token", "create", NAME, "--note", "new account's").stdout.strip()
        by_token = {"AISCHED_SERVER": service.url, "AISCHED_TOKEN": token}

        for env in (by_socket, by_token):
            listed = newcomer.aisched("token", "list", "--json", env=env)
            assert listed.returncode == 0, listed.stderr
            assert [t["note"] for t in json.loads(listed.stdout)] == ["new account's"]
            revoke = newcomer.aisched("token", "revoke", old["id"], env=env)
            assert revoke.returncode != 0
            assert "only admins may revoke another account's token" in revoke.stderr

        # To admins it is there, and not revoked.
        every = json.loads(service.cli("token", "list", "--json").stdout)
        (kept,) = [t for t in every if t["id"] == old["id"]]
        assert kept["revoked_at"] is None


def test_a_running_job_of_a_deleted_account_runs_on_and_is_the_admins_alone_to_stop(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        proc = reused_name.aisched(
            "run", "--json", "--", "sleep", "300",
            env={"AISCHED_SERVER": f"unix:{service.socket}"},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        job = str(json.loads(proc.stdout)["id"])
        service.wait_state(job, "running")
        with machine_lock("users"):
            # --force: userdel refuses an account whose processes run, as the job's do.
            subprocess.run(
                ["userdel", "--force", "--remove", NAME], check=True, capture_output=True
            )
            newcomer = _make(_free_uid(reused_name.uid))

        cancel = newcomer.aisched("cancel", job, env={"AISCHED_SERVER": f"unix:{service.socket}"})
        assert cancel.returncode != 0
        assert f"was submitted by {NAME} as uid {reused_name.uid}" in cancel.stderr
        assert service.job(job)["state"] == "running"
        service.cli("cancel", job)
        assert service.wait_state(job, "cancelled")["state"] == "cancelled"


# Limits per user count per account: a deleted account's jobs and requests are not its name's
# next holder's.

MAX_ONE_JOB = """
limits:
  user_max_jobs: 1
"""

TEAM_ONE_GPU = """
queues:
  - name: default
  - name: team
    user_limit: {gpus: 1}
"""

# Nothing refills while the test runs: 3 requests, then 429s.
THREE_REQUESTS = """
limits:
  request_rate: 0.001
  request_burst: 3
"""

# Run as a local user: N requests of /v1/jobs over the socket; their statuses, as JSON.
REQUESTS = """
import json, sys, httpx
c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), base_url="http://x", timeout=30)
print(json.dumps([c.get("/v1/jobs").status_code for _ in range(int(sys.argv[2]))]))
"""


def _replace_account(user: User, force: bool = False) -> User:
    """Delete `user`'s account (`force`: while its processes run) and give its name to a new
    account of another uid."""
    with machine_lock("users"):
        if force:
            subprocess.run(
                ["userdel", "--force", "--remove", NAME], check=True, capture_output=True
            )
        else:
            _delete()
        return _make(_free_uid(user.uid))


def test_a_deleted_accounts_jobs_do_not_count_against_user_max_jobs_of_its_names_new_account(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path, MAX_ONE_JOB) as service:
        _blocker, waiting = _pending_job_of(service, reused_name)
        newcomer = _replace_account(reused_name)
        by_socket = {"AISCHED_SERVER": f"unix:{service.socket}"}

        first = newcomer.aisched("run", "--json", "--gpus", "1", "--", "true", env=by_socket)
        assert first.returncode == 0, first.stderr
        # The limit still holds for the new account's own jobs.
        second = newcomer.aisched("run", "--json", "--gpus", "1", "--", "true", env=by_socket)
        assert second.returncode != 0
        assert f"{NAME} has 1 jobs not yet ended and may have at most 1" in (
            second.stderr.replace("\n", " ")
        )
        assert service.job(waiting)["state"] == "pending"


def test_a_deleted_accounts_running_jobs_do_not_count_against_its_names_new_account_in_a_queue(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path, TEAM_ONE_GPU) as service:
        by_socket = {"AISCHED_SERVER": f"unix:{service.socket}"}
        args = ("run", "--json", "--queue", "team", "--gpus", "1", "--", "sleep", "300")
        old = reused_name.aisched(*args, env=by_socket)
        assert old.returncode == 0, old.stderr
        old_job = str(json.loads(old.stdout)["id"])
        service.wait_state(old_job, "running")
        newcomer = _replace_account(reused_name, force=True)

        new = newcomer.aisched(*args, env=by_socket)
        assert new.returncode == 0, new.stderr
        new_job = str(json.loads(new.stdout)["id"])
        service.wait_state(new_job, "running")
        # The new account's next job waits on its own limit.
        third = newcomer.aisched(*args, env=by_socket)
        assert third.returncode == 0, third.stderr
        waiting = service.job(str(json.loads(third.stdout)["id"]))
        assert (waiting["state"], waiting["reason"]) == (
            "pending",
            f"user {NAME} would exceed queue team's per-user GPU limit",
        )
        # Two accounts of one name: the metrics tell them apart, and say which is the old one.
        held = {
            s.labels["user"]
            for f in text_string_to_metric_families(service.api.get("/metrics").text)
            if f.name == "aisched_queue_user_allocated"
            for s in f.samples
        }
        assert held == {
            f"{NAME} (uid {newcomer.uid})",
            f"{NAME} (former account, uid {reused_name.uid})",
        }


def test_a_deleted_accounts_requests_do_not_spend_its_names_new_accounts_rate_budget(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path, THREE_REQUESTS) as service:

        def statuses(user: User, n: int) -> list[int]:
            proc = subprocess.run(
                user.cmd(user.python, "-c", REQUESTS, str(service.socket), str(n)),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            return list(json.loads(proc.stdout))

        assert statuses(reused_name, 4) == [200, 200, 200, 429]
        newcomer = _replace_account(reused_name)
        assert statuses(newcomer, 4) == [200, 200, 200, 429]


SERVICE_FILE = """
name: web
kind: service
command: [sleep, "300"]
resources: {gpus: 1}
service:
  min_replicas: 2
  max_replicas: 3
"""


def test_a_service_of_a_deleted_account_fails_once_instead_of_crash_looping_its_replicas(
    tmp_path: Path, reused_name: User
) -> None:
    with users_service(tmp_path) as service:
        blocker = service.run("--gpus", "4", "--", "sleep", "300")
        service.wait_state(blocker, "running")
        (reused_name.home / "web.yaml").write_text(SERVICE_FILE)
        proc = reused_name.aisched(
            "submit", "--json", "web.yaml", env={"AISCHED_SERVER": f"unix:{service.socket}"}
        )
        assert proc.returncode == 0, proc.stderr
        submitted = json.loads(proc.stdout)
        sid = str((submitted[0] if isinstance(submitted, list) else submitted)["id"])
        old_uid = reused_name.uid
        newcomer = _replace_account(reused_name)
        service.cli("cancel", blocker)

        ended = service.wait_state(sid, "failed")
        assert (
            f"the account that submitted the service ({NAME}) no longer exists: user "
            f"'{NAME}' is uid {newcomer.uid} on this machine now, not uid {old_uid}, another "
            "account, so none of its replicas can start" in str(ended["message"])
        ), ended["message"]
        assert str(ended["message"]).endswith("; not retried")
        # Its two replicas were all it ever made: none was made to replace a refused one.
        replicas = [
            j for j in service.cli_json("jobs", "--all")["jobs"] if j.get("replica_of") == sid
        ]
        assert len(replicas) == 2, replicas
        assert {r["state"] for r in replicas} <= {"failed", "cancelled"}


def test_an_idempotency_key_of_a_deleted_account_gives_its_names_new_account_nothing_of_it(
    tmp_path: Path, reused_name: User
) -> None:
    """Keys are kept per user name: a newcomer sending the key an old account of its name
    used was answered with the old account's job, as if it were its own submission."""
    with users_service(tmp_path) as service:
        by_socket = {"AISCHED_SERVER": f"unix:{service.socket}"}
        blocker = service.run("--gpus", "4", "--", "sleep", "300")
        service.wait_state(blocker, "running")
        key = ("--idempotency-key", "train-1")
        old = reused_name.aisched("run", "--json", *key, "--gpus", "1", "--", "id", env=by_socket)
        assert old.returncode == 0, old.stderr
        old_job = str(json.loads(old.stdout)["id"])
        newcomer = _replace_account(reused_name)

        again = newcomer.aisched("run", "--json", *key, "--gpus", "1", "--", "id", env=by_socket)
        assert again.returncode != 0, again.stdout
        said = again.stderr.replace("\n", " ")
        assert "Idempotency-Key 'train-1' was used by another account named" in said
        assert f"(uid {reused_name.uid}, deleted since)" in said
        assert old_job not in again.stdout
        # Another key is a submission of its own.
        other = newcomer.aisched(
            "run", "--json", "--idempotency-key", "train-2", "--gpus", "1", "--", "id",
            env=by_socket,
        )  # fmt: skip
        assert other.returncode == 0, other.stderr
        assert str(json.loads(other.stdout)["id"]) != old_job

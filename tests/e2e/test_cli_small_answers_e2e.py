"""The CLI's small answers, against the real service: `run -f`'s exit status for a task
killed by a signal, `logs` of a job not started yet, another user's `show`, a `--queue` the
service does not have, the label of a bad job ID, and `run`'s errors found by the service."""

from __future__ import annotations

from pathlib import Path

from harness import Service, users_service
from users import User


def test_run_follow_exits_as_a_shell_does_for_a_task_killed_by_a_signal(
    service: Service,
) -> None:
    """128 + 9 for SIGKILL, as `sh -c 'kill -9 $$'; echo $?` says; it was 1."""
    proc = service.cli(
        "run", "-f", "--restart", "never", "--", "sh", "-c", "kill -9 $$", check=False
    )
    assert proc.returncode == 137, proc.stderr


def test_logs_of_a_job_not_started_yet_says_so(service: Service) -> None:
    """It printed nothing and exited 0, as for a job that printed nothing."""
    big = service.run("--gpus", "4", "--", "sleep", "60")
    service.wait_state(big, "running")
    waits = service.run("--gpus", "1", "--", "true")
    proc = service.cli("logs", waits)
    assert (proc.returncode, proc.stdout) == (0, "")
    assert proc.stderr == (
        f"job {waits} has not started yet: `aisched show {waits}` says why, "
        f"`aisched logs -f {waits}` waits for its output\n"
    )


def test_a_queue_the_service_does_not_have_is_an_error_naming_those_it_has(
    service: Service,
) -> None:
    """`jobs --queue nosuch` and `cancel --queue nosuch` said nothing and `0 job(s)`."""
    for argv in (["jobs", "--queue", "nosuch"], ["cancel", "--queue", "nosuch"]):
        proc = service.cli(*argv, check=False)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            2,
            "",
            "error: --queue: no queue 'nosuch' here; the queues: default\n",
        )


def test_a_bad_job_id_is_labelled_alike_by_every_command(service: Service) -> None:
    """`show` and `logs` said `argument id:`, `cancel` `argument ID:`."""
    for command in ("show", "logs", "cancel"):
        proc = service.cli(command, "abc", check=False)
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: argument ID: 'abc' is not a job ID"), proc.stderr


def test_runs_errors_found_by_the_service_name_the_flag(service: Service) -> None:
    """docs/service.md, Errors: the flag on the command line, not the job field it became
    (`resources.gpus: 99999 ...`)."""
    proc = service.cli("run", "--gpus", "99999", "--workdir", "/no/such", "--", "true", check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[1:] == [
        "  aisched run: --gpus: 99999 is more than the limit of 4096 GPUs per task",
    ]
    proc = service.cli("run", "--workdir", "/no/such", "--", "true", check=False)
    assert proc.stderr.splitlines()[1:] == ["  aisched run: --workdir: no such directory: /no/such"]


def test_another_users_show_leaves_out_what_they_may_not_see(
    tmp_path: Path, local_users: dict[str, User]
) -> None:
    """No empty `checkpoint dir` line, no `: ` where the command would be."""
    alice, bob = local_users["alice"], local_users["bob"]
    with users_service(tmp_path) as svc:
        env = {"AISCHED_SERVER": f"unix:{svc.socket}"}
        job = alice.run_python(svc.socket, "pass")
        svc.wait_state(job, "succeeded", "failed")
        mine = alice.aisched("show", job, env=env).stdout
        theirs = bob.aisched("show", job, env=env)
        assert theirs.returncode == 0, theirs.stderr
    assert "checkpoint dir" in mine and "checkpoint dir" not in theirs.stdout
    tasks = [line for line in theirs.stdout.splitlines() if "tasks main" in line]
    assert len(tasks) == 1 and tasks[0].endswith("1 x (1 CPU, 1 GiB)"), tasks

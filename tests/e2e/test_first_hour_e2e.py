"""End to end, as a new user meets it (issue: the rough edges of the first hour): a reservation
that leaves room beside it, the CLI's habits, and every example file accepted by the service the
README names for them. The real service on a loopback port, driven by the real CLI.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Service, cancel_all, free_port, wait_for
from users import User

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
WAIT = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
# Every job file among the examples: the rest are cluster, policy and service files.
JOB_FILES = sorted(
    [
        *(EXAMPLES / "jobs").glob("*.yaml"),
        *(EXAMPLES / "pipelines").glob("*.yaml"),
        *(EXAMPLES / "services").glob("*.yaml"),
    ]
)


@pytest.fixture
def examples_service(tmp_path: Path) -> Iterator[Service]:
    """`aisched up --config examples/service.yaml`, as the README says, on a port of its own."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    svc = Service(home, free_port(), work, ["--config", str(EXAMPLES / "service.yaml")])
    svc.start()
    try:
        yield svc
    finally:
        cancel_all(svc)
        svc.stop()


def test_every_example_job_file_is_accepted_by_the_service_the_examples_name(
    examples_service: Service,
) -> None:
    assert len(JOB_FILES) == 7, JOB_FILES
    # All at once: `submit FILE...` takes several, and --json answers with one list.
    answers = examples_service.cli_json("submit", *map(str, JOB_FILES))
    assert [bool(a.get("id")) for a in answers] == [True] * len(JOB_FILES)
    assert [a.get("warnings") is not None for a in answers] == [True] * len(JOB_FILES)


def test_every_example_job_file_is_accepted_from_a_user_who_is_no_admin(
    examples_service: Service, local_users: dict[str, User]
) -> None:
    """As the README says: an ordinary user's submission of each example is taken, the
    priority class `high` some of them ask for included (the queues' max_priority)."""
    alice = local_users["alice"]
    env = {"AISCHED_SERVER": f"unix:{examples_service.socket}"}
    refused = {}
    for path in JOB_FILES:
        proc = alice.aisched("submit", str(path), env=env)
        if proc.returncode != 0:
            refused[path.name] = proc.stderr
    assert refused == {}


def _submit_as(user: User, svc: Service, name: str, text: str) -> subprocess.CompletedProcess[str]:
    """`aisched submit NAME` by `user`, of a file of `text` made in their home (where the
    submission runs)."""
    job = user.home / name
    job.write_text(text)
    os.chown(job, user.uid, user.gid)
    try:
        return user.aisched("submit", name, env={"AISCHED_SERVER": f"unix:{svc.socket}"})
    finally:
        job.unlink()


def test_the_native_example_of_the_job_file_docs_is_accepted_as_written(
    examples_service: Service, local_users: dict[str, User]
) -> None:
    """docs/jobs.md's native example, copied as it is, is taken from an ordinary user by the
    service it names: it once needed six submissions to show six mistakes."""
    text = (REPO / "docs" / "jobs.md").read_text()
    after = text[text.index("## Native format") :]
    example = after[after.index("```yaml\n") + len("```yaml\n") : after.index("```\n", 8)]
    alice = local_users["alice"]
    proc = _submit_as(alice, examples_service, "train.yaml", example)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_the_service_says_every_mistake_it_finds_in_a_submission_at_once(
    examples_service: Service, local_users: dict[str, User]
) -> None:
    """Another user, a priority above the queue's cap and a missing working directory: one
    answer names all three, where it once named the first only."""
    text = "user: aisbob\nqueue: research\npriority: 1000\ncommand: [ls]\nworkdir: /no/such\n"
    proc = _submit_as(local_users["alice"], examples_service, "job.yaml", text)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == "error: job refused"
    assert [line.split(": ")[1] for line in lines[1:]] == ["user", "priority", "workdir"]


def test_the_pipeline_example_leaves_no_file_where_it_ran(examples_service: Service) -> None:
    pipeline = EXAMPLES / "pipelines" / "preprocess-train-evaluate.yaml"
    out = examples_service.cli("submit", str(pipeline)).stdout.split()
    ids = out[0::2]
    assert out[1::2] == ["preprocess", "train", "evaluate", "cleanup"]
    for job_id in ids:
        examples_service.wait_state(job_id, "succeeded", "failed", "cancelled", timeout_s=60)
    assert [examples_service.job(i)["state"] for i in ids] == ["succeeded"] * 4
    assert examples_service.cli("logs", ids[2]).stdout == "model mean 2.5\n"
    assert sorted(p.name for p in examples_service.work.iterdir()) == []


def test_a_reservation_leaves_cpu_work_beside_it_running(service: Service) -> None:
    """4 GPUs, 4 cores: a 4-GPU job runs, a 1-GPU job waits with a reservation; a CPU-only job
    and a CPU gang, neither with a runtime bound, start at once beside the reservation."""
    big = service.run("--gpus", "4", "--", PY, "-c", WAIT, "release")
    service.wait_state(big, "running")
    waits = service.run("--gpus", "1", "--", PY, "-c", "print('waited')")
    reserved = wait_for(
        "the 1-GPU job to hold a reservation",
        lambda: (j := service.job(waits))["reason_code"] == "reserved" and j,
    )
    assert reserved["state"] == "pending"
    cpu = service.run("--cpus", "1", "--", PY, "-c", WAIT, "release")
    gang = service.run("--replicas", "2", "--cpus", "0.5", "--", PY, "-c", WAIT, "release")
    for job_id in (cpu, gang):
        service.wait_state(job_id, "running", timeout_s=30)
    assert service.job(big)["state"] == "running"
    assert service.job(waits)["state"] == "pending"
    # More CPU than the reservation leaves over waits, and says why.
    more = service.run("--cpus", "1.5", "--", PY, "-c", "print('more')")
    held = wait_for(
        "the 1.5-core job to wait beside the reservation",
        lambda: (j := service.job(more))["reason"] and j,
    )
    assert held["state"] == "pending"
    assert held["reason"].endswith("the rest is reserved"), held["reason"]
    (service.work / "release").touch()
    assert service.wait_state(waits, "succeeded", "failed")["state"] == "succeeded"
    assert service.wait_state(more, "succeeded", "failed")["state"] == "succeeded"


def _aisched(svc: Service, *args: str, server: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "aisched", *args],
        capture_output=True,
        text=True,
        # Over TCP a client needs a token (docs/security.md); the socket is the default.
        env={**svc.env(), "AISCHED_SERVER": server, "AISCHED_TOKEN": svc.admin_token()},
        cwd=svc.work,
        timeout=60,
    )


def test_server_and_json_work_before_or_after_the_subcommand(service: Service) -> None:
    nowhere = "http://127.0.0.1:1"
    before = _aisched(service, "--server", service.url, "--json", "jobs", server=nowhere)
    after = _aisched(service, "jobs", "--server", service.url, "--json", server=nowhere)
    assert (before.returncode, before.stdout, before.stderr) == (0, after.stdout, "")
    assert before.stdout.startswith("{")
    # Given after the subcommand, its own value wins.
    both = _aisched(
        service, "--server", nowhere, "jobs", "--server", service.url, "--json", server=nowhere
    )
    assert (both.returncode, both.stdout) == (0, after.stdout)


def test_submit_takes_several_files_and_prints_each_id(service: Service) -> None:
    (service.work / "a.yaml").write_text("name: a\ncommand: echo a\n")
    (service.work / "b.yaml").write_text("name: b\ncommand: echo b\n")
    out = service.cli("submit", "a.yaml", "b.yaml").stdout.split()
    assert [service.job(i)["name"] for i in out] == ["a", "b"]


def test_a_refused_file_gives_one_error_line_then_one_line_per_problem(service: Service) -> None:
    (service.work / "bad.yaml").write_text("tasks:\n  - resources: {gpus: -1}\n")
    proc = service.cli("submit", "bad.yaml", check=False)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2,
        [
            "error: invalid job",
            "  bad.yaml: tasks.0.name: Field required",
            "  bad.yaml: tasks.0.command: Field required",
            "  bad.yaml: tasks.0.resources.gpus: -1 is negative",
        ],
    )


def test_one_quoted_command_line_runs_with_a_shell_named_after_its_program(
    service: Service,
) -> None:
    """`aisched run 'A=... prog ... | ...'`, one word as newcomers often write it. It was exec'd
    as one program's name (`command not found: echo "x y" | tr a-z A-Z`, retried three times);
    it runs with /bin/sh -c now. The name every user sees was the whole line, token included
    (`HF_TOKEN-hf_secret123-python3-t.py`); it is the program's alone."""
    piped = service.run("--max-retries", "0", 'echo "x y" | tr a-z A-Z')
    script = 'import os; print(os.environ["HF_TOKEN"])'
    line = f"HF_TOKEN='hf_secret123 p2secret' {shlex.quote(PY)} -c '{script}'"
    token = service.run("--max-retries", "0", line)
    for job_id in (piped, token):
        job = service.wait_state(job_id, "succeeded", "failed")
        assert job["state"] == "succeeded", job
    assert service.cli("logs", piped).stdout == "X Y\n"
    assert service.cli("logs", token).stdout == "hf_secret123 p2secret\n"
    names = {j["id"]: j["name"] for j in service.cli_json("jobs", "--all")["jobs"]}
    assert (names[piped], names[token]) == ("echo", Path(PY).name)


def test_a_program_that_is_not_found_fails_at_once_not_retried(service: Service) -> None:
    """With the default three retries, it was retried with back-off, failing the same way."""
    job_id = service.run("--", "no-such-program-xyz")

    def ended_or_retried() -> dict[str, Any] | None:
        j = service.job(job_id)
        return j if j["state"] in ("failed", "succeeded") or j["failures"] > 0 else None

    job = wait_for("the job to fail or to be retried", ended_or_retried)
    assert (job["state"], job["exit_code"], job["message"]) == (
        "failed",
        127,
        "task main-0 command not found: no-such-program-xyz; not retried",
    )

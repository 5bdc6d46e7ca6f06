"""Fault injection on a real `aisched up`: a small tmpfs as the data directory (mounted here,
as root; skipped with the reason otherwise), a database locked by another process, and every
start-up error as one line with exit status 2."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import (
    Service,
    cancel_all,
    database_locked,
    free_port,
    local_service,
    stopped,
    wait_for,
)

from aisched.store.db import Store
from aisched.store.schema import SCHEMA_VERSION
from aisched.testing.postgres import PostgresServer

MIB = 1 << 20
LIMITS = "limits: {log_max_size: 4M, log_max_files: 2, disk_min_free: 8M}\n"
# Fills the filesystem of the file it is given, then waits (as a runaway task would).
FILL = (
    "import sys, time\n"
    "f = open(sys.argv[1], 'wb', buffering=0)\n"
    "for size in (1 << 20, 4096, 1):\n"
    "    try:\n"
    "        while True:\n"
    "            f.write(b'\\0' * size)\n"
    "    except OSError:\n"
    "        pass\n"
    "f.close()\n"
    "time.sleep(600)\n"
)


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    return None


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs, unmounted (lazily: a task may still hold a file) after the test."""
    why = _can_mount()
    if why is not None:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    got = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def tmpfs_service(tmp_path: Path, mnt: Path) -> Service:
    """A service whose data directory is on the tmpfs (its own log stays outside it)."""
    work, home = tmp_path / "work", mnt / "home"
    work.mkdir()
    home.mkdir()
    (tmp_path / "config.yaml").write_text(LIMITS + "cycle_interval: 0.2s\n")
    args = ["--gpus", "1", "--cpus", "4", "--mem", "8G", "--config", str(tmp_path / "config.yaml")]
    svc = Service(home, free_port(), work, args)
    svc.log = tmp_path / "service.log"
    return svc


def readyz(svc: Service) -> tuple[int, dict[str, object]]:
    r = httpx.get(f"{svc.url}/v1/readyz", timeout=10)  # no identity needed, like healthz
    return r.status_code, r.json()


def states(svc: Service) -> dict[str, str]:
    jobs = svc.api.get("/v1/jobs", params={"all": "true"}).json()["jobs"]
    return {j["id"]: j["state"] for j in jobs}


def test_a_task_writing_200_mb_leaves_at_most_the_cap_on_disk(tmp_path: Path, tmpfs: Path) -> None:
    svc = tmpfs_service(tmp_path, tmpfs)
    svc.start()
    try:
        big = svc.run(
            "--", sys.executable, "-c",
            "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(200 * 1024): "
            "sys.stdout.write(line)\nprint('done')",
        )  # fmt: skip
        assert svc.wait_state(big, "succeeded", "failed", timeout_s=120)["state"] == "succeeded"
        logs = sorted((svc.home / "logs" / big / "1").glob("main-0.log*"))
        assert [p.name for p in logs] == ["main-0.log", "main-0.log.1"]
        assert sum(p.stat().st_size for p in logs) <= 2 * 4 * MIB
        shown = svc.cli("logs", big).stdout
        assert shown.startswith("aisched: log rotated (")
        assert shown.endswith("done\n")
        assert readyz(svc)[0] == 200
    finally:
        cancel_all(svc)
        svc.stop()


def test_a_full_disk_refuses_submissions_then_recovers_with_every_job(
    tmp_path: Path, tmpfs: Path
) -> None:
    svc = tmpfs_service(tmp_path, tmpfs)
    svc.start()
    svc.admin_token()  # made while the disk has room: a token is stored like anything else
    fill = tmpfs / "fill"
    try:
        ends_while_full = svc.run("--", "sleep", "3")
        filler = svc.run("--", sys.executable, "-c", FILL, str(fill))
        svc.wait_state(filler, "running")

        def pressure() -> dict[str, object] | None:
            code, body = readyz(svc)
            return body if code == 503 and body["disk_pressure"] else None

        body = wait_for("readiness to report disk pressure", pressure, 30)
        assert str(body["problems"][0]).startswith("disk pressure: ")
        assert httpx.get(f"{svc.url}/v1/healthz", timeout=5).json() == svc.alive_leader()
        r = svc.api.post("/v1/jobs", json={"command": ["true"]}, timeout=5)
        assert r.status_code == 507
        assert r.json()["error"].startswith("the service is not accepting new jobs: disk pressure")
        refused = svc.cli("run", "--", "true", check=False)
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: the service is not accepting new jobs: disk ")
        # Nothing of it was kept: no Idempotency-Key to fetch it with later is offered.
        assert r.headers["aisched-kept"] == "nothing"
        assert "Idempotency-Key" not in refused.stderr, refused.stderr
        time.sleep(4)  # the sleep ends while the disk is full
        fill.unlink()
        wait_for("readiness again", lambda: readyz(svc)[0] == 200, 60)
        after = svc.run("--", "true")
        assert svc.wait_state(after, "succeeded", "failed", timeout_s=60)["state"] == "succeeded"
        done = svc.wait_state(ends_while_full, "succeeded", "failed", timeout_s=60)
        assert done["state"] == "succeeded"
        svc.cli("cancel", filler)
        svc.wait_state(filler, "cancelled")
        assert states(svc) == {
            ends_while_full: "succeeded",
            filler: "cancelled",
            after: "succeeded",
        }
    finally:
        fill.unlink(missing_ok=True)
        cancel_all(svc)
        svc.stop()


def test_nodes_prints_a_problem_as_it_is_said_whatever_brackets_it_holds(
    tmp_path: Path, tmpfs: Path
) -> None:
    """`aisched nodes` lists the service's problems, which quote paths and the OS's words. Its
    data directory's path holds `[/x]`: rich read that as a closing tag, and `aisched nodes`
    ended in a MarkupError traceback while the disk was full (and `[Errno 28]`-like words in
    brackets vanished)."""
    svc = tmpfs_service(tmp_path, tmpfs)
    svc.home = tmpfs / "data[" / "x]"  # the path holds "[/x]"
    svc.home.mkdir(parents=True)
    svc.start()
    try:
        fill_up(tmpfs / "fill")

        def pressure() -> str | None:
            code, body = readyz(svc)
            problems = body.get("problems") or []
            return str(problems[0]) if code == 503 and problems else None

        problem = wait_for("readiness to report disk pressure", pressure, 30)
        assert f"the data directory {svc.home}" in problem
        shown = subprocess.run(
            [sys.executable, "-m", "aisched", "nodes"],
            capture_output=True,
            text=True,
            env={**svc.env(), "COLUMNS": "1000"},  # each note on one line
            timeout=60,
        )
        assert (shown.returncode, shown.stderr) == (0, "")
        assert f"  {problem}\n" in shown.stdout
    finally:
        (tmpfs / "fill").unlink(missing_ok=True)
        svc.stop()


def test_a_retry_of_a_submission_kept_while_the_disk_is_full_is_not_told_it_was_refused(
    tmp_path: Path, tmpfs: Path
) -> None:
    # The disk filled between readiness's last look and the submission's write (here: no
    # space kept free, so readiness finds out from the failed write): the submission is kept
    # and answered 503 "not stored yet ... retry with the same Idempotency-Key". The retry
    # was refused at once as new work ("not accepting new jobs: disk pressure"), so `aisched
    # run` said the job was refused; once space came back, it was stored and ran anyway.
    svc = tmpfs_service(tmp_path, tmpfs)
    (tmp_path / "config.yaml").write_text("limits: {disk_min_free: 0M}\ncycle_interval: 0.2s\n")
    svc.start()
    svc.admin_token()
    fill = tmpfs / "fill"
    try:
        fill_up(fill)
        doc = {"command": ["true"]}
        kept = {"Idempotency-Key": "kept-while-full"}
        first = svc.api.post("/v1/jobs", json=doc, headers=kept, timeout=30)
        assert first.status_code == 503, first.text
        assert first.json()["error"].startswith("the submission is not stored yet: ")
        again = svc.api.post("/v1/jobs", json=doc, headers=kept, timeout=30)
        assert (again.status_code, again.json()["error"]) == (503, first.json()["error"])
        new = svc.api.post("/v1/jobs", json=doc, headers={"Idempotency-Key": "new"}, timeout=30)
        assert new.status_code == 507, new.text
        assert new.json()["error"].startswith("the service is not accepting new jobs: disk ")
        fill.unlink()
        stored = wait_for(
            "the kept submission to be stored",
            lambda: (
                (r := svc.api.post("/v1/jobs", json=doc, headers=kept)).status_code == 201
                and r.json()["id"]
            ),
            60,
        )
        assert svc.wait_state(stored, "succeeded", "failed", timeout_s=60)["state"] == "succeeded"
        assert states(svc) == {stored: "succeeded"}
    finally:
        fill.unlink(missing_ok=True)
        cancel_all(svc)
        svc.stop()


# A gang's task: its first attempt holds on through SIGTERM until the file `release` exists
# (a checkpoint being written); a later attempt ends at once. Each start is a line.
HOLDS_ON = (
    'echo "$AISCHED_RESTART_COUNT" >> "$OUT/$AISCHED_TASK"; '
    '[ "$AISCHED_RESTART_COUNT" -gt 0 ] && exit 0; '
    'trap \'touch "$OUT/term-$AISCHED_TASK"; '
    'while [ ! -e "$OUT/release" ]; do sleep 0.1; done; exit 143\' TERM; '
    'touch "$OUT/ready-$AISCHED_TASK"; '
    "while true; do sleep 0.1; done"
)


def test_a_gang_launch_cut_short_is_requeued_even_when_the_next_start_is_killed_too(
    tmp_path: Path,
) -> None:
    # Killed between starting a gang's first task and its second, the scheduler's next start
    # gives the second up and stops the first, to requeue the gang. That requeue was kept in
    # memory alone: killed again while the first task took its grace, the start after took
    # that task's end for a failure of the job's own, and the gang, with no retry left, failed.
    # (The adopted first task was also shown `launching` for as long as it ran.)
    out, work, home = tmp_path / "out", tmp_path / "work", tmp_path / "home"
    for d in (out, work, home):
        d.mkdir()
    svc = Service(home, free_port(), work, ["--gpus", "0", "--cpus", "4", "--mem", "8G"])
    svc.extra_env = {"AISCHED_FAILPOINTS": "pause-mid-launch"}
    svc.start()
    try:
        doc = {
            "command": ["sh", "-c", HOLDS_ON],
            "env": {"OUT": str(out)},
            "replicas": 2,
            "resources": {"cpus": 1, "mem": "64M"},
            "restart": {"policy": "on-failure", "max_retries": 0},
            "grace_period": "5m",
        }
        r = svc.api.post("/v1/jobs", json=doc)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert svc.proc is not None
        wait_for("the scheduler to pause after the first launch", lambda: stopped(svc.proc.pid))
        # Its stop must find its TERM handler in place (a SIGTERM before `trap` ends it at once,
        # and the gang, requeued, starts again whole): the first task says when it is.
        wait_for("the first task to be ready", (out / "ready-main-0").exists)
        svc.kill9()
        svc.extra_env = {}
        svc.start()

        def given_up() -> bool:
            tasks = {t["name"]: t["state"] for t in svc.job(job_id)["tasks"]}
            return tasks == {"main-0": "running", "main-1": "exited"}

        wait_for("the second task to be given up", given_up)
        wait_for("the first task to be stopped", (out / "term-main-0").exists)
        svc.kill9()  # while the first task takes its grace
        svc.start()
        (out / "release").touch()
        done = svc.wait_state(job_id, "succeeded", "failed", timeout_s=60)
        assert done["state"] == "succeeded", [e["message"] for e in done["events"]]
        assert (out / "main-0").read_text().split() == ["0", "1"]
        assert (out / "main-1").read_text().split() == ["1"]  # given up before it started
    finally:
        (out / "release").touch()
        cancel_all(svc)
        svc.stop()


def fill_up(path: Path) -> None:
    """Fill the filesystem of `path` to its last byte (as a runaway task would)."""
    with open(path, "wb", buffering=0) as f:
        for size in (MIB, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


def failed_once(svc: Service) -> tuple[str, Callable[[], dict[str, Any]]]:
    """A job whose first attempt fails and whose retry (10 s later) would succeed, submitted
    and seen failing once; its id, and a reader of its state."""
    doc = {
        "command": ["sh", "-c", '[ "$AISCHED_RESTART_COUNT" -gt 0 ] || exit 1'],
        "restart": {"policy": "on-failure", "max_retries": 1, "backoff": "10s"},
    }
    r = svc.api.post("/v1/jobs", json=doc)
    assert r.status_code == 201, r.text
    job_id = str(r.json()["id"])

    def show() -> dict[str, Any]:
        return dict(svc.api.get(f"/v1/jobs/{job_id}").json())

    wait_for("its first attempt to fail", lambda: show()["failures"] == 1)
    return job_id, show


def test_a_job_due_while_the_disk_is_full_waits_instead_of_failing(
    tmp_path: Path, tmpfs: Path, pg_server: PostgresServer
) -> None:
    # With the store elsewhere (PostgreSQL), a job due to start while the data directory was
    # full was launched anyway: its request could not be written ("No space left on device"),
    # each retry failed the same way, and the job failed for good, its own code never run.
    svc = tmpfs_service(tmp_path, tmpfs)
    svc.args += ["--database", pg_server.create_database()]
    svc.start()
    fill = tmpfs / "fill"
    try:
        job_id, show = failed_once(svc)
        fill_up(fill)  # before its backoff ends

        def held_or_failed() -> dict[str, Any] | None:
            job = show()
            return (
                job if job["state"] != "pending" or job["reason_code"] == "not-considered" else None
            )

        job = wait_for("the job to be held or to fail", held_or_failed, 60)
        assert (job["state"], job["failures"]) == ("pending", 1)
        assert job["reason"].startswith("launches are held: disk pressure: 0 MiB free for the data")
        fill.unlink()
        assert svc.wait_state(job_id, "succeeded", "failed", timeout_s=60)["state"] == "succeeded"
    finally:
        fill.unlink(missing_ok=True)
        cancel_all(svc)
        svc.stop()


def test_sigterm_while_another_process_locks_the_database_exits_within_the_grace(
    tmp_path: Path,
) -> None:
    with local_service(tmp_path, "limits: {shutdown_grace: 3s}\n") as svc:
        keeps = svc.run("--", "sleep", "60")
        svc.wait_state(keeps, "running")
        # "running" is the loop's intent; the supervisor writes its record once the task runs.
        record = svc.home / "tasks" / keeps / "1" / "main-0" / "started.json"
        wait_for("the task's supervisor record", record.exists)
        task_pid = int(json.loads(record.read_text())["child_pid"])
        with database_locked(svc.home / "state.db"):
            # A submission that the wedged store cannot take, in flight at the SIGTERM.
            client = subprocess.Popen(
                [sys.executable, "-m", "aisched", "run", "--", "true"],
                env=svc.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1)
            assert svc.proc is not None
            svc.proc.send_signal(signal.SIGTERM)
            svc.proc.wait(3 + 5)  # the grace, and time for the process to be reaped
            client.kill()
            client.wait()
            os.kill(task_pid, 0)  # raises if gone: the task runs on, for the next start
        svc.start()  # adopts it; cancel_all ends it
        assert svc.job(keeps)["state"] == "running"


def test_a_second_sigterm_exits_at_once(tmp_path: Path) -> None:
    # The first signal's stop must be held up: by a submission the locked store keeps waiting.
    # The step's failure in the log proves it is in the loop's batch, and its request is then
    # answered only after 5 s of a failing store (`until_stored`), which holds the stop so long;
    # the second signal follows the first's "stopping" line, not a guessed sleep.
    config = "limits: {shutdown_grace: 60s, store_busy_timeout: 1s}\n"
    with local_service(tmp_path, config) as svc:
        with database_locked(svc.home / "state.db"):
            assert svc.proc is not None
            client = subprocess.Popen(
                [sys.executable, "-m", "aisched", "run", "--", "true"],
                env=svc.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            wait_for("the submission held by the locked store",
                     lambda: "scheduler step failed" in svc.log.read_text())  # fmt: skip
            svc.proc.send_signal(signal.SIGTERM)
            wait_for("the stop", lambda: "SIGTERM: stopping" in svc.log.read_text())
            svc.proc.send_signal(signal.SIGINT)
            assert svc.proc.wait(10) == 1
            client.kill()
            client.wait()
        assert "aisched: second SIGINT: exiting at once" in svc.log.read_text()


def test_a_submission_cut_short_by_the_stop_is_answered_with_what_is_known(
    tmp_path: Path,
) -> None:
    # Past half the grace the server cancels the requests still running: uvicorn answered
    # them with a bare 500, which the CLI took for another server than aisched, and did not
    # send again. They are answered 503 (`cut_short`), which a client sends again. The step's
    # failure in the log shows the submission held by the locked store; `until_stored` would
    # answer it only after 5 s of that, past the cut (2 s after the SIGTERM).
    config = "limits: {shutdown_grace: 4s, store_busy_timeout: 1s}\n"
    with local_service(tmp_path, config) as svc, database_locked(svc.home / "state.db"):
        assert svc.proc is not None
        client = subprocess.Popen(
            [sys.executable, "-m", "aisched", "run", "--", "true"],
            env=svc.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for("the submission held by the locked store",
                 lambda: "scheduler step failed" in svc.log.read_text())  # fmt: skip
        svc.proc.send_signal(signal.SIGTERM)
        _, err = client.communicate(timeout=30)
        svc.proc.wait(30)
    # Told it may be stored: the client tried again with its key (the service was gone by
    # then), and says how to send it again as itself.
    assert client.returncode != 0
    assert "500" not in err and "not look like an aisched service" not in err, err
    assert "its Idempotency-Key is" in err, err
    assert "Exception in ASGI application" not in svc.log.read_text()


@pytest.mark.parametrize("how", ["run", "submit"])
def test_a_timed_out_submission_is_retried_and_makes_one_job(tmp_path: Path, how: str) -> None:
    job_file = tmp_path / "once.yaml"
    job_file.write_text("name: once\ncommand: echo once\n")
    command = ["run", "--", "echo", "once"] if how == "run" else ["submit", str(job_file)]
    with local_service(tmp_path) as svc:
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import sqlite3, sys, time\n"
             "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(3)",
             str(svc.home / "state.db")],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        run = subprocess.run(
            [sys.executable, "-m", "aisched", *command],
            env={**svc.env(), "AISCHED_SUBMIT_TIMEOUT": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        holder.wait()
        assert (run.returncode, run.stdout, run.stderr) == (0, "1\n", "")
        svc.wait_state("1", "succeeded")
        assert states(svc) == {"1": "succeeded"}
        # The one job carries the key its retries were sent with (so they found it, not a twin).
        with contextlib.closing(sqlite3.connect(svc.home / "state.db")) as db:
            keys = db.execute("SELECT idempotency_key IS NOT NULL FROM jobs").fetchall()
        assert keys == [(1,)]


@pytest.mark.parametrize("how", ["run", "submit"])
def test_a_submission_that_failed_for_the_store_is_sent_again_as_itself_with_its_key(
    tmp_path: Path, how: str
) -> None:
    # Every try times out (the database is locked past them all): the CLI gives up, but the
    # service keeps the submission and stores it once it can. The error names its key; sent
    # again with that key, it is the job already made, not a second one.
    job_file = tmp_path / "once.yaml"
    job_file.write_text("name: once\ncommand: echo once\n")
    command = ["run", "--", "echo", "once"] if how == "run" else ["submit", str(job_file)]
    with local_service(tmp_path) as svc:
        env = {**svc.env(), "AISCHED_SUBMIT_TIMEOUT": "1"}
        released = tmp_path / "release"
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import os, sqlite3, sys, time\n"
             "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True)\n"
             "while not os.path.exists(sys.argv[2]): time.sleep(0.1)",
             str(svc.home / "state.db"), str(released)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
            failed = subprocess.run(
                [sys.executable, "-m", "aisched", *command],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        finally:
            released.touch()
            holder.wait()
        assert (failed.returncode, failed.stdout) == (1, ""), failed.stderr
        key = re.search(r"--idempotency-key (\S+) to get the job it made", failed.stderr)
        assert key is not None, failed.stderr
        again = subprocess.run(
            [sys.executable, "-m", "aisched", command[0], "--idempotency-key", key[1],
             *command[1:]],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert (again.returncode, again.stdout, again.stderr) == (0, "1\n", "")
        svc.wait_state("1", "succeeded")
        assert states(svc) == {"1": "succeeded"}


# --- start-up errors ----------------------------------------------------------------------


def up(home: Path, port: int | None = None, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aisched", "up", "--data-dir", str(home), "--gpus", "1",
         "--port", str(port or free_port()), *more],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_restart_without_what_a_running_task_holds_is_one_line(tmp_path: Path) -> None:
    """Fewer GPUs than running tasks hold was an IndexError traceback; the machine's node
    under another name gave their GPUs to the next job while they ran on them. Every such job
    is named, with the GPUs they need all of (the first way named one job at a time)."""
    with local_service(tmp_path) as svc:
        jobs = [
            svc.run("--gpus", "3", "--", "sleep", "300"),
            svc.run("--gpus", "1", "--", "sleep", "300"),
        ]
        for job in jobs:
            svc.wait_state(job, "running")
            record = svc.home / "tasks" / job / "1" / "main-0" / "started.json"
            wait_for("the task's supervisor record", record.exists)
        node = svc.cli_json("nodes", "--json")["nodes"][0]["name"]
        svc.stop()  # the tasks run on
        wait = "or stop them first (start as before, then aisched cancel); or let them end"
        assert one_line(up(svc.home, None, "--socket", "", "--gpus", "2")) == (
            f"error: jobs {jobs[0]}, {jobs[1]} run on GPUs 2, 3 of node {node}, which now has 2 "
            f"GPU(s): start with at least 4 (--gpus) until they end, {wait}"
        )
        renamed = tmp_path / "renamed.yaml"
        renamed.write_text("node: {name: renamed}\n")
        got = up(svc.home, None, "--socket", "", "--gpus", "4", "--config", str(renamed))
        assert one_line(got) == (
            f"error: jobs {jobs[0]}, {jobs[1]} run on node {node}, and this machine's node is "
            f"now named renamed: start with the node named {node} (node.name in the config "
            f"file) until they end, {wait}"
        )
        svc.start()  # as before: it adopts the tasks, which ran on
        assert [svc.job(job)["state"] for job in jobs] == ["running", "running"]


def test_a_start_on_a_full_disk_unwatched_is_one_line(tmp_path: Path, tmpfs: Path) -> None:
    """With `disk_min_free: 0` (not watched) the start's check of free space passes, and the
    first write on the full disk was a traceback: the lock file's pid (its failed write failed
    again as the file closed), or the lease's first write."""
    config = tmp_path / "config.yaml"
    config.write_text("limits: {disk_min_free: 0, disk_min_free_inodes: 0}\n")
    args = ["--gpus", "1", "--config", str(config)]
    (tmp_path / "work").mkdir()
    (tmpfs / "old").mkdir()
    old = Service(tmpfs / "old", free_port(), tmp_path / "work", args)
    old.start()  # a data directory used before: its files are there
    old.stop()
    # Its write-ahead log too, not yet copied into the database (as after a kill -9): the
    # lease's write must add to it.
    kept = sqlite3.connect(old.home / "state.db")
    kept.execute("PRAGMA wal_autocheckpoint=0")
    kept.execute("INSERT INTO meta VALUES ('filler', ?)", ("x" * 8192,))
    kept.commit()
    fill = subprocess.Popen([sys.executable, "-c", FILL, str(tmpfs / "fill")])
    try:
        wait_for("the disk to be full", lambda: shutil.disk_usage(tmpfs).free < 4096, 60)
        new = tmpfs / "new"
        assert one_line(up(new, None, "--socket", "", *args)) == (
            f"error: the data directory {new} has no space left; free some space"
        )
        assert one_line(up(old.home, None, "--socket", "", *args)) == (
            f"error: the state database {old.home / 'state.db'} cannot be written: the disk is "
            "full; free some space"
        )
    finally:
        kept.close()
        fill.kill()
        fill.wait()


def test_a_second_service_on_one_sqlite_database_is_refused(tmp_path: Path) -> None:
    """Given another --data-dir and the first one's state.db as --database, a second service
    started: it adopted the first one's task and recorded its end twice."""
    (tmp_path / "first").mkdir()
    with local_service(tmp_path / "first") as svc:
        assert svc.proc is not None
        db = svc.home / "state.db"
        got = up(tmp_path / "second", None, "--socket", "", "--database", f"sqlite:///{db}")
        assert one_line(got) == (
            f"error: the state database {db} is in use by another aisched (pid {svc.proc.pid}) "
            "with another data directory: an SQLite database has one service; stop that one, "
            "or give this one another --database"
        )
        assert not (tmp_path / "second" / "tasks").exists()


def test_a_bad_flag_is_named_by_the_flag_not_by_the_config_file(tmp_path: Path) -> None:
    """`--port 70000` beside a config file that has no port was `CONFIG: port: ...`, and
    without one `defaults: port: ...`."""
    config = tmp_path / "config.yaml"
    config.write_text("cycle_interval: 1s\n")
    assert one_line(up(tmp_path / "a", 70000, "--config", str(config))) == (
        "error: --port: must be at most 65,535, got 70000"
    )
    assert one_line(up(tmp_path / "b", None, "--gpus", "-1")) == (
        "error: --gpus: must be at least 0, got -1"
    )
    config.write_text("cycle_interval: 0\n")  # the file's own mistake is still the file's
    assert one_line(up(tmp_path / "c", None, "--config", str(config))).startswith(
        f"error: {config}: cycle_interval: 0 is below 0.1s"
    )


def test_a_memory_limit_this_machine_lacks_is_one_line(tmp_path: Path) -> None:
    """It was a MemoryControlError traceback with exit status 1."""
    from aisched.executors.cgroups import MemoryControlError, choose_memory_control

    for mechanism in ("cgroup-v2", "cgroup-v1"):
        try:
            choose_memory_control(mechanism)
        except MemoryControlError as e:
            why = str(e)
            break
    else:
        pytest.skip("this machine has both cgroup-v2 and cgroup-v1 memory control")
    got = one_line(up(tmp_path / "home", None, "--memory-limit", mechanism))
    assert got == f"error: memory_limit: {why}"


def one_line(got: subprocess.CompletedProcess[str]) -> str:
    assert (got.returncode, got.stdout) == (2, ""), got.stderr
    lines = got.stderr.splitlines()
    assert len(lines) == 1, got.stderr
    return lines[0]


def test_a_missing_data_directory_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.symlink_to(tmp_path / "unmounted" / "volume")
    assert one_line(up(home)) == (
        f"error: the data directory {home} is a link to {tmp_path / 'unmounted' / 'volume'}, "
        "which does not exist (is its filesystem mounted?); mount it, or give another --data-dir"
    )


def test_a_foreign_data_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('mine')\n")
    (tmp_path / "data").mkdir()
    assert one_line(up(tmp_path)) == (
        f"error: the data directory {tmp_path} is not aisched's: it holds other files (data, "
        "train.py); give an empty or new directory as --data-dir"
    )


def test_a_damaged_database_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"\x00garbage" * 1000)
    assert one_line(up(tmp_path)).startswith(
        f"error: the state database {tmp_path / 'state.db'} is damaged (file is not a database)"
    )


def test_a_newer_database_is_one_line(tmp_path: Path) -> None:
    Store(f"sqlite:///{tmp_path / 'state.db'}").close()
    import sqlite3

    con = sqlite3.connect(tmp_path / "state.db")
    newer = SCHEMA_VERSION + 1
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(newer),))
    con.commit()
    con.close()
    assert one_line(up(tmp_path)).startswith(
        f"error: {tmp_path / 'state.db'} was written by a newer aisched (schema version {newer};"
    )


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert one_line(up(tmp_path / "home", port)) == (
            f"error: cannot listen on 127.0.0.1:{port}: Address already in use; another "
            "program (another aisched up?) has it: stop it, or give --port"
        )


def test_a_read_only_data_directory_is_one_line(tmpfs: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    assert one_line(up(tmpfs)) == (
        f"error: the data directory {tmpfs} is not writable (Read-only file system); give a "
        "writable --data-dir, or remount or fix its permissions"
    )


def test_a_full_data_directory_is_one_line(tmpfs: Path) -> None:
    # 64 MiB is below the 256 MiB aisched keeps free by default.
    line = one_line(up(tmpfs))
    assert line.startswith(f"error: the data directory {tmpfs} has only ")
    assert line.endswith(
        "MiB free, below the 256 MiB that aisched keeps free (limits.disk_min_free); free some "
        "space, or lower the limit"
    )


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB ext4 file system (a loop device) that turns read-only on its first error, as
    a disk failing under a running service makes it; `fs_error` raises one."""
    with ext4_mounted(tmp_path) as mnt:
        yield mnt


@pytest.fixture
def ext4_few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB ext4 file system with room for 12,000 files, a few more than aisched keeps
    free by default: many small ones use them all up with bytes to spare."""
    with ext4_mounted(tmp_path, "-N", "12000") as mnt:
        yield mnt


@contextlib.contextmanager
def ext4_mounted(tmp_path: Path, *mkfs_args: str) -> Iterator[Path]:
    why = _can_mount()
    if why is not None:
        pytest.skip(why)
    img, mnt = tmp_path / "ext4.img", tmp_path / "ext4"
    mnt.mkdir()
    with img.open("wb") as f:
        f.truncate(64 * MIB)
    for cmd in (["mkfs.ext4", "-q", "-F", *mkfs_args, str(img)],
                ["mount", "-o", "loop,errors=remount-ro", str(img), str(mnt)]):  # fmt: skip
        try:
            got = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip(f"{cmd[0]} is not installed")
        if got.returncode != 0:
            pytest.skip(f"cannot make an ext4 file system here: {got.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fs_error(mnt: Path) -> None:
    """An error of the file system at `mnt` (ext4's own trigger): it is read-only from then."""
    dev = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", str(mnt)], capture_output=True, text=True, check=True
    ).stdout.strip()
    trigger = Path("/sys/fs/ext4", os.path.basename(dev), "trigger_fs_error")
    if not trigger.exists():
        pytest.skip("this kernel cannot raise an ext4 error on demand")
    trigger.write_text("test")


def test_a_data_directory_turned_read_only_under_the_service_is_reported_and_stops_cleanly(
    tmp_path: Path, ext4: Path
) -> None:
    # A disk error turns the data directory read-only while a job runs: the task runs on
    # (once), readiness names the read-only directory at once (it said "ready" until a write
    # failed, and took a submission it could not store), a submission is refused with the
    # reason, and a stop is the usual one. It ended in a traceback: the stop's removal of the
    # service's announcement (server.json) failed.
    svc = tmpfs_service(tmp_path, ext4)
    svc.start()
    svc.admin_token()
    out = tmp_path / "out"
    try:
        job = svc.run("--", "sh", "-c", f"sleep 2; echo once >> {out}")
        svc.wait_state(job, "running")
        fs_error(ext4)
        wait_for("the task to end", out.exists)

        # Not ready, before any write has failed (the task's end is not reported yet: its
        # supervisor cannot record it either, and waits).
        read_only = f"disk pressure: the data directory {svc.home}: read-only file system"
        wait_for("readiness to name it", lambda: readyz(svc)[1]["problems"] == [read_only])
        assert readyz(svc)[0] == 503
        r = svc.api.post("/v1/jobs", json={"command": ["true"]}, timeout=30)
        assert r.status_code == 507
        assert r.json()["error"] == f"the service is not accepting new jobs: {read_only}"
        assert svc.job(job)["state"] == "running"  # its end is not stored yet, nor lost
        assert out.read_text() == "once\n"
        svc.stop()
        assert svc.proc is not None and svc.proc.returncode == 0
        stopping = svc.log.read_text().split("SIGTERM: stopping")[1]
        assert "Traceback" not in stopping
    finally:
        svc.stop()


# Prints a numbered line of 200 bytes every 20 ms and notes the count outside the data
# directory, until the file `release` exists; then a last line.
TICKS = (
    "import os, sys, time\n"
    "n = 0\n"
    "while not os.path.exists(sys.argv[2]):\n"
    "    n += 1\n"
    "    print(f'tick {n} '.ljust(199, '.'), flush=True)\n"
    "    with open(sys.argv[1], 'w') as f:\n"
    "        f.write(str(n))\n"
    "    time.sleep(0.02)\n"
    "print('last', flush=True)\n"
)


def test_a_task_writing_while_the_log_disk_is_full_runs_on_and_its_log_says_what_was_lost(
    tmp_path: Path, tmpfs: Path
) -> None:
    svc = tmpfs_service(tmp_path, tmpfs)
    svc.start()
    count, release = tmp_path / "count", tmp_path / "release"
    fill = tmpfs / "fill"

    def ticks() -> int:
        return int(count.read_text() or 0) if count.exists() else 0

    try:
        job = svc.run("--", sys.executable, "-c", TICKS, str(count), str(release))
        wait_for("the task to write", lambda: ticks() > 5)
        with open(fill, "wb", buffering=0) as f:  # the disk full, as a runaway task makes it
            for size in (1 << 20, 4096, 1):
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * size)
        full_at = ticks()
        wait_for("the task to write on while the disk is full", lambda: ticks() > full_at + 50)
        fill.unlink()
        release.touch()
        done = svc.wait_state(job, "succeeded", "failed", timeout_s=60)
        assert done["state"] == "succeeded"
        assert [e["kind"] for e in done["events"]].count("task-exited") == 1
        log = svc.cli("logs", job).stdout
        lost = [line for line in log.splitlines() if "bytes of output lost" in line]
        assert lost and "No space left on device" in lost[0], log[-2000:]
        assert log.splitlines()[-1] == "last"
        # Every byte the task wrote is either in the log or counted as lost: its tick lines
        # are 200 bytes with their newline; a line cut short by the full disk is ended by
        # aisched's own newline before the note.
        kept = sum(
            len(line) + (line == "last" or len(line) == 199)
            for line in log.splitlines()
            if not line.startswith("aisched: ")
        )
        counted = sum(
            int(n) for n in re.findall(r"^aisched: (\d+) bytes of output lost", log, re.M)
        )
        assert kept + counted == 200 * ticks() + len("last\n"), (kept, counted, ticks())
    finally:
        fill.unlink(missing_ok=True)
        cancel_all(svc)
        svc.stop()


def test_a_data_directory_out_of_inodes_is_disk_pressure_and_holds_launches(
    tmp_path: Path, ext4_few_inodes: Path
) -> None:
    # Many small files use up a filesystem's inodes with bytes to spare, and then no file can
    # be made. Readiness said ready, submissions were taken, and a job due to start was
    # launched: its checkpoint directory could not be made ("No space left on device"), each
    # retry failed the same way, and the job failed for good, its own code never run.
    svc = tmpfs_service(tmp_path, ext4_few_inodes)
    svc.start()
    svc.admin_token()
    files = ext4_few_inodes / "files"
    try:
        job_id, show = failed_once(svc)
        files.mkdir()  # before its backoff ends: empty files until no inode is left
        with contextlib.suppress(OSError):
            for n in range(100_000):
                (files / str(n)).touch()

        def held_or_failed() -> dict[str, Any] | None:
            job = show()
            return (
                job if job["state"] != "pending" or job["reason_code"] == "not-considered" else None
            )

        job = wait_for("the job to be held or to fail", held_or_failed, 60)
        assert (job["state"], job["failures"]) == ("pending", 1), job["events"]
        pressure = (
            f"disk pressure: 0 inodes free for the data directory {svc.home}, below the 10000 "
            "it keeps free (no new file can be made)"
        )
        assert job["reason"] == f"launches are held: {pressure}"
        code, body = readyz(svc)
        assert (code, body["problems"]) == (503, [pressure])
        r = svc.api.post("/v1/jobs", json={"command": ["true"]}, timeout=30)
        assert (r.status_code, r.json()["error"]) == (
            507,
            f"the service is not accepting new jobs: {pressure}",
        )
        shutil.rmtree(files)
        assert svc.wait_state(job_id, "succeeded", "failed", timeout_s=60)["state"] == "succeeded"
        assert states(svc) == {job_id: "succeeded"}
    finally:
        shutil.rmtree(files, ignore_errors=True)
        cancel_all(svc)
        svc.stop()

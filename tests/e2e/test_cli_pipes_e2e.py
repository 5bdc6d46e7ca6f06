"""The CLI into a pipe, against the real service: a reader that stops early (`| head`) ends a
command quietly, and `aisched top` prints frame after frame where it cannot redraw."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import resource
import subprocess
import sys
import threading

from harness import Service, wait_for


def test_a_reader_that_stops_early_ends_a_json_answer_quietly(service: Service) -> None:
    """`aisched show --json` of a job with 100 KB of environment, read 100 bytes at a time and
    the pipe closed after the first: exit status 1 and nothing on stderr, as for the tables
    (rich's). Before: a BrokenPipeError traceback."""
    env = {f"V{i}": "a" * 1000 for i in range(100)}
    doc = {"name": "big", "tasks": [{"name": "main", "command": ["true"], "env": env}]}
    (service.work / "big.json").write_text(json.dumps(doc))
    jid = str(service.cli_json("submit", "big.json")["id"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "aisched", "show", jid, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=service.env(),
        cwd=service.work,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100).startswith(b"{")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=60), err) == (1, "")


def test_top_into_a_pipe_prints_one_frame_after_another(service: Service) -> None:
    """Where nothing can be redrawn, `top` prints each frame (rich's Live drew a pipe's frame
    only when it stopped, so `aisched top | grep ...` printed nothing before it was killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aisched", "top", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=service.env(),
        cwd=service.work,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        # Each frame starts with its summary line.
        wait_for("two frames", lambda: sum(x.startswith("aisched ") for x in lines) >= 2, 20)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=30)


def test_a_log_larger_than_the_clients_memory_is_written_as_it_comes(service: Service) -> None:
    """`aisched logs` without -f read the whole answer into one string first (a 64-task gang's
    log took the client 1.2 GB): it is written as it comes now, as with -f."""
    job = service.run(
        "--replicas", "4", "--", sys.executable, "-c",
        "import sys\nline = 'y' * 1023 + '\\n'\nfor _ in range(9 * 1024): sys.stdout.write(line)",
    )  # fmt: skip
    assert service.wait_state(job, "succeeded", "failed")["state"] == "succeeded"
    limit = 100 * 2**20  # the client's data segment: well under 3 copies of the 36 MiB log

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    got = subprocess.run(
        [sys.executable, "-m", "aisched", "logs", job],
        capture_output=True, env=service.env(), cwd=service.work, timeout=120,
        preexec_fn=bounded,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.count(b"y" * 1023 + b"\n") == 4 * 9 * 1024


def test_a_cut_job_list_says_how_to_see_the_rest(service: Service) -> None:
    """`aisched jobs` cut at its --limit ends with a line on stderr saying how to see more (the
    table on stdout stays rows alone); --json has `more` and `next_before`, and --before lists
    the next page. Before: the list was cut silently."""
    ids = [service.run("--", "true") for _ in range(3)][::-1]  # newest first, as listed
    cut = service.cli("jobs", "--all", "--limit", "2")
    assert [line.split()[0] for line in cut.stdout.splitlines()[1:]] == ids[:2]
    assert cut.stderr.splitlines()[-1] == f"... more jobs: --limit 20 or --before {ids[1]}"
    assert service.cli_json("jobs", "--all", "--limit", "2")["more"] is True
    rest = service.cli("jobs", "--all", "--limit", "2", "--before", ids[1])
    assert ([line.split()[0] for line in rest.stdout.splitlines()[1:]], rest.stderr) == (
        ids[2:],
        "",
    )
    whole = service.cli_json("jobs", "--all", "--limit", "3")
    assert ([j["id"] for j in whole["jobs"]], whole["more"], whole["next_before"]) == (
        ids,
        False,
        None,
    )


def test_show_into_a_pipe_writes_whole_lines(service: Service) -> None:
    """`aisched show | ...` is read by grep, as `jobs` is: rich wrapped it at 80 columns (the
    attempts line's `max retries` / `3)`) and cut the LOG path (`.../main-0.l…`)."""
    job = service.run("--", "true")
    service.wait_state(job, "succeeded")
    log_path = service.job(job)["tasks"][0]["log_path"]
    assert len(log_path) > 40  # with the columns before it, past 80
    lines = service.cli("show", job).stdout.splitlines()
    attempts = next(line for line in lines if line.lstrip().startswith("attempts"))
    assert attempts.endswith("restart on-failure, max retries 3)")
    assert lines[lines.index("attempt 1") + 2].split()[-1] == log_path


def test_a_long_name_leaves_why_its_share_of_an_80_column_terminal(service: Service) -> None:
    """On a terminal, NAME is cut so that WHY / ETA keeps room: one 35-character name left
    every row's WHY a bare `…` at 80 columns. A pipe still gets the whole name."""
    name = "a-rather-long-experiment-name-x-035"
    job = service.run("--name", name, "--", "sleep", "60")
    service.wait_state(job, "running")
    main, sub = pty.openpty()
    try:
        subprocess.run(
            [sys.executable, "-m", "aisched", "jobs"],
            stdout=sub,
            env={**service.env(), "COLUMNS": "80", "TERM": "dumb"},
            cwd=service.work,
            timeout=60,
            check=True,
        )
        os.close(sub)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once all is read and the writer is gone
            while chunk := os.read(main, 65536):
                shown += chunk
    finally:
        os.close(main)
    row = shown.decode().splitlines()[1]
    assert len(row) <= 80 and row.endswith("attempt 1"), row
    assert name in service.cli("jobs").stdout


def test_a_message_on_stderr_into_a_file_is_one_line(service: Service) -> None:
    """`aisched run -f 2>err.txt`: the job's last word was wrapped at rich's width (80 columns,
    or $COLUMNS: 40 here), mid-sentence (`restart policy is` / `never`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "aisched", "run", "-f", "--restart", "never", "--",
         "sh", "-c", "exit 3"],
        capture_output=True, text=True, env={**service.env(), "COLUMNS": "40"},
        cwd=service.work, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3
    last = proc.stderr.splitlines()[-1]
    assert last.endswith("failed: task main-0 exited with code 3; restart policy is never")


def test_show_quotes_a_command_as_a_shell_would_need_it(service: Service) -> None:
    """`sh -c 'echo a b'` was shown as `sh -c echo a b`, which a shell reads as `sh -c echo`."""
    job = service.run("--", "sh", "-c", "echo a b")
    tasks = next(
        line for line in service.cli("show", job).stdout.splitlines() if "tasks main" in line
    )
    assert tasks.endswith("): sh -c 'echo a b'")

"""End to end: the real service on a loopback port, driven by the real CLI, running real tasks.

Tasks coordinate through files in the test's work directory (the jobs' working directory), so
nothing depends on timing: a task that must wait blocks until a release file appears.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Service, free_port, wait_for

PY = sys.executable

# Appends "start RANK ATTEMPT PID TIME" to starts.log, blocks until `release` exists, and on
# SIGTERM appends "stop RANK ATTEMPT TIME" and exits.
HOLD = textwrap.dedent(
    """
    import os, signal, sys, time
    rank, attempt = os.environ["RANK"], os.environ["AISCHED_RESTART_COUNT"]
    def log(line):
        with open("starts.log", "a") as f:
            f.write(line + "\\n")
    def term(*_):
        log(f"stop {rank} {attempt} {time.time()}")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    log(f"start {rank} {attempt} {os.getpid()} {time.time()}")
    with open(f"pid-{rank}-{attempt}", "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    """
)

WAIT = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


def write(service: Service, name: str, text: str) -> str:
    (service.work / name).write_text(text)
    return name


def starts(service: Service) -> list[list[str]]:
    path = service.work / "starts.log"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.startswith("start")]


def test_a_gang_starts_together_each_task_with_its_own_gpu_rank_and_cores(service: Service) -> None:
    script = write(
        service,
        "gang.py",
        textwrap.dedent(
            """
            import json, os, sys, time
            env = {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE",
                   "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "AISCHED_TASK", "OMP_NUM_THREADS")}
            env["cores"] = sorted(os.sched_getaffinity(0))
            open(f"ready-{env['RANK']}", "w").close()
            deadline = time.time() + 20   # both tasks must be running at the same time
            while not (os.path.exists("ready-0") and os.path.exists("ready-1")):
                if time.time() > deadline:
                    sys.exit("the other task never started")
                time.sleep(0.05)
            print(json.dumps(env))
            """
        ),
    )
    jid = service.run("--gpus", "1", "--replicas", "2", "--name", "gang", "--", PY, script)
    job = service.wait_state(jid, "succeeded", "failed")
    assert job["state"] == "succeeded", service.cli("logs", jid).stdout
    seen = {}
    for line in service.cli("logs", jid).stdout.splitlines():
        task, _, payload = line.partition(" ")
        seen[task] = json.loads(payload)
    assert sorted(seen) == ["[main-0]", "[main-1]"]
    a, b = seen["[main-0]"], seen["[main-1]"]
    assert (a["RANK"], b["RANK"], a["WORLD_SIZE"], b["WORLD_SIZE"]) == ("0", "1", "2", "2")
    assert {a["CUDA_VISIBLE_DEVICES"], b["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    assert (a["LOCAL_RANK"], b["LOCAL_RANK"]) == ("0", "1")
    assert a["MASTER_PORT"] == b["MASTER_PORT"] and a["MASTER_ADDR"] == "127.0.0.1"
    assert len(a["cores"]) == len(b["cores"]) == 1 and a["cores"] != b["cores"]
    assert [t["gpus"] for t in job["tasks"]] in ([[0], [1]], [[1], [0]])


def test_a_job_waits_while_gpus_are_busy_and_starts_when_they_free_up(service: Service) -> None:
    first = service.run("--gpus", "4", "--", PY, "-c", WAIT, "release-first")
    service.wait_state(first, "running")
    second = service.run("--gpus", "2", "--", PY, "-c", "print('second ran')")
    time.sleep(0.5)
    shown = service.cli("show", second).stdout
    assert "pending" in shown and "waiting because" in shown
    assert service.job(second)["reason"]
    listed = service.cli("jobs").stdout
    assert first in listed and "running" in listed and "pending" in listed
    (service.work / "release-first").touch()
    done = service.wait_state(second, "succeeded", "failed")
    assert done["state"] == "succeeded"
    assert done["started_at"] >= service.job(first)["finished_at"]
    assert service.cli("logs", second).stdout == "second ran\n"


def test_high_priority_preempts_low_which_resumes_from_its_checkpoint(service: Service) -> None:
    script = write(
        service,
        "train.py",
        textwrap.dedent(
            """
            import os, pathlib, signal, sys, time
            ckpt = pathlib.Path(os.environ["AISCHED_CHECKPOINT_DIR"]) / "step"
            step = int(ckpt.read_text()) if ckpt.exists() else 0
            print(f"restart={os.environ['AISCHED_RESTART_COUNT']} step={step} "
                  f"dir={os.environ['AISCHED_CHECKPOINT_DIR']}", flush=True)
            def term(*_):
                ckpt.write_text(str(step))
                print(f"checkpointed step={step}", flush=True)
                sys.exit(0)
            signal.signal(signal.SIGTERM, term)
            open("low-started", "w").close()
            while not os.path.exists("release-low"):
                step += 1
                time.sleep(0.01)
            print("done", flush=True)
            """
        ),
    )
    low = service.run("--gpus", "4", "--priority", "0", "--name", "low", "--", PY, script)
    wait_for("the low job's signal handler", (service.work / "low-started").exists)
    time.sleep(0.2)
    (service.work / "low-started").unlink()
    high = service.run("--gpus", "4", "--priority", "10", "--", PY, "-c", "print('high ran')")
    assert service.wait_state(high, "succeeded", "failed")["state"] == "succeeded"
    again = service.wait_state(low, "running")
    assert again["attempt"] == 2 and again["preemptions"] == 1
    wait_for("the low job to restart", (service.work / "low-started").exists)
    (service.work / "release-low").touch()
    final = service.wait_state(low, "succeeded", "failed")
    assert final["state"] == "succeeded"
    kinds = [e["kind"] for e in final["events"]]
    assert "preempting" in kinds and "preempted" in kinds
    # Like slurmstepd, the supervisor notes a stop in the task's log ("aisched: ...").
    first = service.cli("logs", low, "--attempt", "1").stdout.splitlines()
    assert any(line.startswith("aisched: stop requested") for line in first)
    first = [line for line in first if not line.startswith("aisched:")]
    second = service.cli("logs", low).stdout.splitlines()
    ckpt_dir = final["checkpoint_dir"]
    assert first[0] == f"restart=0 step=0 dir={ckpt_dir}"
    assert first[1].startswith("checkpointed step=")
    saved = int(first[1].split("=")[1])
    assert saved > 0
    assert second[0] == f"restart=1 step={saved} dir={ckpt_dir}"
    assert second[-1] == "done"


def test_a_failing_job_is_retried_up_to_its_limit(service: Service) -> None:
    write(
        service,
        "flaky.yaml",
        textwrap.dedent(
            f"""
            name: flaky
            command: ["{PY}", "-c", "import sys; print('trying'); sys.exit(3)"]
            resources: {{cpus: 1, mem: 256M}}
            restart: {{policy: on-failure, max_retries: 2, backoff: 0.2s}}
            """
        ),
    )
    jid = service.cli_json("submit", "flaky.yaml")["id"]
    job = service.wait_state(jid, "failed", "succeeded")
    assert (job["state"], job["attempt"], job["failures"], job["exit_code"]) == ("failed", 3, 3, 3)
    assert job["message"] == "task main-0 exited with code 3; no retries left (2)"
    assert [e["kind"] for e in job["events"]].count("retrying") == 2
    for attempt in ("1", "2", "3"):
        assert service.cli("logs", jid, "--attempt", attempt).stdout == "trying\n"


def test_a_clean_exit_under_restart_always_waits_its_backoff_before_the_next_attempt(
    service: Service,
) -> None:
    """`true` under `always` restarted in the same second as each exit: 1,800 attempts in 80 s,
    each with a log directory of its own. Now each restart waits the job's backoff, doubled
    for each quick exit in a row."""
    write(
        service,
        "again.yaml",
        'name: again\ncommand: ["true"]\nrestart: {policy: always, backoff: 2s}\n',
    )
    jid = service.cli_json("submit", "again.yaml")["id"]

    # Between two attempts it waits, and says why.
    def waiting_to_restart() -> dict[str, Any] | None:
        j = service.job(jid)
        return j if j["attempt"] >= 1 and j["state"] == "pending" else None

    waiting = wait_for("the first restart's wait", waiting_to_restart, 30)
    assert waiting["reason"].startswith("restart (policy always) after a clean exit, not before ")
    time.sleep(5)
    job = service.job(jid)
    assert job["attempt"] <= 5, job["attempt"]  # one every 2 s at most
    assert job["failures"] == 0
    restarts = [e["message"] for e in job["events"] if e["kind"] == "restarting"]
    assert restarts[0] == "all tasks exited; restart policy is always: restarting in 2s"
    # Quick exits in a row double the wait, as a crash loop's (lifecycle.attempts).
    waits = [float(m.split("restarting in ")[1].split("s")[0]) for m in restarts]
    assert waits == [2.0 * 2**i for i in range(len(waits))]
    service.cli("cancel", jid)
    service.wait_state(jid, "cancelled")


def test_kill_9_of_the_service_loses_nothing_and_runs_nothing_twice(service: Service) -> None:
    hold = write(service, "hold.py", HOLD)
    gang = service.run("--gpus", "1", "--replicas", "2", "--", PY, hold, "release")
    wait_for("both tasks to start", lambda: len(starts(service)) == 2)
    waiting = service.run("--gpus", "4", "--", PY, "-c", "print('after the gang')")
    wait_for("the waiting job's reason", lambda: service.job(waiting)["reason"])
    service.kill9()
    pids = [int(s[3]) for s in starts(service)]
    for pid in pids:
        os.kill(pid, 0)  # the tasks live on without the scheduler
    service.start()
    job = service.job(gang)
    assert (job["state"], job["attempt"]) == ("running", 1)
    assert [e["kind"] for e in job["events"]].count("adopted") == 2
    assert service.job(waiting)["state"] == "pending"
    (service.work / "release").touch()
    assert service.wait_state(gang, "succeeded", "failed")["state"] == "succeeded"
    assert service.wait_state(waiting, "succeeded", "failed")["state"] == "succeeded"
    assert len(starts(service)) == 2  # each task ran exactly once


def test_a_task_that_dies_while_the_service_is_down_is_retried_after_its_gang_stopped(
    service: Service,
) -> None:
    hold = write(service, "hold.py", HOLD)
    gang = service.run("--gpus", "1", "--replicas", "2", "--", PY, hold, "release")
    wait_for("both tasks to start", lambda: len(starts(service)) == 2)
    service.kill9()
    victim = next(int(s[3]) for s in starts(service) if s[1] == "1")
    os.kill(victim, signal.SIGKILL)
    service.start()
    wait_for("the retry", lambda: len(starts(service)) == 4, timeout_s=40)
    job = service.job(gang)
    assert (job["attempt"], job["failures"]) == (2, 1)
    lines = (service.work / "starts.log").read_text().splitlines()
    stopped = [float(x.split()[3]) for x in lines if x.startswith("stop 0 0")]
    retried = [float(x.split()[4]) for x in lines if x.startswith("start") and x.split()[2] == "1"]
    # The surviving task of attempt 1 was stopped before any task of attempt 2 started.
    assert len(stopped) == 1 and len(retried) == 2 and stopped[0] <= min(retried)
    (service.work / "release").touch()
    assert service.wait_state(gang, "succeeded", "failed")["state"] == "succeeded"


def test_cancel_stops_a_running_job_and_its_processes(service: Service) -> None:
    hold = write(service, "hold.py", HOLD)
    jid = service.run("--gpus", "2", "--", PY, hold, "never")
    wait_for("the task to start", lambda: len(starts(service)) == 1)
    pid = int(starts(service)[0][3])
    out = service.cli("cancel", jid).stdout
    assert out == f"job {jid}: cancelling (tasks stopping)\n"
    assert service.wait_state(jid, "cancelled")["message"] == "cancelled"

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for("the task's process to end", gone)
    bad = service.cli("cancel", jid, check=False)
    assert bad.returncode == 2 and "has already ended (cancelled)" in bad.stderr


def test_a_task_over_its_memory_limit_is_stopped(service: Service) -> None:
    jid = service.run(
        "--mem", "64M", "--restart", "never", "--",
        PY, "-c", "x = bytearray(512 * 1024 * 1024); print('allocated')",
    )  # fmt: skip
    job = service.wait_state(jid, "failed", "succeeded")
    assert job["state"] == "failed"
    logs = service.cli("logs", jid).stdout
    assert "memory limit" in job["message"] or "MemoryError" in logs
    assert "allocated" not in logs


BAD_FILES = [
    ("syntax.yaml", "name: x\ncommand: [a, b\n", ["syntax.yaml:3:1: YAML syntax error"]),
    ("unknown.yaml", "command: ['true']\nresources: {cpus: 1, gpuz: 2}\n", ["resources.gpuz"]),
    ("negative.yaml", "command: ['true']\nresources: {cpus: -1}\n", ["resources.cpus"]),
    ("absurd.yaml", "command: ['true']\nreplicas: 100000000\n", ["replicas"]),
    ("toobig.yaml", "command: ['true']\nresources: {gpus: 8}\n", ["can never fit"]),
    ("toomany.yaml", "command: ['true']\nreplicas: 5\nresources: {gpus: 1}\n", ["can never fit"]),
]


@pytest.mark.parametrize(("name", "text", "wants"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_input_is_refused_with_its_field_and_nothing_is_created(
    service: Service, name: str, text: str, wants: list[str]
) -> None:
    write(service, name, text)
    proc = service.cli("submit", name, check=False)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("error: ")
    for want in wants:
        assert want in proc.stderr
    assert "Traceback" not in proc.stderr
    assert service.cli_json("jobs", "--all")["jobs"] == []
    assert service.api.get("/v1/healthz").json() == service.alive_leader()


def test_bad_requests_over_http_get_4xx_and_the_service_stays_up(service: Service) -> None:
    api = service.api
    cases = [
        api.post("/v1/jobs", content=b"\xff\xfe", headers={"content-type": "text/yaml"}),
        api.post("/v1/jobs", content=b"[1, 2", headers={"content-type": "application/json"}),
        api.post("/v1/jobs", json=[1, 2]),
        api.post("/v1/jobs", json={"command": ["true"], "resources": {"mem": "lots"}}),
        api.post("/v1/jobs", content=b"x" * (2 << 20)),
        api.get("/v1/jobs/404"),
        api.get("/v1/jobs", params={"state": "sleeping"}),
        api.get("/v1/jobs", params={"limit": "-3"}),
        api.post("/v1/jobs/404/cancel"),
    ]
    assert [r.status_code for r in cases] == [422, 422, 422, 422, 413, 404, 422, 422, 404]
    for r in cases:
        assert r.json()["error"]
    assert "resources.mem" in "\n".join(cases[3].json()["problems"])
    # The CLI checks its counts with the spec's own parsers, as it does --mem: one line.
    proc = service.cli("run", "--cpus", "-2", "--", "true", check=False)
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --cpus: '-2' is not a CPU count: give e.g. 4, 0.5 or 500m\n",
    )
    proc = service.cli("run", "--mem", "12", "--", "true", check=False)
    assert proc.returncode == 2 and "give a unit" in proc.stderr
    assert api.get("/v1/healthz").json() == service.alive_leader()
    assert service.cli_json("jobs", "--all")["jobs"] == []


def test_nodes_queues_metrics_and_openapi(service: Service) -> None:
    hold = write(service, "hold.py", HOLD)
    jid = service.run("--gpus", "2", "--", PY, hold, "release")
    wait_for("the task to start", lambda: len(starts(service)) == 1)
    nodes = service.cli_json("nodes")["nodes"]
    assert len(nodes) == 1
    node = nodes[0]
    assert len(node["gpus"]) == 4 and node["memory_limit"] in ("cgroup-v2", "cgroup-v1", "rlimit")
    used = [g for g in node["gpus"] if g["used_by"]]
    assert [u["job"] for g in used for u in g["used_by"]] == [jid, jid]
    text = service.cli("nodes").stdout
    assert "GPUs" in text and f"job {jid}" in text
    queues = service.cli_json("queues")["queues"]
    assert [(q["name"], q["running"], q["used"]["gpus"]) for q in queues] == [("default", 1, 2.0)]
    metrics = service.api.get("/metrics").text
    assert 'aisched_jobs{state="running"} 1.0' in metrics
    assert "aisched_allocated_gpus 2.0" in metrics and "aisched_capacity_gpus 4.0" in metrics
    assert 'aisched_queue_running_jobs{queue="default"} 1.0' in metrics
    assert "aisched_scheduling_cycle_duration_seconds_count" in metrics
    spec = service.api.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/nodes", "/v1/queues"} <= set(spec["paths"])
    (service.work / "release").touch()
    service.wait_state(jid, "succeeded")


def test_logs_of_a_task_or_an_attempt_that_is_not_there_say_so(service: Service) -> None:
    """`--task nosuch` printed nothing and exited 0; `--attempt 0` printed the latest."""
    jid = service.run("--", "echo", "hi")
    service.wait_state(jid, "succeeded")
    assert service.cli("logs", jid, "--task", "main-0").stdout == "hi\n"
    wrong = service.cli("logs", jid, "--task", "nosuch", check=False)
    assert (wrong.returncode, wrong.stdout) == (2, "")  # as for "no job 999"
    assert wrong.stderr == f"error: job {jid} has no task 'nosuch' (its tasks: main-0)\n"
    zero = service.cli("logs", jid, "--attempt", "0", check=False)
    assert (zero.returncode, zero.stderr) == (2, "error: --attempt: attempts count from 1\n")


def test_logs_follow_streams_until_the_job_ends(service: Service) -> None:
    script = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)\n"
    write(service, "count.py", script)
    jid = service.run("--", PY, "count.py")
    out = service.cli("logs", jid, "-f").stdout
    assert out == "0\n1\n2\n"
    exits_4 = "import sys; print('hi'); sys.exit(4)"
    proc = service.cli("run", "-f", "--restart", "never", "--", PY, "-c", exits_4, check=False)
    assert proc.stdout == "hi\n" and proc.returncode == 4


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_service_goes_on(
    service: Service,
) -> None:
    # Where a wedged service waits, without a debugger (docs/service.md, Operations).
    assert service.proc is not None
    service.proc.send_signal(signal.SIGUSR1)
    # The dump is written a thread at a time: wait for the loop thread's (its name is not
    # shown, its code is).
    wait_for("the stacks in the log", lambda: "aisched/service/loop.py" in service.log.read_text())
    assert "Thread 0x" in service.log.read_text()
    assert service.api.get("/v1/healthz").json()["ok"]


def test_an_ipv6_address_is_announced_in_brackets(tmp_path: Path) -> None:
    """`up --host ::1` says (and announces) `http://[::1]:PORT`, a URL a client can use: it
    was `http://::1:PORT`, which no HTTP client parses."""
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "aisched", "up", "--host", "::1", "--port", str(port),
         "--insecure", "--data-dir", str(tmp_path), "--gpus", "0"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert up.stderr is not None
        lines = []
        for line in up.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        url = f"http://[::1]:{port}"
        assert lines[-1].rstrip().endswith(f"listening on {url}"), lines
        assert httpx.get(f"{url}/v1/healthz", timeout=5).json()["ok"] is True
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(30)


def test_the_cli_finds_its_own_service_started_with_another_data_directory(
    tmp_path: Path,
) -> None:
    """`aisched up --data-dir D` said where it listens in D alone, where the CLI, reading its
    `$AISCHED_HOME`, never looked: `cannot reach the aisched service at
    http://127.0.0.1:8470`."""
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "AISCHED_SERVER"}
    env["AISCHED_HOME"] = str(home)
    up = subprocess.Popen(
        [PY, "-m", "aisched", "up", "--port", str(free_port()), "--data-dir", str(data),
         "--socket", str(tmp_path / "s.sock"), "--gpus", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for("the announcement", (home / "server.json").exists)
        jobs = subprocess.run(
            [PY, "-m", "aisched", "jobs", "--json"], env=env, capture_output=True, text=True
        )
        assert jobs.returncode == 0, jobs.stderr
        assert json.loads(jobs.stdout) == {"jobs": [], "more": False, "next_before": None}
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(30)
    assert not (home / "server.json").exists()  # said no more once it stopped


def _on_a_terminal(svc: Service, *args: str) -> str:
    """What `aisched ARGS` prints with its stdout on a terminal (a pty)."""
    main, side = pty.openpty()
    try:
        proc = subprocess.run(
            [PY, "-m", "aisched", *args], env=svc.env(), stdout=side, stderr=subprocess.PIPE,
            timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        os.close(side)
        side = -1
        out = b""
        with contextlib.suppress(OSError):  # EIO once the pty's other side is closed
            while chunk := os.read(main, 65536):
                out += chunk
        return out.decode()
    finally:
        os.close(main)
        if side >= 0:
            os.close(side)


def test_a_log_read_on_a_terminal_cannot_drive_it(service: Service) -> None:
    """A job's output reached the reader's terminal as written: a clipboard write (OSC 52), a
    retitle and a clear screen by another user's job, in an admin's terminal. Its colours
    stay; `--raw` and a pipe give it as written."""
    said = "\x1b[32mgreen\x1b[0m \x1b]52;c;aGk=\x07\x1b]0;TITLE\x07\x1b[2J done"
    job = service.run("--", "printf", "%s\\n", said)
    service.wait_state(job, "succeeded")
    shown = _on_a_terminal(service, "logs", job).replace("\r\n", "\n")  # the pty's line ends
    assert shown == ("\x1b[32mgreen\x1b[0m \\x1b]52;c;aGk=\\x07\\x1b]0;TITLE\\x07\\x1b[2J done\n")
    raw = _on_a_terminal(service, "logs", job, "--raw").replace("\r\n", "\n")
    assert raw == said + "\n"
    assert service.cli("logs", job).stdout == said + "\n"  # a pipe

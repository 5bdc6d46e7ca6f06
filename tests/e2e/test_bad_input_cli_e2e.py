"""Bad input through the real commands: `aisched submit` of malformed job files, `aisched run`
with bad flags (against a real service), `aisched up` with bad config and policy files. Each is
refused with exit status 2 and `error:` lines naming what is wrong, never a Python traceback,
and a refused submission leaves no job. The same inputs, generated, are tested in process by
tests/property/test_job_file_bad_input.py and test_config_bad_input.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness import Service, free_port

BAD_JOB_FILES: list[tuple[str, bytes, str]] = [
    ("syntax.yaml", b"command: [python, x.py\nreplicas: 2\n", "syntax.yaml:2:9: YAML syntax"),
    ("unknown.yaml", b"command: [x]\nbogus: 1\n", "unknown.yaml: bogus: unknown key"),
    (
        "twice.yaml",
        b"tasks:\n- {name: a, command: x}\n- {name: a, command: y}\n",
        "twice.yaml: tasks.1.name: 'a' is already the name of tasks.0",
    ),
    ("nul.yaml", b'command: ["a\\0b"]\n', "nul.yaml: command.0: contains a NUL character"),
    ("unit.yaml", b"command: x\nresources: {mem: 12Q}\n", "unit.yaml: resources.mem: "),
    ("nan.yaml", b"command: x\nresources: {cpus: .nan}\n", "nan.yaml: resources.cpus: "),
    (
        "deep.yaml",
        b"command: " + b"[" * 2000 + b"]" * 2000,
        "deep.yaml: nested deeper than 64 levels at line 1",
    ),
    ("latin1.yaml", b"command: caf\xe9\n", "latin1.yaml: not UTF-8 text"),
    (
        "cycle.yaml",
        b"jobs:\n- {name: a, command: x, depends_on: [b]}\n- {name: b, command: y, "
        b"depends_on: [a]}\n",
        "cycle.yaml: depends_on: dependency cycle",
    ),
]


def _one_clear_error(proc: subprocess.CompletedProcess[str], want: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    assert want in proc.stderr, proc.stderr


def test_bad_job_files_and_run_flags_are_refused_in_one_clear_error(
    service: Service, tmp_path: Path
) -> None:
    for name, data, want in BAD_JOB_FILES:
        f = service.work / name
        f.write_bytes(data)
        _one_clear_error(service.cli("submit", str(f), check=False), want)
    for flags, want in [
        (["--gpus", "nan"], "error: --gpus: 'nan' is not a GPU count"),
        (["--mem", "12Q"], "error: --mem: '12Q' is not a size"),
        (["--cpus", "-1"], "error: --cpus: "),
        (["--time-limit", "1e999s"], "error: --time-limit: "),
        (["--env", "A\x01=1"], "error: --env "),
    ]:
        _one_clear_error(service.cli("run", *flags, "--", "true", check=False), want)
    assert service.cli_json("jobs", "--all") == {"jobs": [], "more": False, "next_before": None}
    ok = service.run("--", "true")  # and it still takes a good one
    assert [j["id"] for j in service.cli_json("jobs", "--all")["jobs"]] == [ok]


def _up(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aisched", "up", "--port", str(free_port()), "--data-dir",
         str(tmp_path / "home"), "--socket", "", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("config", "policy", "want"),
    [
        # The bind raised a bare TypeError on a name IDNA cannot write.
        (f"host: {'é' * 70}\ninsecure: true\n", None, "host: 'ééé"),
        ("limits: {request_rate: x}\n", None, "limits.request_rate: "),
        ("queues: [{name: a, weight: .nan}]\n", None, "queues.0.weight: "),
        ("cycle_interval: 12Q\n", None, "cycle_interval: "),
        # dict("x") merging the node flags in: a ValueError traceback.
        ("node: x\n", None, "config.yaml: node: Input should be a mapping (key: value pairs)"),
        ("limits: 5\n", None, "config.yaml: limits: Input should be a mapping (key: value pairs)"),
        # Path.exists raised OSError on a name too long for a file.
        (f"policy: {'x' * 300}\n", None, "config.yaml: policy: unknown policy 'xxx"),
        # Taken, then every step of the loop failed ("no such table: jobs").
        ("database: 'sqlite://'\n", None, "database: 'sqlite://' is an in-memory SQLite"),
        # It blamed the data directory, which was writable.
        ("database: sqlite:////nonexistent/x.db\n", None,
         "error: cannot create the state database /nonexistent/x.db: No such file"),
        # Taken, then every cycle failed (TypeError) and nothing was ever scheduled.
        (None, "actions: [enqueue, allocate]\norder: [{name: las, thresholds_gpu_s: [a]}]\n",
         "policy.order[0]: las: thresholds_gpu_s: "),
        (None, "actions: [enqueue, allocate]\nscore: [{name: random, seed: 0.5}]\n",
         "policy.score[0].seed: expected int, got 0.5"),
    ],
)  # fmt: skip
def test_up_with_a_bad_config_or_policy_file_is_one_clear_error(
    tmp_path: Path, config: str | None, policy: str | None, want: str
) -> None:
    args: list[str] = []
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
        args += ["--config", str(tmp_path / "config.yaml")]
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy)
        args += ["--policy", str(tmp_path / "policy.yaml")]
    _one_clear_error(_up(tmp_path, *args), want)

"""`aisched run`'s environment: what `--env-all` sends for a container job."""

from __future__ import annotations

import pytest

from aisched.cli.jobs import run_document
from aisched.cli.main import build_parser


def _doc(*argv: str) -> dict[str, object]:
    args = build_parser(["run", *argv]).parse_args(["run", *argv])
    return run_document(args)


def test_env_all_leaves_a_multi_line_variable_out_of_a_container_job_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The service refuses a container's variable with a line break; a shell's multi-line
    # variable must not refuse the whole job sent with --env-all.
    monkeypatch.setenv("MULTI", "two\nlines")
    monkeypatch.setenv("PLAIN", "one line")
    env = _doc("--env-all", "--image", "python:3.11", "--", "true")["env"]
    assert isinstance(env, dict)
    assert (env.get("PLAIN"), "MULTI" in env) == ("one line", False)
    assert "aisched: --env-all: left out MULTI: a container's variable cannot hold a line " in (
        capsys.readouterr().err
    )
    on_host = _doc("--env-all", "--", "true")["env"]  # a host task gets it whole
    assert isinstance(on_host, dict) and on_host["MULTI"] == "two\nlines"


def test_env_all_leaves_out_what_the_scheduler_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sent, the service would refuse the whole job for each of them.
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "VC_TASK_INDEX", "AISCHED_X"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("PLAIN", "one line")
    env = _doc("--env-all", "--", "true")["env"]
    assert isinstance(env, dict)
    assert env.get("PLAIN") == "one line"
    assert not {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "VC_TASK_INDEX",
        "AISCHED_X",
    } & set(env)


def test_run_help_says_only_the_variables_asked_for_are_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It said the job runs "with your environment", which it does not without --env-all.
    with pytest.raises(SystemExit):
        build_parser(["run", "--help"]).parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "with your environment" not in text
    assert "only the variables named with --env, or all of them with --env-all" in text

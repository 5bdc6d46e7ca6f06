"""The one error form of every command: one `error:` line, then one indented line per problem;
argparse's own mistakes too, never the whole usage text. In process, through `main`; nothing
here needs a service (each error is found before any request)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aisched.cli.main import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    try:
        status = main(list(argv))
    except SystemExit as e:  # argparse's own errors leave through SystemExit
        status = int(e.code or 0)
    out = capsys.readouterr()
    return status, out.err.splitlines(), out.out


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", "--mem", "abc", "--", "true"], "error: --mem: 'abc' is not a size: give a "
         "number and a unit, e.g. 8G, 512M, 1.5T or 512Mi"),
        (["run", "--cpus", "abc", "--", "true"],
         "error: --cpus: 'abc' is not a CPU count: give e.g. 4, 0.5 or 500m"),
        (["run", "--gpus", "abc", "--", "true"],
         "error: --gpus: 'abc' is not a GPU count: give e.g. 1, 4 or 0.5"),
        (["run", "--estimate", "soon", "--", "true"], None),
        (["run", "--replicas", "x", "--", "true"],
         "error: argument --replicas: invalid int value: 'x' (see aisched run --help)"),
        (["jobs", "--bogus"], "error: unrecognized arguments: --bogus (see aisched --help)"),
        (["--json", "up"], "error: --json: aisched up has no JSON output (see aisched --help)"),
        (["--server", "http://x", "up"],
         "error: --server: aisched up does not talk to a service (see aisched --help)"),
        (["--json", "simulate"], "error: --json: aisched simulate writes JSON to a file: give "
         "--json FILE after it (see aisched --help)"),
        (["submit", "-f", "a.yaml", "b.yaml"], "error: --follow: follows one job; give one file"),
        (["cancel"], "error: cancel: give job IDs, or --all-mine, --queue Q or --state S"),
        (["cancel", "7", "--all-mine"],
         "error: cancel: give job IDs or --all-mine/--queue/--state, not both"),
        (["cancel", "--state", "done"], None),
    ],
)  # fmt: skip
def test_a_bad_flag_is_one_error_line_and_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str | None
) -> None:
    status, err, out = run(capsys, *argv)
    assert (status, len(err), out) == (2, 1, "")
    assert err[0].startswith("error: ")
    if line is not None:
        assert err == [line]


def test_an_unreadable_file_among_several_submits_none(capsys: pytest.CaptureFixture[str]) -> None:
    status, err, _ = run(
        capsys, "--server", "http://127.0.0.1:1", "submit", "/nonexistent/a.yaml", "-"
    )
    assert (status, err) == (
        2,
        ["error: /nonexistent/a.yaml: cannot read job file: No such file or directory"],
    )


def test_a_job_file_that_never_ends_or_is_too_large_is_refused_unread(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # /dev/zero was read until the memory ran out, and a FIFO blocked for ever.
    fifo, big = tmp_path / "fifo", tmp_path / "big.yaml"
    os.mkfifo(fifo)
    big.write_text("#" * (1 << 20) + "\n")
    for path, why in (
        ("/dev/zero", "cannot read job file: not a regular file"),
        (str(fifo), "cannot read job file: not a regular file"),
        (str(tmp_path), "cannot read job file: Is a directory"),
        (str(big), "larger than 1 MiB; no job file is that large"),
    ):
        status, err, _ = run(capsys, "--server", "http://127.0.0.1:1", "submit", path)
        assert (status, err) == (2, [f"error: {path}: {why}"])

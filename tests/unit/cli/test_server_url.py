"""A malformed --server (or AISCHED_SERVER) is a usage error naming it, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aisched.cli.main import main


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ("http://[::1", "--server http://[::1: not a valid URL: Invalid port: ':1'"),
        ("http://host:port", "--server http://host:port: not a valid URL: Invalid port: 'port'"),
        ("ftp://host", "--server ftp://host: expected unix:PATH or http(s)://HOST:PORT"),
        (
            "/run/aisched/a.sock",
            "--server /run/aisched/a.sock: a socket is named unix:/run/aisched/a.sock",
        ),
        ("unix:", "--server unix:: give the socket's path after unix:"),  # was "cannot reach"
    ],
)
def test_a_malformed_server_url_is_refused_naming_it(
    server: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AISCHED_TOKEN", "t")  # no token file of the machine's is read
    assert main(["jobs", "--server", server]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


@pytest.mark.parametrize("interval", ["0", "-1", "nan"])
def test_top_refuses_an_interval_below_its_least(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was taken as 0.2 s without a word."""
    argv = ["top", "--server", "unix:/nonexistent/aisched.sock", "--interval", interval]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: --interval: at least 0.2 (seconds between frames)\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["jobs", "--limit", "0"],
            "argument --limit: 0: from 1 to 100,000 (see aisched jobs --help)",
        ),
        (
            ["run", "--replicas", "0", "--", "true"],
            "argument --replicas: 0: from 1 to 10,000 (see aisched run --help)",
        ),
        (
            ["run", "--max-retries", "-1", "--", "true"],
            "argument --max-retries: -1: from 0 to 1,000 (see aisched run --help)",
        ),
        (
            ["audit", "--limit", "0"],
            "argument --limit: 0: from 1 to 100,000 (see aisched audit --help)",
        ),
    ],
)
def test_a_count_flag_out_of_range_is_named_by_its_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service refused these naming its own fields (`query.limit`, `replicas`,
    `restart.max_retries`), not the flag the user typed; nothing is sent now."""
    with pytest.raises(SystemExit) as exited:  # argparse's own exit, as for `--limit x`
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("url", [5, None, "ftp://x"])
def test_a_server_file_whose_url_is_no_address_is_named(
    url: object,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It was blamed on a --server flag the user never gave.
    monkeypatch.setenv("AISCHED_HOME", str(tmp_path))
    monkeypatch.delenv("AISCHED_SERVER", raising=False)
    (tmp_path / "server.json").write_text(json.dumps({"url": url}))
    assert main(["jobs"]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path}/server.json: its url {url!r} is no server's address (aisched up "
        "writes unix:PATH or http(s)://HOST:PORT there); remove the file, or give --server\n"
    )

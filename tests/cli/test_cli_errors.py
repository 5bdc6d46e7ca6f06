"""The one error form of every command: one `error:` line, then one indented line per problem;
argparse's own mistakes too, never the whole usage text. In process, through `main`; nothing
here needs a service (each error is found before any request)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
        (["submit", "--idempotency-key", "k1", "a.yaml", "b.yaml"],
         "error: --idempotency-key: a key is one submission's; give one file"),
        (["run", "--idempotency-key", "a b", "--", "true"],
         "error: argument --idempotency-key: 'a b' is not an idempotency key: give 1 to 200 "
         "letters, digits, '.', '_', ':' or '-' (a failed submission's error names its key) "
         "(see aisched run --help)"),
        (["cancel"], "error: cancel: give job IDs, or --all-mine, --queue Q or --state S"),
        (["cancel", "7", "--all-mine"],
         "error: cancel: give job IDs or --all-mine/--queue/--state, not both"),
        (["cancel", "--state", "done"], None),
        (["up", "--cpus", "nan"], "error: --cpus: 'nan' is not a CPU count: give e.g. 4, 0.5 or "
         "500m"),
        (["up", "--mem", "0G"], "error: --mem: must be above 0"),
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


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["show", "1/../2"], "error: argument ID: '1/../2' is not a job ID: give the number "
         "`aisched jobs` shows (see aisched show --help)"),
        (["logs", "?x=1"], "error: argument ID: '?x=1' is not a job ID: give the number "
         "`aisched jobs` shows (see aisched logs --help)"),
        (["cancel", "7", ""], "error: argument ID: '' is not a job ID: give the number "
         "`aisched jobs` shows (see aisched cancel --help)"),
        (["token", "revoke", "a/b"], "error: argument ID: 'a/b' is not a token id: give the id "
         "`aisched token list` shows (see aisched token revoke --help)"),
    ],
)  # fmt: skip
def test_an_id_that_could_name_another_path_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert run(capsys, "--server", "http://127.0.0.1:1", *argv)[:2] == (2, [line])


@pytest.fixture
def not_aisched() -> Iterator[str]:
    """A web server that is no aisched: a page for /v1/jobs, a 404 page for /v1/nodes, a
    redirect for anything else."""

    class Page(BaseHTTPRequestHandler):
        def page(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/nodes":
                self.page(404, b"<html>not found</html>\n")
            elif self.path.startswith("/v1/jobs?"):
                self.page(200, b"<html>hello</html>\n")
            else:
                self.send_response(307)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_server_that_is_no_aisched_is_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str], not_aisched: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AISCHED_TOKEN", raising=False)
    status, err, _ = run(capsys, "--server", not_aisched, "jobs")
    assert (status, err) == (1, [f"error: {not_aisched} answered GET /v1/jobs with 200 without "
                                 "JSON: it does not look like an aisched service (--server or "
                                 "AISCHED_SERVER choose another)"])  # fmt: skip
    # A 404 page: it was exit status 2 (as a refusal of aisched's) and named only the host.
    status, err, _ = run(capsys, "--server", not_aisched, "nodes")
    assert (status, err) == (1, [f"error: {not_aisched} answered GET /v1/nodes with 404 without "
                                 "JSON ('<html>not found</html>'): it does not look like an "
                                 "aisched service (--server or AISCHED_SERVER choose "
                                 "another)"])  # fmt: skip
    status, err, _ = run(capsys, "--server", not_aisched, "show", "3")
    assert (status, err) == (1, [f"error: {not_aisched} answered 307 (a redirect to /elsewhere): "
                                 "it does not look like an aisched service (--server or "
                                 "AISCHED_SERVER choose another)"])  # fmt: skip


def test_a_token_that_cannot_go_in_a_header_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AISCHED_TOKEN", "tök\u00e9n")
    assert run(capsys, "--server", "http://127.0.0.1:1", "jobs")[:2] == (
        2,
        ["error: AISCHED_TOKEN: not a token (a token is one word of printable ASCII, as "
         "`aisched token create` prints it)"],
    )  # fmt: skip
    monkeypatch.delenv("AISCHED_TOKEN")
    monkeypatch.setenv("AISCHED_TOKEN_FILE", str(tmp_path))
    assert run(capsys, "--server", "http://127.0.0.1:1", "jobs")[:2] == (
        2,
        [f"error: {tmp_path}: the token file is not a regular file"],
    )


def test_a_submission_to_a_service_that_is_not_there_is_not_told_to_be_sent_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Nothing was sent, so nothing can have been kept: no key to send it again with.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, err, _ = run(capsys, "--server", f"http://127.0.0.1:{port}", "run", "--", "true")
    assert (status, len(err)) == (1, 1), err
    assert err[0].startswith(f"error: cannot reach the aisched service at http://127.0.0.1:{port}")


def test_a_host_no_socket_can_take_is_one_error_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A name IDNA cannot write (a label over 63 characters) was taken, and the bind failed
    with a bare TypeError: a traceback from `aisched up`, flag or config file alike."""
    host = "é" * 70
    status, err, out = run(
        capsys, "up", "--host", host, "--insecure", "--port", "0", "--data-dir", str(tmp_path)
    )
    assert (status, len(err), out) == (2, 1, "")
    assert err[0].startswith(f"error: --host: '{host}' is not a host name or address (")
    config = tmp_path / "config.yaml"
    config.write_text(f"host: {host}\ninsecure: true\nport: 0\n")
    status, err, out = run(capsys, "up", "--config", str(config), "--data-dir", str(tmp_path))
    assert (status, len(err), out) == (2, 1, "")
    assert err[0].startswith(f"error: {config}: host: '{host}' is not a host name or address (")


@pytest.mark.parametrize("address", ["localhost:¹", "localhost:", "localhost:6379x"])
def test_a_ray_address_whose_port_is_not_a_number_is_one_error_line(
    tmp_path: Path, address: str
) -> None:
    # '¹' is a digit to str.isdigit, not to int: `aisched up` ended in a traceback.
    argv = ["up", "--ray", address, "--port", "0", "--data-dir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "aisched", *argv], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == (
        f"error: {address!r} is not a Ray address: give HOST:PORT of the head node, or auto\n"
    )

"""A server that answers JSON of another shape than aisched's (`{"jobs": 5}` to `aisched jobs`,
a list where an object is expected): every command that reads the answer says so in one line,
naming the server and the endpoint, and exits 1, never with a traceback. A real HTTP server on
a loopback port gives the answers; the commands run in process, through `main`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aisched.cli.main import main


class Answers(ThreadingHTTPServer):
    """Answers every request 200 with `body`, whatever it asks."""

    body: object = None


class Handler(BaseHTTPRequestHandler):
    server: Answers

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps(self.server.body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Answers]:
    monkeypatch.setenv("AISCHED_HOME", str(tmp_path))  # no token of this machine's is sent
    monkeypatch.delenv("AISCHED_TOKEN", raising=False)
    monkeypatch.delenv("AISCHED_TOKEN_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("tasks: [{name: main, command: [true]}]\n")
    httpd = Answers(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


# (command, endpoint it reads, wrong answers)
CASES = [
    (["jobs"], "GET /v1/jobs", [{"jobs": 5}, [], {"jobs": [[]]}, {"jobs": [{"id": "1"}]}]),
    (["show", "3"], "GET /v1/jobs/3", [[], {"id": "3"}, 5]),
    (["cancel", "3"], "POST /v1/jobs/3/cancel", [[], "cancelled"]),
    (["cancel", "--state", "pending"], "POST /v1/jobs/cancel", [[], {"count": 1}]),
    (["run", "--", "true"], "POST /v1/jobs", [[], {"ids": []}]),
    (["submit", "job.yaml"], "POST /v1/jobs", [[{"id": 5}], None]),
    (["nodes"], "GET /v1/nodes", [{"nodes": 5}, {"nodes": [{"name": "n"}]}]),
    (["queues"], "GET /v1/queues", [[], {"queues": [5]}]),
    (["top", "--once"], "GET /v1/dashboard", [[], {"racks": 5}, {"queues": [{"name": "q"}]}]),
    (["token", "list"], "GET /v1/tokens", [{"tokens": []}, [5]]),
    (["token", "create", "ana"], "POST /v1/tokens", [[], {"id": 1}]),
    (["token", "revoke", "4"], "POST /v1/tokens/4/revoke", [[]]),
    (["audit"], "GET /v1/audit", [{"audit": []}, [{"time": "now"}]]),
]


@pytest.mark.parametrize(("argv", "endpoint", "bodies"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_an_answer_of_another_shape_is_one_line_naming_server_and_endpoint(
    capsys: pytest.CaptureFixture[str],
    server: Answers,
    argv: list[str],
    endpoint: str,
    bodies: list[object],
) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    for body in bodies:
        server.body = body
        status = main(["--server", url, *argv])
        err = capsys.readouterr().err.splitlines()
        said = f"{json.dumps(body)}: {err}"
        assert status == 1, said
        assert len(err) == 1, said
        assert err[0].startswith(
            f"error: {url} answered {endpoint} with JSON of another shape than aisched's ("
        ), said
        assert err[0].endswith(
            "): it does not look like an aisched service of this version (--server or "
            "AISCHED_SERVER choose another)"
        ), said

"""Sharing one machine: a real `aisched up` as root, driven through its Unix socket by real
local users (alice, bob) with the real CLI, and over TCP with tokens.

What it shows: identity comes from the kernel on the socket and from a token over TCP, never
from a header; a job runs as its submitter; users act on their own jobs, root on all; files in
the data directory are private; a queue limited to a group refuses others; a non-loopback
address needs TLS; oversized and over-deep bodies are refused without cost to the service.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from harness import Service, free_port, local_service, wait_for
from users import GROUP, User

from aisched.service.defaults import FOLLOW_STOPPED
from aisched.service.protocol import HEADER_TIMEOUT_S, MAX_HEAD_BYTES

CONFIG = f"""
queues:
  - name: default
  - name: team
    groups: [{GROUP}]
    max_priority: 50
"""

# The tests that need alice and bob take `local_users`, and so run on the users' pytest worker
# (tests/conftest.py); the others need no user of the machine, and run on either.


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    tmp_path.chmod(0o755)  # the users' jobs run in their homes; the service's files stay private
    with local_service(tmp_path, config=CONFIG) as svc:
        yield svc


def as_user(svc: Service, user: User, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return user.aisched(*args, env={"AISCHED_SERVER": f"unix:{svc.socket}", **env})


def run_as(svc: Service, user: User, *args: str) -> str:
    proc = as_user(svc, user, "run", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["id"])


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The CLI's refusal: exit 2, one `error:` line, then indented lines (one per problem),
    no traceback; returned as one line."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    first, *rest = proc.stderr.strip().splitlines()
    assert first.startswith("error: ") and all(r.startswith("  ") for r in rest), proc.stderr
    return " ".join([first, *(r.strip() for r in rest)])


def test_a_job_runs_as_its_submitter_with_its_groups_home_and_checkpoints(
    service: Service, local_users: dict[str, User]
) -> None:
    alice = local_users["alice"]
    jid = run_as(
        service,
        alice,
        "--",
        "sh",
        "-c",
        'id -u; id -G; echo "$HOME $USER"; touch "$AISCHED_CHECKPOINT_DIR/saved"; '
        'stat -c "%U %a" "$AISCHED_CHECKPOINT_DIR"',
    )
    service.wait_state(jid, "succeeded")
    out = as_user(service, alice, "logs", jid).stdout.splitlines()
    team_gid = int(subprocess.run(["getent", "group", GROUP], capture_output=True, text=True)
                   .stdout.split(":")[2])  # fmt: skip
    assert out[0] == str(alice.uid)
    assert sorted(int(g) for g in out[1].split()) == sorted({alice.gid, team_gid})
    assert out[2] == f"{alice.home} {alice.name}"
    assert out[3] == f"{alice.name} 700"
    ckpt = Path(service.job(jid)["checkpoint_dir"])
    assert ckpt.is_relative_to(alice.home) and (ckpt / "saved").owner() == alice.name
    # root's own job runs as root
    root_job = service.run("--", "id", "-u")
    service.wait_state(root_job, "succeeded")
    assert service.cli("logs", root_job).stdout.strip() == "0"


def test_another_user_can_neither_cancel_nor_read_a_job_and_root_can(
    service: Service, local_users: dict[str, User], tmp_path: Path
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    jid = run_as(service, alice, "--env", "SECRET=s3cr3t", "--", "sh", "-c", "echo hi; sleep 60")
    service.wait_state(jid, "running")

    assert "belongs to aisalice" in one_error_line(as_user(service, bob, "cancel", jid))
    assert "logs" in one_error_line(as_user(service, bob, "logs", jid))
    seen_by_bob = json.loads(as_user(service, bob, "show", "--json", jid).stdout)
    assert seen_by_bob["env"] is None and seen_by_bob["events"] == []
    assert [g["command"] for g in seen_by_bob["groups"]] == [[]]
    listed = json.loads(as_user(service, bob, "jobs", "--json").stdout)["jobs"]
    assert [(j["id"], j["user"], j["groups"][0]["command"]) for j in listed] == [
        (jid, alice.name, [])
    ]
    mine = json.loads(as_user(service, alice, "show", "--json", jid).stdout)
    assert mine["env"] == {"main": {"SECRET": "s3cr3t"}}

    # A forged header over the socket changes nothing: the kernel says who is calling.
    forged = subprocess.run(
        bob.cmd("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket",
                str(service.socket), "-X", "POST", "-H", f"X-Aisched-User: {alice.name}",
                f"http://aisched/v1/jobs/{jid}/cancel"),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert forged.stdout == "403"
    assert service.job(jid)["state"] == "running"

    service.cli("cancel", jid)  # root may
    service.wait_state(jid, "cancelled")
    audit = json.loads(service.cli("audit", "--json").stdout)
    assert [(a["actor"], a["action"], a["target"], a["owner"]) for a in audit][:1] == [
        ("root", "cancel", f"job {jid}", alice.name)
    ]


def test_a_path_a_user_cannot_reach_is_answered_as_a_missing_one(
    service: Service, local_users: dict[str, User]
) -> None:
    # The service (root) sees bob's private directory; alice must not learn from its answer
    # whether a path in there exists.
    alice, bob = local_users["alice"], local_users["bob"]
    private = bob.home / "private"
    shutil.rmtree(private, ignore_errors=True)
    (private / "work").mkdir(parents=True)
    for p in (private, private / "work"):
        os.chown(p, bob.uid, bob.gid)
    private.chmod(0o700)
    try:
        answers = [
            one_error_line(as_user(service, alice, "run", "--workdir", str(d), "--", "true"))
            for d in (private / "work", private / "none")
        ]
        assert answers == [
            f"error: invalid job aisched run: --workdir: no such directory: {d}"
            for d in (private / "work", private / "none")
        ]
        seen_by_bob = as_user(service, bob, "run", "--workdir", str(private / "work"), "true")
        assert seen_by_bob.returncode == 0, seen_by_bob.stderr
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_a_link_leads_no_user_past_a_directory_it_may_not_search(
    service: Service, local_users: dict[str, User]
) -> None:
    # Root's 0700 directory holds a world-readable `inner`; alice's links lead into it, to
    # what is there and to what is not. Nothing she names through them may be used, nor may
    # the answers tell the two apart.
    alice = local_users["alice"]
    closed = Path(tempfile.mkdtemp())
    (closed / "inner").mkdir(mode=0o755)
    (closed / "inner/secret.txt").write_text("secret\n")
    (closed / "inner/secret.txt").chmod(0o644)
    there, gone, mount = alice.home / "there", alice.home / "gone", alice.home / "mount.yaml"
    try:
        for link, target in ((there, closed / "inner"), (gone, closed / "none")):
            link.unlink(missing_ok=True)
            link.symlink_to(target)
            os.lchown(link, alice.uid, alice.gid)

        def refusal(*args: str) -> str:
            return one_error_line(as_user(service, alice, "run", *args))

        invalid = "error: invalid job aisched run:"
        assert [refusal("--workdir", f"{d}/.", "--", "true") for d in (there, gone)] == [
            f"{invalid} --workdir: no such directory: {d}" for d in (there, gone)
        ]
        assert [refusal("--", f"{d}/secret.txt") for d in (there, gone)] == [
            f"{invalid} the command (after --): no such file: {d}/secret.txt" for d in (there, gone)
        ]
        # A container's workdir is mounted from here when it is a directory here.
        assert [
            refusal("--image", "img", "--workdir", str(d), "--", "true") for d in (there, gone)
        ] == [
            f"{invalid} --workdir: user {alice.name} may not read {d}, so its container may "
            "not mount it"
            for d in (there, gone)
        ]
        mount.write_text(
            f"image: img\ncommand: 'cat /s/s.txt'\nvolumes: [{{host_path: {there}, path: /s}}]\n"
        )
        proc = as_user(service, alice, "submit", str(mount))
        assert one_error_line(proc) == (
            f"error: invalid job {mount.name}: volumes.0.host_path: no such file or directory: "
            f"{there}"
        )
    finally:
        for p in (there, gone, mount):
            p.unlink(missing_ok=True)
        shutil.rmtree(closed)


def test_tcp_needs_a_token_and_a_token_gives_only_its_users_rights(
    service: Service, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    jid = run_as(service, alice, "--", "sleep", "60")
    assert httpx.get(f"{service.url}/v1/healthz").status_code == 200
    for path in ("/v1/jobs", f"/v1/jobs/{jid}", "/metrics", "/openapi.json", "/v1/dashboard"):
        r = httpx.get(f"{service.url}{path}")
        assert (r.status_code, r.json()["error"].split(":")[0]) == (
            401,
            "authentication required",
        ), path
    r = httpx.get(f"{service.url}/v1/jobs", headers={"Authorization": "Bearer ais_forged"})
    assert r.status_code == 401
    # The header names nobody over TCP either.
    r = httpx.post(f"{service.url}/v1/jobs/{jid}/cancel", headers={"X-Aisched-User": "root"})
    assert r.status_code == 401

    bob_token = service.cli("token", "create", bob.name).stdout.strip()
    made_by_bob = as_user(service, bob, "token", "create", bob.name)
    assert "only admins may create tokens" in one_error_line(made_by_bob)
    as_bob = {"Authorization": f"Bearer {bob_token}"}
    r = httpx.post(f"{service.url}/v1/jobs/{jid}/cancel", headers=as_bob)
    assert (r.status_code, r.json()["error"]) == (
        403,
        f"job {jid} belongs to {alice.name}: only {alice.name} and admins may cancel it",
    )
    assert httpx.get(f"{service.url}/v1/jobs/{jid}/logs", headers=as_bob).status_code == 403
    # The CLI over TCP with the token from the environment, and from a private file only.
    tcp = {"AISCHED_SERVER": service.url, "AISCHED_TOKEN": bob_token}
    assert "belongs to" in one_error_line(bob.aisched("cancel", jid, env=tcp))
    token_file = bob.home / "aisched-token"
    subprocess.run(
        bob.cmd("sh", "-c", f"rm -f {token_file}; umask 022; echo {bob_token} > {token_file}"),
        check=True,
    )
    by_file = {"AISCHED_SERVER": service.url, "AISCHED_TOKEN_FILE": str(token_file)}
    assert "readable by others" in one_error_line(bob.aisched("jobs", env=by_file))
    subprocess.run(bob.cmd("chmod", "600", str(token_file)), check=True)
    assert bob.aisched("jobs", env=by_file).returncode == 0

    token_id = json.loads(service.cli("token", "list", "--json").stdout)[-1]["id"]
    service.cli("token", "revoke", token_id)
    assert httpx.get(f"{service.url}/v1/jobs", headers=as_bob).status_code == 401
    service.cli("cancel", jid)


def test_only_named_variables_are_sent_and_files_are_private(
    service: Service, local_users: dict[str, User]
) -> None:
    alice = local_users["alice"]
    env = {"FOO": "named", "TOKEN_NOT_SENT": "leak"}
    proc = as_user(service, alice, "run", "--json", "--env", "FOO", "--", "sh", "-c",
                   'echo "FOO=$FOO TOKEN=${TOKEN_NOT_SENT:-unset}"', **env)  # fmt: skip
    jid = str(json.loads(proc.stdout)["id"])
    service.wait_state(jid, "succeeded")
    assert as_user(service, alice, "logs", jid).stdout == "FOO=named TOKEN=unset\n"

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    home = service.home
    assert mode(home) == 0o700
    assert {p.name: mode(p) for p in home.glob("state.db*")} == {
        n: 0o600 for n in ("state.db", "state.db-wal", "state.db-shm", "state.db.lock")
    }
    launch = next(home.glob(f"tasks/{jid}/*/*/launch.json"))
    assert mode(launch) == 0o600 and "leak" not in launch.read_text()
    log = Path(service.job(jid)["tasks"][0]["log_path"])
    assert (mode(log), log.owner()) == (0o600, alice.name)


def test_a_queue_limited_to_a_group_refuses_others(
    service: Service, local_users: dict[str, User]
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    line = one_error_line(as_user(service, bob, "run", "--queue", "team", "--", "true"))
    assert f"queue 'team' accepts jobs only from group {GROUP}; {bob.name} is not among them" in (
        line
    )
    ok = as_user(service, alice, "run", "--queue", "team", "--", "true")
    assert ok.returncode == 0, ok.stderr


def test_only_admins_ask_for_a_priority_above_a_queues_max_priority(
    service: Service, local_users: dict[str, User]
) -> None:
    # A higher priority evicts other users' work in the queue: a user's word is not enough.
    alice, bob = local_users["alice"], local_users["bob"]
    line = one_error_line(as_user(service, bob, "run", "--priority", "10", "--", "true"))
    assert "priority: priority 10 is above the 0 that queue 'default' lets users ask for" in line
    line = one_error_line(
        as_user(service, alice, "run", "--queue", "team", "--priority", "51", "--", "true")
    )
    assert "priority 51 is above the 50 that queue 'team' lets users ask for" in line
    for user, args in (
        (bob, ["--priority", "-5"]),
        (alice, ["--queue", "team", "--priority", "50"]),
    ):
        ok = as_user(service, user, "run", *args, "--", "true")
        assert ok.returncode == 0, ok.stderr
    assert service.run("--priority", "1000", "--", "true")  # root, an admin: no cap
    # Each queue's cap is shown, where any queue sets one (after its 6 columns of limits,
    # each "-" here).
    table = service.cli("queues").stdout
    # MAX PRI read where its heading is: which columns come before it depends on the queues
    # (PARENT and WEIGHT are shown only where they say something).
    at = table.splitlines()[0].index("MAX PRI")
    rows = {ln.split()[0]: ln[at:].split()[0] for ln in table.splitlines()[1:] if ln.strip()}
    assert (rows["team"], rows["default"]) == ("50", "0")


# Run as a user: POST argv[2] (a JSON job) to /v1/jobs on the Unix socket argv[1]; prints the
# status and the body.
POST_ON_SOCKET = """
import sys, httpx
c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), base_url="http://x")
r = c.post("/v1/jobs", content=sys.argv[2], headers={"Content-Type": "application/json"})
print(r.status_code, r.text)
"""


def test_a_service_not_run_as_root_runs_only_its_users_jobs(
    local_users: dict[str, User],
) -> None:
    alice, bob = local_users["alice"], local_users["bob"]
    # Not under tmp_path: pytest keeps that inside a directory only root may enter.
    shared = Path(tempfile.mkdtemp(prefix="ais-shared-"))
    shared.chmod(0o1777)
    sock, port = shared / "s.sock", free_port()
    up = subprocess.Popen(
        alice.cmd(alice.python, "-m", "aisched", "up", "--port", str(port), "--socket",
                  str(sock), "--data-dir", str(alice.home / f"svc-{port}"), "--cpus", "1",
                  "--mem", "1G"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for("alice's service", lambda: sock.exists() or up.poll() is not None)
        assert up.poll() is None, up.communicate()[0]
        sock.chmod(0o666)  # reachable, to show that reaching it is not enough
        env = {"AISCHED_SERVER": f"unix:{sock}"}
        # Bob's CLI sends nothing to another user's socket; a client of his that does send
        # a job is refused by the service.
        said = bob.aisched("run", "--", "true", env=env)
        assert said.returncode == 1 and f"is served by a process of {alice.name}" in said.stderr
        refused = subprocess.run(
            bob.cmd(bob.python, "-c", POST_ON_SOCKET, str(sock), '{"command": ["true"]}'),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.stdout.startswith("403 "), refused
        assert f"this aisched runs as {alice.name}, so it can run jobs only as {alice.name}" in (
            refused.stdout
        )
        ran = alice.aisched("run", "--", "id", "-u", env=env)
        assert ran.returncode == 0, ran.stderr
    finally:
        up.terminate()
        out, _ = up.communicate(timeout=30)
        shutil.rmtree(shared, ignore_errors=True)
    assert f"not running as root: only {alice.name}'s jobs can run" in out


def test_a_public_address_needs_tls_or_insecure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aisched", "up", "--host", "0.0.0.0", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "d"), "--socket", ""],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: refusing to listen on 0.0.0.0 without TLS: tokens and jobs would cross the "
        "network in clear; give --tls-cert and --tls-key, or --insecure to accept that"
    ]


def test_tls_on_a_public_address_serves_https(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    svc = Service(tmp_path / "home", free_port(), tmp_path, ["--host", "0.0.0.0",
                  "--tls-cert", str(cert), "--tls-key", str(key), "--cpus", "1"])  # fmt: skip
    svc.home.mkdir()
    svc.start(https=True)
    try:
        token = svc.admin_token()
        r = httpx.get(
            f"https://127.0.0.1:{svc.port}/v1/info",
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=str(cert)),
        )
        assert (r.status_code, r.json()["you"], r.json()["via"]) == (200, "root", "token")
    finally:
        svc.stop()


def test_huge_and_deep_bodies_are_refused_without_cost(service: Service) -> None:
    """The service's memory (RSS, from /proc via psutil, after a first request warmed it) may
    not grow by more than 50 MB while a 300 MB body is sent, declared or chunked."""
    pid = int(json.loads((service.home / "server.json").read_text())["pid"])
    proc = psutil.Process(pid)
    api = service.api
    assert api.get("/v1/jobs").status_code == 200
    before = proc.memory_info().rss
    chunk = b"x" * (1 << 20)

    def body() -> Iterator[bytes]:
        for _ in range(300):
            yield chunk

    for headers in ({"Content-Length": str(300 << 20)}, {}):
        try:
            r = api.post("/v1/jobs", content=body(), headers=headers)
            status = r.status_code
        except httpx.HTTPError:  # closed while we were still sending: refused too
            status = 413
        assert status == 413
    assert proc.memory_info().rss - before < 50 << 20
    deep = "[" * 100_000 + "]" * 100_000
    r = api.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["problems"]) == (
        422,
        ["request: nested deeper than 64 levels at line 1, column 65"],
    )
    assert api.get("/v1/healthz").json() == service.alive_leader()
    assert os.path.exists(service.socket)


def test_a_client_that_never_finishes_its_headers_is_disconnected(service: Service) -> None:
    """Slowloris: a connection that trickles a request's headers is closed by the service
    (after HEADER_TIMEOUT_S), not kept open for ever; the service goes on answering."""
    with socket.create_connection(("127.0.0.1", service.port)) as conn:
        conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: localhost\r\n")  # and never the blank line
        conn.settimeout(HEADER_TIMEOUT_S + 20)
        assert conn.recv(1) == b""  # closed by the service (a time-out would raise instead)
    assert service.api.get("/v1/healthz").json() == service.alive_leader()


def _send_head(port: int, head: bytes, pad: int) -> bytes:
    """Send `head`, then `pad` bytes of one header's value 64 KiB at a time, never the blank
    line that ends the headers, stopping once the service answers; what it answered, read
    until it closes the connection (its reset, once it has answered, ends it too)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head)
        conn.settimeout(HEADER_TIMEOUT_S + 20)
        sent = 0
        with contextlib.suppress(OSError):  # closed by the service as it sends
            while sent < pad and not select.select([conn], [], [], 0)[0]:
                conn.sendall(b"a" * (1 << 16))
                sent += 1 << 16
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := conn.recv(65536):
                answer += chunk
        return answer


def test_a_request_head_over_64_kib_is_answered_431_and_closed(service: Service) -> None:
    """The service read a request's head (its request line and headers) without a bound until
    it ended: 64 connections each sending a header of 16 MB (never finished) took its memory
    from 129 MB to 1.1 GB, before any token was asked for. A head over MAX_HEAD_BYTES is
    answered 431 and its connection closed, as soon as it is over; the service goes on
    answering, and a head under the bound is read as ever."""
    start = b"GET /v1/healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: "
    answer = _send_head(service.port, start, 1 << 20)
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:200]
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {
        "error": f"request head too large: its request line and headers are over "
        f"{MAX_HEAD_BYTES // 1024} KiB, the most this service reads before they end",
        "problems": [],
    }
    assert service.api.get("/v1/healthz").json() == service.alive_leader()
    # Just under the bound, and a body far over it (the bound is the head's): read as ever.
    pad = b"a" * (MAX_HEAD_BYTES - len(start) - 200)
    with socket.create_connection(("127.0.0.1", service.port)) as conn:
        conn.sendall(start + pad + b"\r\nConnection: close\r\n\r\n")
        assert conn.makefile("rb").readline() == b"HTTP/1.1 200 OK\r\n"
    big = service.api.post("/v1/jobs", content=b"{" + b" " * (4 * MAX_HEAD_BYTES) + b"}")
    assert big.status_code == 422, big.text


# Run as a user: hold `n` connections to the service (its socket's path, or HOST:PORT with a
# token), each following a job's logs, which the service keeps open; then make one more and
# print its answer's status line and body; hold them until stdin closes.
HOLD_CONNECTIONS = r"""
import socket, sys
where, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
auth = f"Authorization: Bearer {sys.argv[4]}\r\n" if len(sys.argv) > 4 else ""
def connect():
    if where.startswith("/"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(where)
        return s
    host, _, port = where.rpartition(":")
    return socket.create_connection((host, int(port)))
held = []
for _ in range(n):
    s = connect()
    follow = f"GET /v1/jobs/{job}/logs?follow=true HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n"
    s.sendall(follow.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096) or sys.exit(f"closed: {head!r}")
    assert head.startswith(b"HTTP/1.1 200"), head
    held.append(s)
extra = connect()
ask = f"GET /v1/jobs HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
try:
    extra.sendall(ask.encode())
except OSError:
    pass  # refused and closed before the request went out: its answer is still there to read
answer = b""
while chunk := extra.recv(65536):
    answer += chunk
status, _, rest = answer.decode().partition("\r\n")
print(status)
print(rest.partition("\r\n\r\n")[2], flush=True)
sys.stdin.read()
"""


@contextmanager
def holding(
    svc: Service, argv: list[str], job: str, n: int, token: str = ""
) -> Iterator[tuple[str, str]]:
    """`n` connections held by the process `argv` runs (a user's), and what one more got: on
    the socket, or over TCP with `token`."""
    where = [f"127.0.0.1:{svc.port}", token] if token else [str(svc.socket)]
    proc = subprocess.Popen(
        [*argv, "-c", HOLD_CONNECTIONS, where[0], job, str(n), *where[1:]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        status, body = proc.stdout.readline().strip(), proc.stdout.readline().strip()
        assert status, proc.stderr.read() if proc.stderr else ""
        yield status, body
    finally:
        proc.stdin.close()
        proc.wait(30)


@contextmanager
def bounded_service(tmp_path: Path, owner: User) -> Iterator[tuple[Service, str]]:
    """The service with `limits.connections_per_peer: 4`, and a job of `owner`'s running,
    whose logs the connections `holding` makes follow."""
    tmp_path.chmod(0o755)
    with local_service(tmp_path, config=CONFIG + "limits:\n  connections_per_peer: 4\n") as svc:
        jid = run_as(svc, owner, "--", "sleep", "300")
        svc.wait_state(jid, "running")
        yield svc, jid


def test_one_user_cannot_take_every_connection_from_the_others(
    tmp_path: Path, local_users: dict[str, User]
) -> None:
    """A user holding connections open (each one free to open again when the service closes
    it) is bound to `limits.connections_per_peer`: one more is refused with 429 at once, and
    other users and root are still answered. Without the bound, the server's own limit (4096)
    is shared by everyone: one user's idle connections had every other request answered 503."""
    alice, bob = local_users["alice"], local_users["bob"]
    with bounded_service(tmp_path, bob) as (svc, jid):
        with holding(svc, bob.cmd(bob.python), jid, 4) as (status, body):
            assert status == "HTTP/1.1 429 Too Many Requests"
            assert json.loads(body)["error"] == (
                "too many connections: user aisbob holds 4 open connections to this service, "
                "the most one may (limits.connections_per_peer); close some and try again"
            )
            assert as_user(svc, alice, "jobs").returncode == 0
            with holding(svc, [sys.executable], jid, 4) as (root_status, _):
                assert root_status == "HTTP/1.1 200 OK"  # admins are not bound
        # Closed, bob's connections count no more.
        assert as_user(svc, bob, "jobs").returncode == 0


def test_one_local_user_cannot_take_every_tcp_connection_from_the_others(
    tmp_path: Path, local_users: dict[str, User]
) -> None:
    """Over TCP on the loopback, every local user comes from 127.0.0.1: counted by address,
    alice holding `limits.connections_per_peer` connections had bob's TCP clients (the
    dashboard in a browser, the CLI with a token) refused. The kernel says which user owns
    each client's socket (`listeners.ClientOwners`), and each user has a count of their own,
    the same one as on the socket."""
    alice, bob = local_users["alice"], local_users["bob"]
    with bounded_service(tmp_path, alice) as (svc, jid):
        alice_token = svc.cli("token", "create", alice.name).stdout.strip()
        bob_tcp = {
            "AISCHED_SERVER": svc.url,
            "AISCHED_TOKEN": svc.cli("token", "create", bob.name).stdout.strip(),
        }
        with holding(svc, alice.cmd(alice.python), jid, 4, alice_token) as (status, body):
            assert status == "HTTP/1.1 429 Too Many Requests"
            proc = bob.aisched("jobs", "--json", env=bob_tcp)
            assert proc.returncode == 0, proc.stderr
            assert [j["id"] for j in json.loads(proc.stdout)["jobs"]] == [jid]
            assert json.loads(body)["error"] == (
                "too many connections: user aisalice holds 4 open connections to this "
                "service, the most one may (limits.connections_per_peer); close some and try "
                "again"
            )
            # The socket and TCP are one count: alice's connections on the socket are spent.
            refused = as_user(svc, alice, "jobs")
            assert "too many connections: user aisalice holds 4" in refused.stderr


def peak_rss_growth(pid: int, read: Callable[[], object]) -> int:
    """How far `read()` took the resident memory of process `pid` above where it was (its peak
    is reset first, through /proc/PID/clear_refs)."""
    status = Path(f"/proc/{pid}/status")

    def kib(field: str) -> int:
        line = next(x for x in status.read_text().splitlines() if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) is now the present
    before = kib("VmRSS")
    read()
    return kib("VmHWM") - before


def test_reading_a_big_jobs_logs_never_holds_them_whole(service: Service) -> None:
    """A job's logs are streamed a chunk at a time, never read whole: 20 tasks' logs of 9 MB
    each (180 MB) are read, whole and followed, while the service's resident memory grows by
    less than 50 MB. Read whole, decoded, split and joined, the logs of a job of many tasks
    took several times their size (386 MB of 40 tasks: 1.4 GB), for each request, so that a
    few reads of one user's job could exhaust the machine's memory."""
    jid = service.run(
        "--replicas", "20", "--cpus", "0.05", "--mem", "32M", "--",
        "sh", "-c", "head -c 9000000 /dev/zero | tr '\\0' x | fold -w 99",
    )  # fmt: skip
    service.wait_state(jid, "succeeded", timeout_s=120)
    pid = int(json.loads((service.home / "server.json").read_text())["pid"])
    api = service.api
    sizes: list[int] = []

    def read(params: dict[str, str]) -> Callable[[], object]:
        def go() -> None:
            with api.stream("GET", f"/v1/jobs/{jid}/logs", params=params, timeout=120) as r:
                assert r.status_code == 200
                sizes.append(sum(len(chunk) for chunk in r.iter_bytes()))

        return go

    for params in ({}, {"follow": "true"}):
        assert peak_rss_growth(pid, read(params)) < 50 << 20
    # Each task's: 90,909 lines of 99 x's, then 9 x's; each line prefixed with its task.
    prefixes = [len(f"[main-{i}] ") for i in range(20)]
    assert sizes == [sum(90_909 * (p + 100) + p + 10 for p in prefixes)] * 2


# Run as a user: a server on a free loopback port that answers every request with an empty
# job list and prints what it was sent; its port first.
IMPOSTOR = r"""
import socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.settimeout(5)
    try:
        got = conn.recv(65536)
        print(repr(got), flush=True)
        if got:
            conn.sendall(b'HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{"jobs":[]}')
    except OSError:
        pass
    conn.close()
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "[::ffff:127.0.0.1]", "localhost"])
def test_the_cli_sends_nothing_to_another_users_server_on_the_loopback(
    local_users: dict[str, User], host: str
) -> None:
    """Any local user may listen on a free loopback port, the default one too while the
    system service is down (the CLI then falls back to it): another user's CLI sent it their
    token (and would have sent a job's command and `--env` values). However the server is
    written: 0.0.0.0 and IPv4 written as IPv6 reach the same listener (as do the machine's
    own addresses and names: `listeners.on_this_machine`)."""
    alice, bob = local_users["alice"], local_users["bob"]
    impostor = subprocess.Popen(
        bob.cmd(bob.python, "-c", IMPOSTOR), stdout=subprocess.PIPE, text=True
    )
    assert impostor.stdout is not None
    try:
        port = int(impostor.stdout.readline())
        url = f"http://{host}:{port}"
        proc = alice.aisched(
            "jobs", env={"AISCHED_SERVER": url, "AISCHED_TOKEN": "ais_alices_secret"}
        )
    finally:
        impostor.kill()
        sent, _ = impostor.communicate(timeout=30)
    assert "ais_alices_secret" not in sent and "GET" not in sent
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr == (
        f"error: {url} is served by a process of {bob.name}, not by root's aisched or yours: "
        "nothing (no token, no job) is sent to it (--server or AISCHED_SERVER choose another)\n"
    )


# Run as a user: a server on a free loopback port that resets every other connection it is
# given (the first of each CLI run that makes two: one to check whose it is, then the request)
# and answers the others as IMPOSTOR does; with argv[1] == "defer", its listener has
# TCP_DEFER_ACCEPT: a connection stays unaccepted until its first data, and the kernel names
# no owner (uid 0) for an unaccepted one.
RESETTER = r"""
import socket, struct, sys
srv = socket.socket()
if sys.argv[1] == "defer":
    srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 30)
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
for n in range(1_000_000):
    conn, _ = srv.accept()
    if n % 2 == 0:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # a reset: its socket is gone at once
        continue
    conn.settimeout(5)
    try:
        got = conn.recv(65536)
        print(repr(got), flush=True)
        if got:
            conn.sendall(b'HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{"jobs":[]}')
    except OSError:
        pass
    conn.close()
"""


@pytest.mark.parametrize("listener", ["defer", "plain"])
def test_the_cli_checks_the_connection_it_sends_on_and_refuses_an_unknown_owner(
    local_users: dict[str, User], listener: str
) -> None:
    """The CLI checked whose process served a loopback port on a connection made for it, then
    sent the request on another, and went on when the kernel named no owner. Another user's
    listener that reset that first connection (gone before it was looked up: no owner) was
    sent the token on the second in 3 runs out of 5; one with TCP_DEFER_ACCEPT was sent it
    every time (the kernel names uid 0, root's, for a connection not yet accepted). Now the
    connection the request goes on is the one checked, and an unknown owner is refused."""
    alice, bob = local_users["alice"], local_users["bob"]
    impostor = subprocess.Popen(
        bob.cmd(bob.python, "-c", RESETTER, listener), stdout=subprocess.PIPE, text=True
    )
    assert impostor.stdout is not None
    try:
        url = f"http://127.0.0.1:{int(impostor.stdout.readline())}"
        runs = [
            alice.aisched("jobs", env={"AISCHED_SERVER": url, "AISCHED_TOKEN": "ais_alices"})
            for _ in range(4)
        ]
    finally:
        impostor.kill()
        sent, _ = impostor.communicate(timeout=30)
    assert "ais_alices" not in sent and "GET" not in sent
    bobs = (
        f"error: {url} is served by a process of {bob.name}, not by root's aisched or yours: "
        "nothing (no token, no job) is sent to it (--server or AISCHED_SERVER choose another)\n"
    )
    unknown = (
        f"error: {url}: cannot tell whose process serves it (the kernel names no owner for the "
        "connection: it was closed at once, or is served from another network namespace): "
        "nothing (no token, no job) is sent to it (--server or AISCHED_SERVER choose another)\n"
    )
    unreachable = (
        f"error: cannot reach the aisched service at {url} (ConnectError); is `aisched up` "
        "running? (--server or AISCHED_SERVER choose another)\n"
    )
    for proc in runs:
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        # Reset as it was connected (a connection that failed), or as it was looked up (no
        # owner), or after (bob's). A deferred connection is bob's, reset or not.
        assert proc.stderr in ((bobs,) if listener == "defer" else (bobs, unknown, unreachable))
    if listener == "plain":  # every other run was given a connection that bob answers
        assert [proc.stderr for proc in runs[1::2]] == [bobs, bobs]


# Run as a user: IMPOSTOR on a Unix socket at argv[1] (a name in a shared directory).
IMPOSTOR_UNIX = IMPOSTOR.replace("srv = socket.socket()", "srv = socket.socket(socket.AF_UNIX)")
IMPOSTOR_UNIX = IMPOSTOR_UNIX.replace('srv.bind(("127.0.0.1", 0))', "srv.bind(sys.argv[1])")
IMPOSTOR_UNIX = IMPOSTOR_UNIX.replace("srv.getsockname()[1]", "'ready'")


def test_the_cli_sends_nothing_to_another_users_server_on_a_unix_socket(
    local_users: dict[str, User],
) -> None:
    """A socket name in /tmp that one user's service used and left (it removes its socket when
    it stops) may be taken by another: the CLI sent that user the job's command and its `--env`
    values, where over TCP it already refused."""
    alice, bob = local_users["alice"], local_users["bob"]
    shared = Path(tempfile.mkdtemp(prefix="ais-shared-"))
    shared.chmod(0o1777)
    sock = shared / "alices.sock"
    impostor = subprocess.Popen(
        bob.cmd(bob.python, "-c", IMPOSTOR_UNIX, str(sock)), stdout=subprocess.PIPE, text=True
    )
    assert impostor.stdout is not None
    try:
        assert impostor.stdout.readline() == "ready\n"
        sock.chmod(0o777)  # bob lets anyone connect
        proc = alice.aisched(
            "run", "--env", "SECRET=hunter2", "--", "echo", "hi",
            env={"AISCHED_SERVER": f"unix:{sock}"},
        )  # fmt: skip
    finally:
        impostor.kill()
        sent, _ = impostor.communicate(timeout=30)
        shutil.rmtree(shared, ignore_errors=True)
    assert "hunter2" not in sent and "POST" not in sent
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr == (
        f"error: unix:{sock} is served by a process of {bob.name}, not by root's aisched or "
        "yours: nothing (no token, no job) is sent to it (--server or AISCHED_SERVER choose "
        "another)\n"
    )


def test_listing_many_jobs_with_long_commands_never_holds_them_all(service: Service) -> None:
    """A listing is read from the store and written a page at a time: 2,000 jobs whose
    commands are 90 KB each (a user's own listing shows them: 180 MB) are listed while the
    service's resident memory grows by less than 100 MB. Read and built whole, 1,000 of them
    took 265 MB more, so that a few listings at once of one user's 10,000 jobs (its
    `user_max_jobs`) could exhaust the machine's memory."""
    blocker = service.run("--cpus", "0.1", "--mem", "64M", "--", "sleep", "300")
    service.wait_state(blocker, "running")
    arg = "x" * 90_000
    for k in range(200):  # waiting on the blocker: none of them runs
        jobs = [
            {"name": f"j{k}-{i}", "command": ["true", arg], "depends_on": [blocker],
             "resources": {"cpus": 0.1, "mem": "16M"}}
            for i in range(10)
        ]  # fmt: skip
        assert service.api.post("/v1/jobs", json={"jobs": jobs}).status_code == 201
    pid = int(json.loads((service.home / "server.json").read_text())["pid"])
    listed: list[list[str]] = []

    def read() -> None:
        r = service.api.get("/v1/jobs", params={"limit": 100_000}, timeout=120)
        assert r.status_code == 200
        listed.append([j["id"] for j in r.json()["jobs"]])

    assert service.api.get("/v1/jobs", params={"limit": 5}).status_code == 200
    assert peak_rss_growth(pid, read) < 100 << 20
    ids = [int(i) for i in listed[0]]
    assert (len(ids), ids == sorted(ids, reverse=True), ids[-1]) == (2001, True, int(blocker))
    service.cli("cancel", blocker)  # and its dependents end with it


def test_another_user_sees_no_message_naming_a_jobs_files(
    service: Service, local_users: dict[str, User]
) -> None:
    # A job's end and its tasks' messages name its files ("... /home/aisalice/secret-project
    # ..."), and everyone could read them in `aisched show` and `aisched jobs`.
    alice, bob = local_users["alice"], local_users["bob"]
    project = alice.home / "secret-project"
    subprocess.run(alice.cmd("mkdir", str(project)), check=True)
    # The first holds every GPU, so the second waits; its directory goes meanwhile.
    first = run_as(service, alice, "--gpus", "4", "--", "sleep", "2")
    second = run_as(service, alice, "--gpus", "1", "--max-retries", "0", "--workdir",
                    str(project), "--", "true")  # fmt: skip
    service.wait_state(first, "running")
    subprocess.run(alice.cmd("rmdir", str(project)), check=True)
    done = service.wait_state(second, "failed", "succeeded", timeout_s=60)
    assert done["state"] == "failed"
    mine = json.loads(as_user(service, alice, "show", "--json", second).stdout)
    assert "secret-project" in json.dumps(mine)  # the owner is told what went wrong
    seen = as_user(service, bob, "show", "--json", second).stdout
    listed = as_user(service, bob, "jobs", "--all", "--json").stdout
    assert json.loads(seen)["state"] == "failed"
    assert "secret-project" not in seen and "secret-project" not in listed


def test_a_jobs_file_names_reach_an_admins_terminal_as_text(
    service: Service, local_users: dict[str, User]
) -> None:
    # bob names his program so that its path, in the messages and events of its failure and
    # in its command, holds terminal escapes (a colour, a window title, a write to the
    # clipboard), a right-to-left override and rich markup. Root's `aisched jobs` and
    # `aisched show` printed the escapes as they were, to root's terminal, and the closing tag
    # `[/x]` made `aisched show` fail with a traceback (rich's MarkupError).
    bob = local_users["bob"]
    folder = bob.home / "[" / "x]"
    name = "run\x1b[31mRED\x1b]0;TITLE\x07\x1b]52;c;ZWNobyBwd25lZA==\x1b\\\u202egnp.sh"
    program = folder / name
    subprocess.run(bob.cmd("mkdir", "-p", str(folder)), check=True)
    try:
        subprocess.run(bob.cmd("sh", "-c", 'printf "#!/no/such/interpreter\\n" > "$0"',
                               str(program)), check=True)  # fmt: skip
        subprocess.run(bob.cmd("chmod", "755", str(program)), check=True)
        jid = run_as(service, bob, "--max-retries", "0", "--", str(program))
        assert service.wait_state(jid, "failed")["exit_code"] == 127

        listed = service.cli("jobs", "--all").stdout
        shown = service.cli("show", jid).stdout
        for out in (listed, shown):
            assert not {"\x1b", "\x07", "\u202e"} & set(out), out
        escaped = r"run\x1b[31mRED\x1b]0;TITLE\x07\x1b]52;c;ZWNobyBwd25lZA==\x1b\\u202egnp.sh"
        assert f"no such file: {folder}/{escaped}" in listed
        # rich folds long lines: the path is whole once the folds are undone
        assert f"{folder}/{escaped}" in "".join(shown.splitlines())
        # bob's own `run -f` ends with the message too, which it printed as markup as well
        followed = as_user(service, bob, "run", "-f", "--max-retries", "0", "--", str(program))
        assert followed.returncode == 127, followed.stderr
        assert f"failed: task main-0 no such file: {folder}/{escaped}" in "".join(
            followed.stderr.splitlines()
        )
    finally:
        subprocess.run(bob.cmd("rm", "-rf", str(bob.home / "[")), check=True)


def test_the_token_list_prints_a_note_as_text(service: Service) -> None:
    # A token's note is free text: `[/x]` in it made `aisched token list` fail with rich's
    # MarkupError, and its escapes reached the terminal.
    made = service.cli("token", "create", "root", "--note", "ci [/x] \x1b[31mred")
    assert made.returncode == 0, made.stderr
    listed = service.cli("token", "list", check=False)
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout
    assert "ci [/x]" in listed.stdout and r"\x1b[31m" in listed.stdout  # (a narrow table folds)


# Run as a user: leave a dead socket at argv[1] (bound, never listened on) of mode argv[2].
DEAD_SOCKET = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], int(sys.argv[2], 8))
"""


@pytest.mark.parametrize(("mode", "why"), [("755", "use"), ("777", "remove")])
def test_a_socket_another_user_left_is_named_as_theirs(
    local_users: dict[str, User], mode: str, why: str
) -> None:
    """A dead socket of bob's at the path alice's service was given was called "another
    aisched is serving"; one she may connect to but not remove (a sticky /tmp) was a
    PermissionError traceback."""
    alice, bob = local_users["alice"], local_users["bob"]
    shared = Path(tempfile.mkdtemp(prefix="ais-shared-"))
    try:
        shared.chmod(0o1777)
        sock = shared / "s.sock"
        subprocess.run(bob.cmd(bob.python, "-c", DEAD_SOCKET, str(sock), mode), check=True)
        # A data directory of this run's own: one an earlier run left (the users outlive a
        # run on a developer's machine) was migrated, and said so before the error.
        data = alice.home / f"svc-{mode}-{shared.name}"
        got = alice.aisched(
            "up", "--port", str(free_port()), "--socket", str(sock),
            "--data-dir", str(data), "--cpus", "1", "--mem", "1G",
        )  # fmt: skip
        tail = "may, or give --socket" if why == "remove" else "may remove it, or give --socket"
        assert (got.returncode, got.stderr) == (
            2,
            f"error: {sock} is a socket of {bob.name} that this user may not {why}; its "
            f"owner or root {tail}\n",
        )
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(alice.home / f"svc-{mode}-{shared.name}", ignore_errors=True)


def _follow_as(svc: Service, token: str, job_id: str) -> subprocess.Popen[str]:
    """`aisched logs -f JOB` over TCP with `token`, once it has shown the job's first line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aisched", "logs", "-f", job_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**svc.env(), "AISCHED_SERVER": svc.url, "AISCHED_TOKEN": token},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"
    return proc


def test_a_followed_log_stops_when_its_token_is_revoked_or_expires(service: Service) -> None:
    """A followed log used to stream until its job ended, whatever became of the token that
    asked for it: checked once, at the start."""
    job_id = service.run("--", "sh", "-c", "echo started; sleep 120")
    service.wait_state(job_id, "running")
    token = service.cli("token", "create", "root", "--note", "follow").stdout.strip()
    token_id = json.loads(service.cli("token", "list", "--json").stdout)[-1]["id"]
    follower = _follow_as(service, token, job_id)
    try:
        service.cli("token", "revoke", token_id)
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert (follower.returncode, out) == (2, FOLLOW_STOPPED)  # refused, as any 401
    assert "the token is not valid (unknown, revoked or expired)" in err

    # Through the API itself, with a token that expires as the log streams.
    expiring = service.cli("token", "create", "root", "--expires", "3s").stdout.strip()
    with httpx.stream(
        "GET",
        f"{service.url}/v1/jobs/{job_id}/logs",
        params={"follow": "true"},
        headers={"Authorization": f"Bearer {expiring}"},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        assert "".join(r.iter_text()) == "started\n" + FOLLOW_STOPPED
    assert service.job(job_id)["state"] == "running"  # the job goes on; only the stream ended


def _https_service(tmp_path: Path, name: str, cert: Path, key: Path) -> Service:
    svc = Service(tmp_path / name, free_port(), tmp_path, ["--host", "0.0.0.0",
                  "--tls-cert", str(cert), "--tls-key", str(key), "--cpus", "1"])  # fmt: skip
    svc.home.mkdir()
    return svc


def test_tls_files_are_checked_at_start_and_the_cli_says_why_it_distrusts_a_server(
    tmp_path: Path,
) -> None:
    """An expired certificate used to start without a word, a key every user could read was
    served, and the CLI said only `(ConnectError); is aisched up running?` of a certificate
    it did not trust."""
    cert, key, expired = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "old.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-signkey", str(key), "-days", "-1",
         "-out", str(expired)],
        check=True, capture_output=True,
    )  # fmt: skip
    key.chmod(0o644)
    svc = _https_service(tmp_path, "refused", cert, key)
    proc = svc.cli("up", *svc.args, "--port", str(svc.port), "--data-dir", str(svc.home),
                   "--socket", "", check=False)  # fmt: skip
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (
        2,
        [
            f"error: {key}: the TLS private key is readable by every user of this machine "
            f"(mode 0644), who could pose as this service; make it private: chmod 600 {key}"
        ],
    )
    key.chmod(0o600)

    svc = _https_service(tmp_path, "expired", expired, key)
    svc.start(https=True)
    try:
        assert (
            f"WARNING aisched.service: {expired}: the TLS certificate expired on "
            in svc.log.read_text()
        )
        trusting = {
            "AISCHED_SERVER": f"https://127.0.0.1:{svc.port}",
            "SSL_CERT_FILE": str(expired),
        }
        out = subprocess.run(
            [sys.executable, "-m", "aisched", "jobs"],
            capture_output=True, text=True, env={**svc.env(), **trusting}, timeout=60,
        )  # fmt: skip
        assert (out.returncode, out.stderr) == (
            1,
            f"error: cannot reach the aisched service at https://127.0.0.1:{svc.port}: its TLS "
            "certificate was refused (certificate verify failed: certificate has expired); a "
            "private CA is trusted with SSL_CERT_FILE=CA.pem (docs/security.md)\n",
        )
    finally:
        svc.stop()

    svc = _https_service(tmp_path, "valid", cert, key)
    svc.start(https=True)
    try:
        assert "the TLS" not in svc.log.read_text()
        tcp = {
            "AISCHED_SERVER": f"https://127.0.0.1:{svc.port}",
            "AISCHED_TOKEN": svc.admin_token(),
        }
        out = subprocess.run(
            [sys.executable, "-m", "aisched", "jobs"],
            capture_output=True, text=True, env={**svc.env(), **tcp}, timeout=60,
        )  # fmt: skip
        assert out.returncode == 1
        assert "(certificate verify failed: self-signed certificate)" in out.stderr
        out = subprocess.run(
            [sys.executable, "-m", "aisched", "jobs"],
            capture_output=True, text=True, timeout=60,
            env={**svc.env(), **tcp, "SSL_CERT_FILE": str(cert)},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    finally:
        svc.stop()


def test_with_several_instances_the_cli_says_why_each_could_not_be_reached(
    tmp_path: Path,
) -> None:
    """Given several instances (HA), the CLI said only why the last could not be reached,
    by its exception's class (`... at http://127.0.0.1:PORT (ConnectError); is aisched up
    running?`): a certificate it did not trust, from the first, went unsaid; and a stream that
    went on from another instance said `lost the aisched service at URL (ConnectError)` of
    one whose certificate it refused."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    svc = _https_service(tmp_path, "distrusted", cert, key)
    svc.start(https=True)
    distrusted, gone = f"https://127.0.0.1:{svc.port}", f"http://127.0.0.1:{free_port()}"
    env = {**svc.env(), "AISCHED_SERVER": f"{distrusted},{gone}", "AISCHED_TOKEN": "ais_t"}
    refused = "its TLS certificate was refused: certificate verify failed: self-signed certificate"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "aisched", "jobs"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        follow = subprocess.Popen(
            [sys.executable, "-m", "aisched", "logs", "-f", "1"],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        assert follow.stderr is not None
        try:
            lost = follow.stderr.readline()
        finally:
            follow.kill()
            follow.wait(10)
    finally:
        svc.stop()
    assert (out.returncode, out.stderr) == (
        1,
        f"error: cannot reach any instance of the aisched service: {distrusted} ({refused}); "
        f"{gone} (ConnectError); a private CA is trusted with SSL_CERT_FILE=CA.pem "
        "(docs/security.md)\n",
    )
    assert lost == (
        f"aisched: lost the aisched service at {distrusted} ({refused}); going on with "
        "another instance\n"
    )

"""The CLI goes through the proxy the environment names (HTTPS_PROXY, HTTP_PROXY, less what
NO_PROXY names) as any httpx client does: since it made its own connections, to check whose
server it talks to, it took none, and a user who reaches a remote aisched only through a
proxy could not reach it. A server on this machine is still connected to directly, and a
proxy on this machine is checked as a server is. A real proxy (the standard library's
sockets), a real service and the real CLI."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import Service, free_port, local_service
from users import User

# A name no resolver knows: only the proxy, which takes it for 127.0.0.1, reaches it, so a
# request that reaches the service went through the proxy.
NAME = "aisched.test"

# Run as a user: an HTTP proxy on a free loopback port, printed first. It prints each
# request's line (`CONNECT host:port`, or a forwarded `GET http://...`), and whether a
# forwarded request carried a token, then tunnels (CONNECT) or forwards it to its host, NAME
# being 127.0.0.1.
PROXY = r"""
import select, socket, sys, threading, urllib.parse
NAME = sys.argv[1]
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)

def pipe(a, b):
    try:
        relay(a, b)
    except OSError:  # either side reset: the exchange is over
        pass

def relay(a, b):
    while True:
        ready, _, _ = select.select([a, b], [], [], 60)
        if not ready:
            return
        for s in ready:
            data = s.recv(65536)
            if not data:
                return
            (b if s is a else a).sendall(data)

def upstream(host, port):
    return socket.create_connection(("127.0.0.1" if host == NAME else host, port))

def serve(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            got = conn.recv(65536)
            if not got:
                return
            head += got
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.decode().split(" ")
        print(method, target, flush=True)
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            with upstream(host, int(port)) as up:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                up.sendall(rest.partition(b"\r\n\r\n")[2])
                pipe(conn, up)
            return
        print("token" if b"authorization: bearer" in rest.lower() else "no token", flush=True)
        url = urllib.parse.urlsplit(target)
        with upstream(url.hostname, url.port) as up:
            path = url.path + ("?" + url.query if url.query else "")
            up.sendall(f"{method} {path} {version}\r\n".encode() + rest)
            pipe(conn, up)

while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


@contextmanager
def proxy(cmd: list[str]) -> Iterator[tuple[str, list[str]]]:
    """The proxy run by `cmd` (a Python interpreter, as some user): its URL, and the lines it
    printed, filled in when the block ends."""
    proc = subprocess.Popen([*cmd, "-c", PROXY, NAME], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    printed: list[str] = []
    try:
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}", printed
    finally:
        proc.kill()
        printed.extend(proc.communicate(timeout=30)[0].splitlines())


@contextmanager
def serving(tmp_path: Path, *args: str, https: bool = False) -> Iterator[Service]:
    """A service on every address (a loopback listener answers to loopback names only, and a
    remote server is what a proxy is for), with `args`."""
    svc = Service(tmp_path / "home", free_port(), tmp_path, ["--host", "0.0.0.0", *args])
    svc.home.mkdir()
    svc.start(https=https)
    try:
        yield svc
    finally:
        svc.stop()


def cli(svc: Service, server: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`aisched jobs` against `server`, with a token, no proxy but those in `env`."""
    clean = {k: v for k, v in svc.env().items() if not k.lower().endswith("_proxy")}
    token = {"AISCHED_SERVER": server, "AISCHED_TOKEN": svc.admin_token()}
    return subprocess.run(
        [sys.executable, "-m", "aisched", "jobs"],
        capture_output=True, text=True, env={**clean, **token, **env}, timeout=60,
    )  # fmt: skip


def test_an_https_server_is_reached_through_the_https_proxy(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME},IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    with serving(tmp_path, *tls, https=True) as svc, proxy([sys.executable]) as (url, printed):
        env = {"HTTPS_PROXY": url, "NO_PROXY": "localhost,example.org", "SSL_CERT_FILE": str(cert)}
        through = cli(svc, f"https://{NAME}:{svc.port}", **env)
        # This machine's server is connected to directly, proxy or not.
        direct = cli(svc, f"https://127.0.0.1:{svc.port}", **env)
    assert (through.returncode, through.stderr) == (0, "")
    assert (direct.returncode, direct.stderr) == (0, "")
    assert printed == [f"CONNECT {NAME}:{svc.port}"]


def test_an_http_server_is_reached_through_the_http_proxy(tmp_path: Path) -> None:
    with serving(tmp_path, "--insecure") as svc, proxy([sys.executable]) as (url, printed):
        through = cli(svc, f"http://{NAME}:{svc.port}", HTTP_PROXY=url)
        direct = cli(svc, f"http://localhost:{svc.port}", HTTP_PROXY=url)
        skipped = cli(svc, f"http://{NAME}:{svc.port}", HTTP_PROXY=url, NO_PROXY=NAME)
    assert (through.returncode, through.stderr) == (0, "")
    assert (direct.returncode, direct.stderr) == (0, "")
    # NO_PROXY: the CLI looks the name up itself, and no resolver knows it.
    assert skipped.returncode == 1 and "cannot reach" in skipped.stderr
    assert printed == [f"GET http://{NAME}:{svc.port}/v1/jobs?limit=1000", "token"]


def test_a_proxy_another_user_runs_here_is_sent_nothing(
    tmp_path: Path, local_users: dict[str, User]
) -> None:
    """A forwarding proxy reads the request, token included, and any proxy is sent its own
    password: one on this machine must be root's or the user's, as a server must."""
    bob = local_users["bob"]
    with local_service(tmp_path) as svc, proxy(bob.cmd(bob.python)) as (url, printed):
        runs = {
            var: cli(svc, f"{scheme}://{NAME}:{svc.port}", **{var: url})
            for var, scheme in (("HTTP_PROXY", "http"), ("HTTPS_PROXY", "https"))
        }
    assert printed == []
    for var, proc in runs.items():
        scheme = "https" if var == "HTTPS_PROXY" else "http"
        assert (proc.returncode, proc.stderr) == (
            1,
            f"error: {scheme}://{NAME}:{svc.port}: the proxy {url} ({var}) is on this machine "
            f"and it is run by a process of {bob.name}, not by root or you: nothing (no "
            f"token, no job) is sent through it (NO_PROXY={NAME} connects to the server "
            "directly)\n",
        )

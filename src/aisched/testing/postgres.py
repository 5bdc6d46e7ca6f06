"""A real, throw-away PostgreSQL server for tests and benchmarks: `initdb` and `pg_ctl` of the
installed PostgreSQL (Debian's `postgresql` package) in a temporary directory.

The server listens on a Unix socket in that directory only (no TCP port), so it can reach
nothing and nothing can reach it from outside the machine. PostgreSQL refuses to run as root:
under root the directory is handed to the unprivileged `postgres` user and the server runs as
that user (`setpriv`); under any other user it runs as that user. Clients authenticate by
`trust` on the socket (the directory itself is the boundary: 0700, owned by the server's user,
the socket's directory opened to its clients).

A watchdog process started beside the server stops it and removes the directory when the
process that started it is gone without calling `stop()` (a pytest session killed with -9), so
no server outlives its tests.

`durable=False` (tests) turns fsync and synchronous commit off: a crash of the machine may
lose the last commits, which a throw-away server does not care about; benchmarks that compare
stores keep the defaults.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from aisched.model.numerals import is_decimal


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (install Debian's `postgresql`)."""


def bin_dir() -> Path:
    """Where initdb and pg_ctl are: `pg_config --bindir`, else the newest Debian version."""
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        d = Path(out.stdout.strip())
        if (d / "initdb").exists():
            return d
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)
    for found_dir in reversed(versions):
        if Path(found_dir, "initdb").exists():
            return Path(found_dir)
    raise PostgresUnavailable(
        "no PostgreSQL server found (initdb, pg_ctl): install it (Debian: apt-get install "
        "postgresql)"
    )


def _version_key(path: str) -> int:
    part = Path(path).parent.name
    return int(part) if is_decimal(part) else 0


def _children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (a postmaster's backends and workers)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


@dataclass
class PostgresServer:
    """One running server (see the module docstring); `stop()` removes everything."""

    root: Path
    bins: Path
    user: str | None  # the unprivileged user it runs as, when started by root
    _databases: int = field(default=0)
    _watchdog: subprocess.Popen[bytes] | None = field(default=None)

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://aisched@/{database}?host={self.socket_dir}"

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        self._databases += 1
        name = f"{prefix}{os.getpid()}_{self._databases}"
        self.sql(f'CREATE DATABASE "{name}" TEMPLATE template0 STRATEGY FILE_COPY')
        return self.url(name)

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement through psql; returns its output (unaligned, tuples only)."""
        out = self._run(
            [
                str(self.bins / "psql"),
                "-h",
                str(self.socket_dir),
                "-U",
                "aisched",
                "-d",
                database,
                "-Atq",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                statement,
            ]
        )
        return out.strip()

    def pause(self) -> None:
        """Stop the server with SIGSTOP, the postmaster and every backend: it takes connections
        and requests (the kernel does) and answers none, as a server stuck in I/O or a frozen
        machine would. The postmaster first, so no backend is forked past the listing."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: int) -> None:
        """`sig` to the postmaster, then to each of its children; a backend that ended between
        the listing and its signal (a closed connection's) is no error."""
        postmaster = int((self.root / "data" / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, sig)
        for pid in _children(postmaster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
        self._run(self.stop_argv(), check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def stop_argv(self) -> list[str]:
        return _as_user(
            [str(self.bins / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop"],
            self.user,
        )

    def _run(self, argv: list[str], *, check: bool = True) -> str:
        return _run(argv, self.user, check=check)


def _as_user(argv: list[str], user: str | None) -> list[str]:
    if user is None:
        return argv
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]


def _run(argv: list[str], user: str | None, *, check: bool = True) -> str:
    argv = _as_user(argv, user)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    return done.stdout


def start(*, durable: bool = False, parent: str | None = None) -> PostgresServer:
    """initdb a new cluster in a temporary directory and start it (see the module docstring)."""
    bins = bin_dir()
    user = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresUnavailable("running as root needs the `postgres` user") from None
        user = "postgres"
    root = Path(tempfile.mkdtemp(prefix="aisched-pg-", dir=parent))
    (root / "sock").mkdir()
    if user is not None:
        info = pwd.getpwnam(user)
        for p in (root, root / "sock"):
            os.chown(p, info.pw_uid, info.pw_gid)
    os.chmod(root, 0o711)  # clients pass through to the socket; the data stays 0700
    os.chmod(root / "sock", 0o755)
    data = root / "data"
    _run(
        [
            str(bins / "initdb"),
            "-D",
            str(data),
            "-U",
            "aisched",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ],
        user,
    )
    opts = [
        "-c listen_addresses=''",
        f"-c unix_socket_directories={root / 'sock'}",
        "-c max_connections=400",
        "-c shared_buffers=64MB",
    ]
    if not durable:
        opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
    _run(
        [
            str(bins / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "server.log"),
            "-o",
            " ".join(opts),
            "-w",
            "start",
        ],
        user,
    )
    server = PostgresServer(root, bins, user)
    server._watchdog = _start_watchdog(server)
    return server


# Polls the owner every second (its pid and start time, so a reused pid is not taken for it);
# once it is gone, stops the server and removes its directory. Its own session, so a signal to
# the owner's process group does not take it too.
_WATCHDOG = """
import os, shutil, subprocess, sys, time
pid, start, root, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
def started(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
while started(pid) == start and os.path.isdir(root):
    time.sleep(1.0)
subprocess.run(stop, capture_output=True, check=False)
shutil.rmtree(root, ignore_errors=True)
"""


def _start_watchdog(server: PostgresServer) -> subprocess.Popen[bytes]:
    with open(f"/proc/{os.getpid()}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    return subprocess.Popen(
        [sys.executable, "-I", "-c", _WATCHDOG, str(os.getpid()), start, str(server.root)]
        + server.stop_argv(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

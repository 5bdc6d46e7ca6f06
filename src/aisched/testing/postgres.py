"""A real, throw-away PostgreSQL server for tests and benchmarks: `initdb` and `pg_ctl` of the
installed PostgreSQL (Debian's `postgresql` package) in a temporary directory.

The server listens on a Unix socket in that directory only (no TCP port), so it can reach
nothing and nothing can reach it from outside the machine. PostgreSQL refuses to run as root:
under root the directory is handed to the unprivileged `postgres` user and the server runs as
that user (`setpriv`); under any other user it runs as that user. Clients authenticate by
`trust` on the socket (the directory itself is the boundary: 0700, owned by the server's user,
the socket's directory opened to its clients).

`durable=False` (tests) turns fsync and synchronous commit off: a crash of the machine may
lose the last commits, which a throw-away server does not care about; benchmarks that compare
stores keep the defaults.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


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
    return int(part) if part.isdigit() else 0


@dataclass
class PostgresServer:
    """One running server (see the module docstring); `stop()` removes everything."""

    root: Path
    bins: Path
    user: str | None  # the unprivileged user it runs as, when started by root
    _databases: int = field(default=0)

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

    def stop(self) -> None:
        self._run(
            [str(self.bins / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop"],
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, argv: list[str], *, check: bool = True) -> str:
        return _run(argv, self.user, check=check)


def _run(argv: list[str], user: str | None, *, check: bool = True) -> str:
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *argv]
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
    return PostgresServer(root, bins, user)

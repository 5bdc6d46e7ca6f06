"""Real local users for the permission tests: made with `useradd` (as root), and the real
`aisched` command run as each of them through `setpriv` (uid, gid and groups dropped by the
kernel, as `su` would, without a password or a terminal).

The users' CLI runs this interpreter's version of Python from a path they can execute: this
one if they can, else the system's `/usr/bin/python3.X` (the same minor version, so the
checkout's installed packages load). When no such Python can reach the checkout's packages as
another user, the tests that need it are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import machine_lock

SRC = Path(__file__).resolve().parents[2] / "src"
GROUP = "aisteam"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path
    python: str

    def cmd(self, *argv: str, env: dict[str, str] | None = None) -> list[str]:
        """`argv` as this user, in a clean environment (plus `env`)."""
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PYTHONPATH": os.pathsep.join([str(SRC), *_site_dirs()]),
            **(env or {}),
        }
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in base.items()),
            *argv,
        ]

    def aisched(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(self.python, "-m", "aisched", *args, env=env),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=cwd or self.home,
        )

    def run_python(self, socket: Path, code: str) -> str:
        """`aisched run -- python -c CODE` as this user, through the service at `socket`;
        returns the new job's id."""
        proc = self.aisched(
            "run", "--json", "--", self.python, "-c", code, env={"AISCHED_SERVER": f"unix:{socket}"}
        )
        assert proc.returncode == 0, proc.stderr
        return str(json.loads(proc.stdout)["id"])


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def _ensure_user(name: str, groups: tuple[str, ...]) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
    for g in groups:
        subprocess.run(["usermod", "--append", "--groups", g, name], check=True)


def _python_for(user: User) -> str | None:
    """A Python of this version that `user` can run with the checkout's packages, or None."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}"):
        probe = [candidate, "-c", "import aisched.cli.main, httpx, rich, pydantic"]
        ok = subprocess.run(user.cmd(*probe), capture_output=True, timeout=60).returncode == 0
        if ok:
            return candidate
    return None


@pytest.fixture(scope="session")
def local_users() -> Iterator[dict[str, User]]:
    """alice (in group aisteam) and bob, as real accounts; skipped unless run as root."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("needs root, useradd and setpriv (util-linux) to make real local users")
    names = {"alice": "aisalice", "bob": "aisbob"}
    # Each pytest worker asks: one at a time, or both see a user missing and the second
    # useradd fails (or finds /etc/passwd locked by the first).
    with machine_lock("users"):
        subprocess.run(["groupadd", "--force", GROUP], check=True)
        _ensure_user(names["alice"], (GROUP,))
        _ensure_user(names["bob"], ())
    users: dict[str, User] = {}
    for key, name in names.items():
        pw = pwd.getpwnam(name)
        draft = User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), python="")
        python = _python_for(draft)
        if python is None:
            pytest.skip(
                f"no Python {sys.version_info.major}.{sys.version_info.minor} that user "
                f"{name} can run with this checkout's packages (is the checkout readable by "
                "other users?)"
            )
        users[key] = User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), python)
    yield users

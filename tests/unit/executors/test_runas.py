"""What a user could open, judged without opening it: a real directory tree (made as root, in
/tmp so that others may search its parents) seen by the real account `nobody`."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aisched.executors.runas import Lookup, user_can, user_lookup

USER = "nobody"


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        return None


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or _nobody() is None, reason="needs root and the account nobody"
)


@pytest.fixture
def top() -> Iterator[Path]:
    """A tree of root's, but for `home`, which is nobody's:

    closed/            0700, with inner/ (0755) holding secret.txt (0644)
    open/              0755, with readme (0644), tool (0755), sub/ (0755)
    own/               nobody's, 0077: its owner may not search it, everyone else may
    team/, other/      0750, of nobody's group and of root's; each holds f (0644)
    home/              nobody's links: into closed/, into open/, loops
    """
    pw = _nobody()
    assert pw is not None
    t = Path(tempfile.mkdtemp(dir="/tmp"))
    t.chmod(0o755)
    dirs = {"closed": 0o700, "closed/inner": 0o755, "open": 0o755, "open/sub": 0o755}
    dirs |= {"own": 0o077, "team": 0o750, "other": 0o750, "home": 0o755}
    for d, mode in dirs.items():
        (t / d).mkdir()
        (t / d).chmod(mode)
    for f, mode in {"closed/inner/secret.txt": 0o644, "open/readme": 0o644}.items():
        (t / f).write_text("x\n")
        (t / f).chmod(mode)
    (t / "open/tool").write_text("#!/bin/sh\n")
    (t / "open/tool").chmod(0o755)
    for d in ("own", "team", "other"):
        (t / d / "f").write_text("x\n")
        (t / d / "f").chmod(0o644)
    os.chown(t / "own", pw.pw_uid, pw.pw_gid)
    os.chown(t / "team", 0, pw.pw_gid)
    links = {
        "in": f"{t}/closed/inner",
        "in-rel": "../closed/inner",
        "gone": f"{t}/closed/none",
        "open": f"{t}/open",
        "sub": f"{t}/open/sub",
        "lost": f"{t}/open/none",
        "loop1": "loop2",
        "loop2": "loop1",
    }
    for name, target in links.items():
        (t / "home" / name).symlink_to(target)
    os.chown(t / "home", pw.pw_uid, pw.pw_gid)
    try:
        yield t
    finally:
        shutil.rmtree(t)


@dataclass(frozen=True)
class Case:
    name: str
    path: str  # under the tree
    want: int
    can: bool


CASES = [
    Case("a link into a directory the user may not search", "home/in", 0o5, False),
    Case("a file through that link", "home/in/secret.txt", 0o4, False),
    Case("a file through a relative link into it", "home/in-rel/secret.txt", 0o4, False),
    Case("the link's target itself", "closed/inner/secret.txt", 0o4, False),
    Case("a file through a link into an open directory", "home/open/readme", 0o4, True),
    Case("'..' after a link is the target's parent", "home/sub/../readme", 0o4, True),
    Case("'..' out of a directory needs its search", "closed/../open/readme", 0o4, False),
    Case("a file the user may not execute", "open/readme", 0o1, False),
    Case("a file the user may execute", "open/tool", 0o5, True),
    Case("a file with a slash after it", "open/readme/", 0o4, False),
    Case("a name under a file", "open/readme/x", 0o4, False),
    Case("the owner's bits, though others may more", "own/f", 0o4, False),
    Case("the group's bits for a member", "team/f", 0o4, True),
    Case("the others' bits for anyone else", "other/f", 0o4, False),
    Case("links that lead to each other", "home/loop1", 0o4, False),
    Case("a link to nothing", "home/lost", 0o4, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_user_can_what_the_kernel_would_let_it(top: Path, case: Case) -> None:
    assert user_can(USER, f"{top}/{case.path}", case.want) is case.can


def test_root_can_all_and_an_unknown_user_nothing(top: Path) -> None:
    assert user_can("root", str(top / "closed/inner/secret.txt"), 0o4) is True
    assert user_can("no-such-user-here", str(top / "open/readme"), 0o4) is False
    assert user_lookup("no-such-user-here", str(top / "open/readme")) == Lookup(None, True)


def test_behind_a_closed_directory_a_path_is_hidden_whether_or_not_it_is_there(
    top: Path,
) -> None:
    hidden = [user_lookup(USER, str(top / p)) for p in ("home/in", "home/gone", "closed/none")]
    assert hidden == [Lookup(None, hidden=True)] * 3
    # A name missing from a directory the user may search is plainly not there.
    assert user_lookup(USER, str(top / "home/lost")) == Lookup(None, hidden=False)
    found = user_lookup(USER, str(top / "home/open/readme")).found
    assert found is not None and os.path.samestat(found, os.stat(top / "open/readme"))


def test_a_path_is_hidden_when_its_links_lead_elsewhere_than_their_text(top: Path) -> None:
    # /proc/PID/cwd of a process whose directory was removed reads "DIR (deleted)" but leads
    # to the removed directory; a directory of that name elsewhere must not stand in for it.
    gone = top / "open/d"
    gone.mkdir()
    decoy = top / "open/d (deleted)"
    decoy.mkdir()
    decoy.chmod(0o755)
    child = subprocess.Popen(["sleep", "60"], cwd=gone)
    try:
        gone.rmdir()
        cwd = f"/proc/{child.pid}/cwd"
        assert os.readlink(cwd) == str(decoy)
        assert user_can(USER, str(decoy), 0o5) is True
        assert user_lookup(USER, cwd) == Lookup(None, hidden=True)
    finally:
        child.kill()
        child.wait()

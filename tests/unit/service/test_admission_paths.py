"""Paths a job names, checked at submission as the real account `nobody` sees them: a tree of
root's in /tmp (so that others may search its parents), with links in a directory of
nobody's into a directory nobody may not search."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from aisched.model.job import ContainerSpec, Job, TaskGroup, Volume
from aisched.model.resources import Resources
from aisched.service.admission import path_problems

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
    """closed/ (0700) holds inner/ (0755) with secret.txt (0644); open/ (0755) holds tool
    (0755), data/ (0755) and private/ (0711: nobody may enter it, not read it); home/ is
    nobody's, with `in` -> closed/inner and `gone` -> closed/none."""
    pw = _nobody()
    assert pw is not None
    t = Path(tempfile.mkdtemp(dir="/tmp"))
    t.chmod(0o755)
    for d, mode in {"closed": 0o700, "closed/inner": 0o755, "open": 0o755}.items():
        (t / d).mkdir()
        (t / d).chmod(mode)
    for d, mode in {"open/data": 0o755, "open/private": 0o711, "home": 0o755}.items():
        (t / d).mkdir()
        (t / d).chmod(mode)
    for f, mode in {"closed/inner/secret.txt": 0o644, "open/tool": 0o755}.items():
        (t / f).write_text("#!/bin/sh\n")
        (t / f).chmod(mode)
    (t / "home/in").symlink_to(t / "closed/inner")
    (t / "home/gone").symlink_to(t / "closed/none")
    os.chown(t / "home", pw.pw_uid, pw.pw_gid)
    try:
        yield t
    finally:
        shutil.rmtree(t)


def host(workdir: str | None = None, command: str = "true") -> Job:
    group = TaskGroup("main", 1, Resources(milli_cpu=1000), command=(command,), workdir=workdir)
    return Job("j1", (group,), user=USER)


def in_image(workdir: str | None = None, volume: str | None = None) -> Job:
    volumes = (Volume(volume, "/mnt"),) if volume else ()
    spec = ContainerSpec("img", volumes=volumes)
    group = TaskGroup("main", 1, Resources(milli_cpu=1000), ("true",), (), workdir, spec)
    return Job("j1", (group,), user=USER)


@dataclass(frozen=True)
class Case:
    name: str
    job: Job  # its paths are under the tree, written "T/..."
    want: list[str]  # likewise


CASES = [
    Case("a workdir through a link into a closed directory", host("T/home/in/."),
         ["s: workdir: no such directory: T/home/in"]),
    Case("a workdir through a link to nothing there", host("T/home/gone/."),
         ["s: workdir: no such directory: T/home/gone"]),
    Case("a workdir the user may search", host("T/open/data"), []),
    Case("a workdir the user sees but may not enter", host("T/closed"),
         ["s: workdir: a directory its user may not enter (no search permission): T/closed"]),
    Case("a file through a link into a closed directory", host(command="T/home/in/secret.txt"),
         ["s: command.0: no such file: T/home/in/secret.txt"]),
    Case("a file through a link to nothing there", host(command="T/home/gone/secret.txt"),
         ["s: command.0: no such file: T/home/gone/secret.txt"]),
    Case("a file the user may execute", host(command="T/open/tool"), []),
    Case("a directory as the program", host(command="T/open/data"),
         ["s: command.0: a directory, not a program: T/open/data"]),
    Case("a volume through a link into a closed directory", in_image(volume="T/home/in"),
         ["s: volumes.0.host_path: no such file or directory: T/home/in"]),
    Case("a container's workdir the user may read", in_image("T/open/data"), []),
    Case("a container's workdir the user may enter but not read", in_image("T/open/private"),
         [f"s: workdir: user {USER} may not read T/open/private, so its container may not "
          "mount it"]),
    Case("a container's workdir through a link into a closed directory", in_image("T/home/in"),
         [f"s: workdir: user {USER} may not read T/home/in, so its container may not mount "
          "it"]),
    Case("a container's workdir behind a closed directory, not there", in_image("T/closed/no"),
         [f"s: workdir: user {USER} may not read T/closed/no, so its container may not mount "
          "it"]),
    Case("a container's workdir the user sees is not here (the image's)",
         in_image("T/open/none"), []),
    # The engine drops `..` before it follows the link: it would mount T/closed/inner's
    # neighbour from the text, where the check follows the link first.
    Case("a container's workdir with '..' after a link", in_image("T/home/in/../../open/data"),
         ["s: workdir: 'T/home/in/../../open/data' holds '.' or '..': give the directory's "
          "own path"]),
]  # fmt: skip


def _under(job: Job, top: Path) -> Job:
    """`job` with "T/" at the start of its paths standing for the tree."""

    def put(p: str) -> str:
        return p.replace("T/", f"{top}/", 1)

    def group(g: TaskGroup) -> TaskGroup:
        spec = g.container
        if spec is not None:
            vols = tuple(replace(v, host_path=put(v.host_path)) for v in spec.volumes)
            spec = replace(spec, volumes=vols)
        workdir = put(g.workdir) if g.workdir else None
        return replace(g, command=tuple(map(put, g.command)), workdir=workdir, container=spec)

    return replace(job, groups=tuple(map(group, job.groups)))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_paths_are_checked_as_the_submitter_sees_them(top: Path, case: Case) -> None:
    want = [w.replace("T/", f"{top}/") for w in case.want]
    assert path_problems([_under(case.job, top)], "s", USER) == want


def test_root_and_unknown_names_are_answered_as_the_service_sees_the_files(top: Path) -> None:
    jobs = [_under(j, top) for j in (host("T/home/in"), in_image("T/closed/inner"))]
    for who in ("root", "no-such-user-here", None):
        assert path_problems(jobs, "s", who) == []

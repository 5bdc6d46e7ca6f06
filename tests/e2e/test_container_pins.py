"""Root's podman mounts a user's host paths as they were when the supervisor opened them
(`supervisor.Pins`), not as they are when the engine gets to them: a directory the user
swapped for a link after the check is refused, never mounted with root's rights.

Drives the supervisor's `Container` with a real rootful podman and the test image, as the
user nobody; the swap is made where it happens in a real launch: after the executor checked
and resolved the path, before the supervisor prepares the container."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from container_image import build_test_image, missing_tools

from aisched.executors import container as ctr
from aisched.executors.supervisor import PIN_ROOT, Container, ExecFailed
from aisched.model.job import ContainerSpec, Volume

pytestmark = pytest.mark.skipif(
    (why := missing_tools()) is not None or os.geteuid() != 0,
    reason=why or "the container tests run rootful podman (CI runs as root)",
)

NOBODY = {"name": "nobody", "uid": 65534, "gid": 65534, "groups": [65534], "home": "/"}


@dataclass
class Home:
    top: Path
    data: Path  # nobody's, holding "mine"
    secret: Path  # root's alone, holding "root-only"


@pytest.fixture
def home() -> Iterator[Home]:
    top = Path(tempfile.mkdtemp())
    top.chmod(0o755)
    (top / "engine").mkdir()
    data, secret = top / "data", top / "secret"
    data.mkdir()
    (data / "mine").write_text("hers\n")
    for p in (data, data / "mine"):
        os.chown(p, 65534, 65534)
    secret.mkdir(mode=0o700)
    (secret / "root-only").write_text("root's\n")
    yield Home(top, data, secret)
    shutil.rmtree(top)


def container(home: Home, script: str) -> Container:
    """The container of a task of nobody's that mounts `home.data` at /data, its command
    made (and its path checked and resolved) as the executor makes it at launch."""
    engine = ctr.detect_engine("podman")
    spec = ContainerSpec(build_test_image(), volumes=(Volume(str(home.data), "/data"),))
    t = ctr.ContainerTask(
        instance="pins", job_id=str(os.getpid()), attempt=0, task="main-0",
        command=("sh", "-c", script), env={}, workdir=None, cores=(), milli_cpu=0,
        mem_limit_mib=0, gpus=(), checkpoint_dir=None, env_file=str(home.top / "env"),
        user=NOBODY,
    )  # fmt: skip
    (home.top / "env").write_text(ctr.env_file_text(ctr.task_env(spec, t, engine)))
    name = ctr.container_name(t.instance, t.job_id, t.attempt, t.task)
    return Container(
        {"binary": engine.binary, "engine": engine.name, "name": name, "image": spec.image,
         "create": ctr.create_args(spec, t, engine), "start": ctr.start_args(engine, name),
         "engine_env": {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
         "cgroup_version": engine.cgroup_version, "owner": [65534, 65534],
         "owner_groups": [65534]},
        cwd=str(home.top / "engine"),
    )  # fmt: skip


def my_pins() -> list[str]:
    return [n for n in os.listdir(PIN_ROOT) if n.startswith(f"{os.getpid()}-")]


def test_a_directory_swapped_for_a_link_after_the_check_is_not_mounted(home: Home) -> None:
    c = container(home, "ls /data")
    home.data.rename(home.top / "moved")
    home.data.symlink_to(home.secret)
    os.lchown(home.data, 65534, 65534)
    try:
        with pytest.raises(ExecFailed) as err:
            c.prepare(print)
    finally:
        c.remove()
    assert err.value.message == (
        f"{home.data}: {home.data} is a symbolic link now, not what was checked: refused"
    )
    assert my_pins() == []


def test_the_container_keeps_what_was_pinned_and_the_pin_goes_at_its_start(home: Home) -> None:
    c = container(home, "ls /data; echo written > /data/out")
    try:
        launch = c.prepare(print)
        assert my_pins() == []  # the mount is the container's own once it is initialised
        home.data.rename(home.top / "moved")  # too late to change what it mounted
        home.data.symlink_to(home.secret)
        ran = subprocess.run(
            launch["command"], env=c.env, cwd=c.cwd, capture_output=True, text=True, timeout=60
        )
        code, _ = c.end(ran.returncode)
    finally:
        c.remove()
    assert (code, ran.stdout) == (0, "mine\n"), ran.stderr
    out = home.top / "moved" / "out"
    assert (out.read_text(), out.stat().st_uid) == ("written\n", 65534)
    assert sorted(os.listdir(home.secret)) == ["root-only"]

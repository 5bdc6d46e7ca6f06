"""Root's podman mounts a user's host paths as they were when the supervisor opened them
(`supervisor_pins.Pins`), not as they are when the engine gets to them: a directory the user
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
from aisched.executors.supervisor_container import Container
from aisched.executors.supervisor_pins import PIN_ROOT
from aisched.executors.task_files import ExecFailed
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


def image_with_link(at: str, to: str) -> str:
    """The test image with a symbolic link at `at` leading to `to` (as an image from a
    registry may have), made from a created container's root file system."""
    name = f"localhost/aisched-test-link:{build_test_image().rpartition(':')[2]}"
    if subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0:
        return name
    made = f"aisched-test-link-{os.getpid()}"
    subprocess.run(["podman", "create", "--name", made, build_test_image(), "true"], check=True,
                   capture_output=True)  # fmt: skip
    try:
        rootfs = subprocess.run(["podman", "mount", made], check=True, capture_output=True,
                                text=True).stdout.strip()  # fmt: skip
        os.symlink(to, os.path.join(rootfs, at.lstrip("/")))
        subprocess.run(["podman", "umount", made], check=True, capture_output=True)
        subprocess.run(["podman", "commit", "-q", made, name], check=True, capture_output=True)
    finally:
        subprocess.run(["podman", "rm", "-f", made], check=False, capture_output=True)
    return name


def container(
    home: Home,
    script: str,
    volumes: tuple[Volume, ...] = (),
    workdir: str | None = None,
    image: str | None = None,
) -> Container:
    """The container of a task of nobody's that mounts `home.data` at /data (or `volumes`),
    its command made (and its paths checked and resolved) as the executor makes it at
    launch."""
    engine = ctr.detect_engine("podman")
    given = ContainerSpec(
        image or build_test_image(), volumes=volumes or (Volume(str(home.data), "/data"),)
    )
    spec = ctr.resolve_volumes(given)
    assert ctr.mount_refusal("nobody", given, spec, workdir) is None
    t = ctr.ContainerTask(
        instance="pins", job_id=str(os.getpid()), attempt=0, task="main-0",
        command=("sh", "-c", script), env={}, workdir=workdir, cores=(), milli_cpu=0,
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
    # No PIN_ROOT at all on a machine where nothing was pinned yet (it is made by the first
    # pin): a refusal before any pin leaves none.
    names = os.listdir(PIN_ROOT) if os.path.isdir(PIN_ROOT) else []
    return [n for n in names if n.startswith(f"{os.getpid()}-")]


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
        code, _, _ = c.end(ran.returncode)
    finally:
        c.remove()
    assert (code, ran.stdout) == (0, "mine\n"), ran.stderr
    out = home.top / "moved" / "out"
    assert (out.read_text(), out.stat().st_uid) == ("written\n", 65534)
    assert sorted(os.listdir(home.secret)) == ["root-only"]


def test_a_link_where_a_nested_mount_goes_leads_the_engine_nowhere(home: Home) -> None:
    # /tmp-like: nobody may write it, not the directory of root's inside it.
    shared = home.top / "shared"
    (shared / "roots").mkdir(parents=True)
    shared.chmod(0o1777)
    inner = home.top / "inner"
    inner.mkdir()
    # Where the inner volume goes, inside her /data: a link, followed by the engine as root
    # inside the container (where it leads into /shared) to make the mount point there.
    (home.data / "sub").symlink_to("/shared/roots/made")
    os.lchown(home.data / "sub", 65534, 65534)
    volumes = (Volume(str(shared), "/shared"), Volume(str(home.data), "/data"),
               Volume(str(inner), "/data/sub"))  # fmt: skip
    c = container(home, "ls /data", volumes)
    try:
        with pytest.raises(ExecFailed) as err:
            c.prepare(print)
    finally:
        c.remove()
    sub = home.data / "sub"
    assert (
        err.value.message == f"{sub}: {sub} is a symbolic link now, not what was checked: refused"
    )
    assert (os.listdir(shared / "roots"), my_pins()) == ([], [])


def test_a_nested_mount_is_made_in_its_outer_pin_on_a_mount_point_the_user_made(home: Home) -> None:
    (home.top / "inner").mkdir()
    (home.top / "inner" / "f").write_text("root's\n")  # nobody may read, not write
    volumes = (Volume(str(home.data), "/data"), Volume(str(home.top / "inner"), "/data/a/b"))
    c = container(home, "cat /data/a/b/f; touch /data/a/b/x || echo read-only", volumes)
    try:
        launch = c.prepare(print)
        assert my_pins() == []
        ran = subprocess.run(
            launch["command"], env=c.env, cwd=c.cwd, capture_output=True, text=True, timeout=60
        )
        code, _, _ = c.end(ran.returncode)
    finally:
        c.remove()
    assert (code, ran.stdout) == (0, "root's\nread-only\n"), ran.stderr
    # The mount point was missing: made by her, not by the engine as root.
    made = [
        (p.stat().st_uid, p.stat().st_mode & 0o777) for p in (home.data / "a", home.data / "a/b")
    ]
    assert made == [(65534, 0o755), (65534, 0o755)]
    assert os.listdir(home.top / "inner") == ["f"]


def test_a_working_directory_missing_in_a_volume_is_made_by_the_user_not_through_a_link(
    home: Home,
) -> None:
    shared = home.top / "shared"  # /tmp-like, as above
    (shared / "roots").mkdir(parents=True)
    shared.chmod(0o1777)
    data = str(home.data)  # mounted where it is, so a working directory in it is in the volume
    volumes = (Volume(str(shared), "/shared"), Volume(data, data))
    # On the way to it: a link, which the runtime, making the directory as root inside the
    # container, would follow into /shared.
    (home.data / "via").symlink_to("/shared/roots")
    os.lchown(home.data / "via", 65534, 65534)
    c = container(home, "pwd", volumes, workdir=f"{data}/via/made")
    try:
        with pytest.raises(ExecFailed) as err:
            c.prepare(print)
    finally:
        c.remove()
    assert err.value.message.startswith(f"cannot make {data}/via/made to mount on: mkdir: ")
    assert (os.listdir(shared / "roots"), my_pins()) == ([], [])
    # Without the link it is hers, made before the container, and the task starts in it.
    (home.data / "via").unlink()
    c = container(home, "pwd", volumes, workdir=f"{data}/via/made")
    try:
        launch = c.prepare(print)
        ran = subprocess.run(
            launch["command"], env=c.env, cwd=c.cwd, capture_output=True, text=True, timeout=60
        )
        code, _, _ = c.end(ran.returncode)
    finally:
        c.remove()
    assert (code, ran.stdout) == (0, f"{data}/via/made\n"), ran.stderr
    assert (home.data / "via" / "made").stat().st_uid == 65534


def test_a_link_of_the_image_on_the_way_to_a_mount_point_is_refused(home: Home) -> None:
    shared = home.top / "shared"  # /tmp-like, as above
    (shared / "roots").mkdir(parents=True)
    shared.chmod(0o1777)
    # The image's /zz leads into /shared: root's engine would make /zz/data's mount point in
    # the directory of root's there.
    image = image_with_link("/zz", "/shared/roots")
    volumes = (Volume(str(shared), "/shared"), Volume(str(home.data), "/zz/data"))
    c = container(home, "true", volumes, image=image)
    try:
        with pytest.raises(ExecFailed) as err:
            c.prepare(print)
    finally:
        c.remove()
    assert err.value.message == (
        f"image {image}: /zz is a symbolic link on the way to /zz/data, which the engine would "
        "follow as root: refused"
    )
    assert (os.listdir(shared / "roots"), my_pins()) == ([], [])


def test_whether_a_nested_mount_point_exists_is_looked_up_by_the_user(home: Home) -> None:
    # Where a nested mount goes, inside her /data: a link she put there after the launch's
    # check, into a directory of root's she may not enter. Before, root looked for the mount
    # point through it: a name that exists there was refused in other words than one that
    # does not, which told her whether any path of root's existed.
    inner = home.top / "inner"
    inner.mkdir()
    messages = []
    for name in ("root-only", "absent"):
        volumes = (Volume(str(home.data), "/data"), Volume(str(inner), f"/data/via/{name}"))
        c = container(home, "true", volumes)
        (home.data / "via").symlink_to(home.secret)
        os.lchown(home.data / "via", 65534, 65534)
        try:
            with pytest.raises(ExecFailed) as err:
                c.prepare(print)
        finally:
            c.remove()
            (home.data / "via").unlink()
        messages.append(err.value.message.replace(name, "NAME"))
    assert messages[0] == messages[1], messages
    assert messages[0].startswith(f"cannot make {home.data}/via/NAME to mount on: mkdir: ")
    assert (sorted(os.listdir(home.secret)), my_pins()) == (["root-only"], [])

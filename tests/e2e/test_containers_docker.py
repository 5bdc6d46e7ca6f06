"""Container jobs through docker (`container_runtime: docker`), end to end: a real dockerd that
the test starts on a private socket and data root (no iptables, no bridge: nothing of the
machine's networking is touched), the test image imported into it, and a real `aisched up`
that reaches it through DOCKER_HOST.

Needs root and Debian's docker.io (dockerd, containerd, runc: `.ci/run` installs it); skipped
with the reason where it is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from container_image import MARKER, MARKER_TEXT, build_test_image, missing_tools
from harness import Service, local_service, wait_for

from aisched.executors.container import container_name
from aisched.executors.instance import instance_tag
from aisched.executors.supervisor_pins import PIN_ROOT


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "dockerd needs root (CI runs as root)"
    if (why := missing_tools()) is not None:
        return why
    for tool in ("dockerd", "docker", "containerd"):
        if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin") is None:
            return f"{tool} is not installed (Debian: docker.io; see .ci/run)"
    return None


pytestmark = [
    pytest.mark.skipif((why := _why_not()) is not None, reason=why or ""),
    # One pytest worker starts the module's dockerd, not each worker one of its own.
    pytest.mark.xdist_group("dockerd"),
]


@pytest.fixture(scope="module")
def dockerd() -> Iterator[str]:
    """DOCKER_HOST of a daemon of this module's own."""
    with own_dockerd() as host:
        yield host


@contextlib.contextmanager
def own_dockerd(*args: str) -> Iterator[str]:
    """A daemon started on a private socket and data root (`args`: more of its options)."""
    top = Path(tempfile.mkdtemp(prefix="ais-dk-"))
    host = f"unix://{top}/docker.sock"
    log = open(top / "dockerd.log", "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        ["dockerd", "-H", host, "--data-root", str(top / "data"), "--exec-root",
         str(top / "exec"), "--pidfile", str(top / "docker.pid"), "--iptables=false",
         "--ip6tables=false", "--ip-masq=false", "--bridge=none",
         "--containerd-namespace", "aisched-test", "--containerd-plugins-namespace",
         "aisched-test-plugins", *args],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"dockerd exited:\n{(top / 'dockerd.log').read_text()}")
        r = subprocess.run(["docker", "-H", host, "info"], capture_output=True, check=False)
        return r.returncode == 0

    try:
        wait_for("dockerd to answer", answers, 60)
        yield host
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        # dockerd mounts its data root and network namespaces there and may leave them.
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted((m for m in mounts if m.startswith(f"{top}/")), reverse=True):
            subprocess.run(["umount", "--lazy", m], check=False)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def image(dockerd: str) -> str:
    return build_test_image(engine=("docker", "-H", dockerd))


@pytest.fixture
def svc(tmp_path: Path, dockerd: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    monkeypatch.setenv("DOCKER_HOST", dockerd)  # the service's environment, and its engine's
    with local_service(tmp_path, "container_runtime: docker\n") as s:
        yield s


def docker_ps(dockerd: str, job_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", "-H", dockerd, "ps", "--all", "--filter", f"label=io.aisched.job={job_id}",
         "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()


def test_the_startup_lines_say_docker_and_a_task_sees_the_image_on_its_core(
    svc: Service, image: str, dockerd: str
) -> None:
    lines = [ln.strip() for ln in svc.log.read_text().splitlines()]
    engine = next(ln for ln in lines if ln.startswith("container engine: docker"))
    assert engine.endswith("OCI runtime runc; cgroup driver cgroupfs")
    script = f"cat {MARKER}; grep Cpus_allowed_list /proc/self/status | cut -f2; exit 3"
    jid = svc.run("--image", image, "--cpus", "1", "--restart", "never", "--", "sh", "-c", script)
    job = svc.wait_state(jid, "failed", timeout_s=60)
    assert [(t["exit_kind"], t["exit_code"]) for t in job["tasks"]] == [("exited", 3)]
    out = svc.cli("logs", jid).stdout.splitlines()
    assert out[0] == MARKER_TEXT.strip()
    assert len(out) == 2 and out[1].isdigit()  # one core: the one the scheduler chose
    assert docker_ps(dockerd, jid) == []  # removed once it ended


def test_a_64M_task_under_docker_is_reported_as_out_of_memory(svc: Service, image: str) -> None:
    jid = svc.run(
        "--image", image, "--mem", "64M", "--restart", "never", "--",
        "python3", "-c", "x = bytearray(512 << 20); print('still alive')",
    )  # fmt: skip
    job = svc.wait_state(jid, "failed", timeout_s=60)
    assert job["message"] == (
        "task main-0 killed: exceeded its memory limit of 64 MiB; restart policy is never"
    )
    assert [t["exit_kind"] for t in job["tasks"]] == ["oom"]


def test_a_missing_image_under_docker_fails_at_once_with_its_name(svc: Service) -> None:
    jid = svc.run("--image", "localhost/aisched-no-such-image:1", "--", "true")
    job = svc.wait_state(jid, "failed", timeout_s=60)
    assert (job["attempt"], job["failures"]) == (1, 1)
    assert job["message"].startswith(
        "task main-0 image localhost/aisched-no-such-image:1: not present on this node and "
        "could not be pulled ("
    )
    assert [(t["exit_kind"], t["exit_code"]) for t in job["tasks"]] == [("unrunnable", 125)]


def test_cancel_stops_a_docker_container(svc: Service, image: str, dockerd: str) -> None:
    jid = svc.run("--image", image, "--", "sleep", "600")
    svc.wait_state(jid, "running", timeout_s=60)
    wait_for("its container", lambda: docker_ps(dockerd, jid), 30)
    svc.cli("cancel", jid)
    job = svc.wait_state(jid, "cancelled", timeout_s=60)
    assert [t["exit_kind"] for t in job["tasks"]] == ["stopped"]
    assert docker_ps(dockerd, jid) == []


def test_a_users_docker_container_holds_its_pinned_volume_until_it_ends(
    tmp_path: Path, dockerd: str, image: str, monkeypatch: pytest.MonkeyPatch, local_users: Any
) -> None:
    # Docker makes its mounts when the container starts, so its pins (see supervisor_pins.Pins)
    # last until the task ends, and go then.
    bob = local_users["bob"]
    tmp_path.chmod(0o755)  # bob's CLI reaches the socket
    monkeypatch.setenv("DOCKER_HOST", dockerd)
    data = bob.home / "pinned"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    (data / "mine").write_text("bob's\n")
    for p in (data, data / "mine"):
        os.chown(p, bob.uid, bob.gid)
    job_file = bob.home / "pinned.yaml"
    job_file.write_text(
        f"image: {image}\nrestart: {{policy: never}}\nvolumes: [{{host_path: {data}, path: /d}}]\n"
        "command: 'ls /d; while [ ! -e /d/go ]; do sleep 0.1; done'\n"
    )
    with local_service(tmp_path, "container_runtime: docker\n") as svc:
        proc = bob.aisched("submit", "--json", str(job_file),
                           env={"AISCHED_SERVER": f"unix:{svc.socket}"})  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        jid = str(json.loads(proc.stdout)["id"])
        svc.wait_state(jid, "running", timeout_s=60)
        # Listed before it has run its `ls`: the file that ends it is made once it has.
        wait_for("its ls", lambda: svc.cli("logs", jid).stdout == "mine\n", 60)
        # Its container's own (another pytest worker's service may pin a job of this id).
        mine = container_name(instance_tag((svc.home / "tasks").resolve()), jid, 1, "main-0")
        held = [n for n in os.listdir(PIN_ROOT) if n.endswith(f"-{mine}")]
        # The volume, the working directory (his home, submitted from) and the checkpoint's.
        assert len(held) == 1 and sorted(os.listdir(os.path.join(PIN_ROOT, held[0]))) == [
            "0", "1", "2"
        ]  # fmt: skip
        (data / "go").touch()
        svc.wait_state(jid, "succeeded", timeout_s=60)
        assert svc.cli("logs", jid).stdout == "mine\n"
        assert not os.path.exists(os.path.join(PIN_ROOT, held[0]))


def test_a_users_read_only_docker_volume_keeps_what_is_nested_in_it_writable(
    tmp_path: Path, dockerd: str, image: str, monkeypatch: pytest.MonkeyPatch, local_users: Any
) -> None:
    # His checkpoint directory is nested in the read-only volume of his home, in its pin
    # (supervisor_pins.Pins.nest). Docker from 25 on makes all of a `:ro` mount read-only, what is
    # nested in it too, so the pin is made read-only itself and given to docker without `:ro`.
    bob = local_users["bob"]
    tmp_path.chmod(0o755)  # bob's CLI reaches the socket
    monkeypatch.setenv("DOCKER_HOST", dockerd)
    job_file = bob.home / "nested-ro.yaml"
    job_file.write_text(
        f"image: {image}\nrestart: {{policy: never}}\n"
        f"volumes: [{{host_path: {bob.home}, path: {bob.home}, read_only: true}}]\n"
        "command: 'touch $HOME/nested-ro-out 2>/dev/null || echo read-only; "
        "echo saved > $AISCHED_CHECKPOINT_DIR/state && echo saved'\n"
    )
    with local_service(tmp_path, "container_runtime: docker\n") as svc:
        proc = bob.aisched("submit", "--json", str(job_file), cwd=bob.home,
                           env={"AISCHED_SERVER": f"unix:{svc.socket}"})  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        jid = str(json.loads(proc.stdout)["id"])
        job = svc.wait_state(jid, "succeeded", timeout_s=60)
        assert svc.cli("logs", jid).stdout == "read-only\nsaved\n"
        state = Path(job["checkpoint_dir"]) / "state"
        assert (state.read_text(), state.stat().st_uid) == ("saved\n", bob.uid)
        assert not (bob.home / "nested-ro-out").exists()


def image_with_link(dockerd: str, image: str, at: str, to: str) -> str:
    """The test image with a symbolic link at `at` leading to `to` (as an image from a
    registry may have), in a layer of its own: a container's change, committed."""
    name = f"localhost/aisched-test-link:{image.rpartition(':')[2]}"
    docker = ["docker", "-H", dockerd]
    if subprocess.run([*docker, "image", "inspect", name], capture_output=True).returncode == 0:
        return name
    made = f"aisched-test-link-{os.getpid()}"
    try:
        ln = ["busybox", "ln", "-s", to, at]
        run = [*docker, "run", "--name", made, "--network", "none", image, *ln]
        subprocess.run(run, check=True, capture_output=True)
        subprocess.run([*docker, "commit", made, name], check=True, capture_output=True)
    finally:
        subprocess.run([*docker, "rm", "--force", made], check=False, capture_output=True)
    return name


@pytest.fixture(scope="module")
def vfs_dockerd() -> Iterator[str]:
    """DOCKER_HOST of a daemon of this module's own on the vfs storage driver: no overlay
    layers to read, so the supervisor reads the container's export instead."""
    with own_dockerd("--storage-driver", "vfs") as host:
        yield host


@pytest.mark.parametrize("driver", ["overlay2", "vfs"])
def test_a_link_of_the_image_on_the_way_to_a_users_docker_mount_point_is_refused(
    tmp_path: Path,
    driver: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    local_users: Any,
) -> None:
    # The image's /zz leads into /shared, a /tmp of everyone's with a directory of root's in
    # it: root's docker would make /zz/data's mount point in root's directory.
    dockerd = request.getfixturevalue("dockerd" if driver == "overlay2" else "vfs_dockerd")
    info = ["docker", "-H", dockerd, "info", "--format", "{{.Driver}}"]
    assert subprocess.run(info, capture_output=True, text=True).stdout.strip() == driver
    image = build_test_image(engine=("docker", "-H", dockerd))
    bob = local_users["bob"]
    tmp_path.chmod(0o755)  # bob's CLI reaches the socket
    monkeypatch.setenv("DOCKER_HOST", dockerd)
    shared = Path(tempfile.mkdtemp())
    (shared / "roots").mkdir()
    shared.chmod(0o1777)
    data = bob.home / "linked"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    os.chown(data, bob.uid, bob.gid)
    linked = image_with_link(dockerd, image, "/zz", "/shared/roots")
    job_file = bob.home / "linked.yaml"
    job_file.write_text(
        f"image: {linked}\nrestart: {{policy: never}}\ncommand: 'true'\n"
        f"volumes: [{{host_path: {shared}, path: /shared}}, "
        f"{{host_path: {data}, path: /zz/data}}]\n"
    )
    try:
        with local_service(tmp_path, "container_runtime: docker\n") as svc:
            proc = bob.aisched("submit", "--json", str(job_file),
                               env={"AISCHED_SERVER": f"unix:{svc.socket}"})  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            jid = str(json.loads(proc.stdout)["id"])
            job = svc.wait_state(jid, "failed", "succeeded", timeout_s=60)
            assert (job["state"], os.listdir(shared / "roots")) == ("failed", [])
            assert job["message"] == (
                f"task main-0 image {linked}: /zz is a symbolic link on the way to /zz/data, "
                "which the engine would follow as root: refused; restart policy is never"
            )
            assert docker_ps(dockerd, jid) == []
    finally:
        shutil.rmtree(shared)

"""The container command line, whole: what each task's `create` says, for CPUs, GPUs (CDI and
NVIDIA_VISIBLE_DEVICES, which no machine here can run), users, networks and mounts; and the
hostPath access check; and, through an engine that is a script, how the supervisor reads
docker's `export` (bounded: a hung engine fails the start). Nothing here starts a container
(tests/e2e/test_containers.py does)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from aisched.executors.container import (
    ContainerArgsError,
    ContainerTask,
    Engine,
    EngineError,
    create_args,
    detect_engine,
    engine_env,
    env_file_text,
    mount_refusal,
    nested_mount_refusal,
    start_args,
    task_env,
    unapplied_limits,
    user_may_read,
    workdir_refusal,
)
from aisched.model.job import ContainerSpec, NetworkMode, Volume

ENGINE = Engine(
    name="podman",
    binary="/usr/bin/podman",
    runtime="runc",
    ulimits=("nofile=20000:20000", "nproc=32768:32768"),
    cgroup_version="v1",
    bridge_gateway="10.88.0.1",
)
CONTRACT = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/root",
    "RANK": "0",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "CUDA_VISIBLE_DEVICES": "2,3",
}
NOBODY = {"name": "nobody", "uid": 65534, "gid": 65534, "groups": [65534, 100], "home": "/home/n"}


@pytest.fixture
def dirs() -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as ckpt:
        os.chmod(work, 0o777)  # a working directory the task's user may write
        yield work, ckpt


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory of root's that every user may enter (pytest's own are root's alone)."""
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        yield Path(top)


def task(
    work: str,
    ckpt: str,
    *,
    gpus: tuple[int, ...] = (2, 3),
    user: dict[str, object] | None = None,
) -> ContainerTask:
    return ContainerTask(
        instance="abc",
        job_id="7",
        attempt=2,
        task="worker-0",
        command=("python", "train.py"),
        env=CONTRACT,
        workdir=work,
        cores=(0, 1),
        milli_cpu=1500,
        mem_limit_mib=2048,
        gpus=gpus,
        checkpoint_dir=ckpt,
        env_file="/state/7/2/worker-0/container.env",
        user=user,
    )


def test_the_whole_create_command_of_a_bridged_gpu_task_run_as_a_user(
    dirs: tuple[str, str],
) -> None:
    work, ckpt = dirs
    spec = ContainerSpec(
        "nvcr.io/nvidia/pytorch:24.01-py3",
        network=NetworkMode.BRIDGE,
        bandwidth_bit_s=10**9,
        shm_mib=1024,
        volumes=(Volume("/datasets", "/data", read_only=True),),
    )
    cdi = _with(ENGINE, gpu_cdi=True)
    assert create_args(spec, task(work, ckpt, user=NOBODY), cdi) == [
        "/usr/bin/podman", "create", "--name", "aisched-abc-7.2.worker-0",
        "--label", "io.aisched.instance=abc", "--label", "io.aisched.job=7",
        "--label", "io.aisched.attempt=2", "--label", "io.aisched.task=worker-0",
        "--runtime", "runc",
        "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
        "--pull", "missing", "--log-driver", "none",
        "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--user", "65534:65534", "--group-add", "100",
        "--cpus", "1.5", "--cpuset-cpus", "0,1",
        "--memory", "2048m", "--memory-swap", "2048m",
        "--pids-limit", "4096", "--shm-size", "1024m",
        "--network", "bridge", "--publish", "29500:29500",
        "--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3",
        "--volume", "/datasets:/data:ro",
        "--volume", f"{work}:{work}", "--volume", f"{ckpt}:{ckpt}",
        "--workdir", work,
        "--env-file", "/state/7/2/worker-0/container.env",
        "--entrypoint", "", "nvcr.io/nvidia/pytorch:24.01-py3", "python", "train.py",
    ]  # fmt: skip


def test_a_bridged_task_alone_publishes_no_port(dirs: tuple[str, str]) -> None:
    """Rank 0 publishes MASTER_PORT for the others of its gang; a task alone published it too,
    on all the host's addresses, where anyone could reach it."""
    work, ckpt = dirs
    spec = ContainerSpec("a:1", network=NetworkMode.BRIDGE)
    alone = replace(task(work, ckpt), env={**CONTRACT, "WORLD_SIZE": "1"})
    published = [a for a in create_args(spec, alone, ENGINE) if a.startswith("--publish")]
    assert published == []
    gang = create_args(spec, task(work, ckpt), ENGINE)
    assert gang[gang.index("--publish") : gang.index("--publish") + 2] == [
        "--publish", "29500:29500"
    ]  # fmt: skip


def test_the_users_pids_cgroup_is_the_cgroup_parent_only_where_the_engine_takes_one(
    dirs: tuple[str, str],
) -> None:
    work, ckpt = dirs
    t = replace(task(work, ckpt), cgroup_parent="/aisched/user-1001.max-16384")
    cgroupfs = replace(ENGINE, cgroup_manager="cgroupfs")
    args = create_args(ContainerSpec("img"), t, cgroupfs)
    assert args[args.index("--cgroup-parent") + 1] == "/aisched/user-1001.max-16384"
    for engine in (
        replace(ENGINE, cgroup_manager="systemd"),  # takes slices, not paths
        replace(cgroupfs, rootless=True, cgroup_limits=False),  # no cgroup of its own at all
    ):
        assert "--cgroup-parent" not in create_args(ContainerSpec("img"), t, engine)


def test_rootless_on_cgroup_v1_passes_no_cgroup_limits_and_says_what_is_not_applied(
    dirs: tuple[str, str],
) -> None:
    work, ckpt = dirs
    rootless = replace(ENGINE, rootless=True, cgroup_limits=False, ulimits=())
    t = task(work, ckpt, gpus=())
    assert create_args(ContainerSpec("img"), t, rootless) == [
        "/usr/bin/podman", "create", "--name", "aisched-abc-7.2.worker-0",
        "--label", "io.aisched.instance=abc", "--label", "io.aisched.job=7",
        "--label", "io.aisched.attempt=2", "--label", "io.aisched.task=worker-0",
        "--runtime", "runc", "--pull", "missing", "--log-driver", "none",
        "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--shm-size", "64m", "--network", "host",
        "--volume", f"{work}:{work}", "--volume", f"{ckpt}:{ckpt}",
        "--workdir", work,
        "--env-file", "/state/7/2/worker-0/container.env",
        "--entrypoint", "", "img", "python", "train.py",
    ]  # fmt: skip
    assert unapplied_limits(t, rootless) == (
        "rootless podman on cgroup v1 cannot put this container in a cgroup of its own: "
        "applied instead: memory 2048 MiB per process (RLIMIT_DATA), not in total; cores 0,1 "
        "by CPU affinity; NOT applied: the CPU quota of 1.5 CPUs, the pids limit of 4096"
    )
    assert unapplied_limits(t, ENGINE) is None


def _with(engine: Engine, *, gpu_cdi: bool) -> Engine:
    return replace(engine, gpu_cdi=gpu_cdi)


def test_gpus_under_cdi_are_renumbered_from_0_inside(dirs: tuple[str, str]) -> None:
    env = task_env(ContainerSpec("img"), task(*dirs), _with(ENGINE, gpu_cdi=True))
    assert (env["CUDA_VISIBLE_DEVICES"], "NVIDIA_VISIBLE_DEVICES" in env) == ("0,1", False)


def test_gpus_without_cdi_go_through_nvidia_visible_devices(dirs: tuple[str, str]) -> None:
    spec = ContainerSpec("img")
    args = create_args(spec, task(*dirs), ENGINE)
    env = task_env(spec, task(*dirs), ENGINE)
    assert [a for a in args if a.startswith("nvidia.com/gpu")] == []
    assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"]) == ("0,1", "2,3")


def test_a_task_without_gpus_sees_none(dirs: tuple[str, str]) -> None:
    env = task_env(ContainerSpec("img"), task(*dirs, gpus=()), ENGINE)
    assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"]) == ("", "void")


def test_the_master_is_reached_through_the_bridge_gateway_and_host_network_is_left_alone(
    dirs: tuple[str, str],
) -> None:
    bridged = task_env(ContainerSpec("img", network=NetworkMode.BRIDGE), task(*dirs), ENGINE)
    host = task_env(ContainerSpec("img"), task(*dirs), ENGINE)
    assert (bridged["MASTER_ADDR"], host["MASTER_ADDR"]) == ("10.88.0.1", "127.0.0.1")


def test_a_user_gets_its_own_home_and_names(dirs: tuple[str, str]) -> None:
    env = task_env(ContainerSpec("img"), task(*dirs, user=NOBODY), ENGINE)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/home/n", "nobody", "nobody")


def test_the_env_file_holds_a_variable_a_line_and_refuses_a_line_break() -> None:
    # The job spec refuses a line break in a container's variable; one stored before it did
    # must not be cut short (nor put on a command line every local user may read).
    assert env_file_text({"A": "1", "C": ""}) == "A=1\nC=\n"
    with pytest.raises(ContainerArgsError) as err:
        env_file_text({"A": "1", "B": "two\nlines"})
    assert str(err.value) == "env B: holds a line break, which the engine's env file cannot carry"


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("volume", "volumes.0: cannot mount '/d:U': it holds a ':', which the container engine "
                   "would read as mount options"),
        ("host", "volumes.0: cannot mount '{top}/a,U': it holds a ',', which the container "
                 "engine would read as mount options"),
        ("workdir", "workdir: cannot mount '{top}/w:U': it holds a ':', which the container "
                    "engine would read as mount options"),
        ("checkpoint", "checkpoint directory: cannot mount '{top}/c:U': it holds a ':', which "
                       "the container engine would read as mount options"),
    ],
)  # fmt: skip
def test_a_mount_path_holding_mount_options_is_refused(
    tmp_path: Path, where: str, why: str
) -> None:
    # The spec refuses these in volumes; the command line refuses them whatever it is given.
    top = tmp_path
    for d in ("a,U", "w:U", "c:U", "w", "c"):
        (top / d).mkdir()
    volume = {"volume": Volume(str(top), "/d:U"), "host": Volume(f"{top}/a,U", "/a")}
    spec = ContainerSpec("img", volumes=(volume[where],) if where in volume else ())
    t = replace(
        task(f"{top}/w", f"{top}/c"),
        workdir=f"{top}/w:U" if where == "workdir" else f"{top}/w",
        checkpoint_dir=f"{top}/c:U" if where == "checkpoint" else f"{top}/c",
    )
    with pytest.raises(ContainerArgsError) as err:
        create_args(spec, t, ENGINE)
    assert str(err.value) == why.format(top=top)


def test_an_image_behind_a_transport_is_never_created(dirs: tuple[str, str]) -> None:
    with pytest.raises(ContainerArgsError) as err:
        create_args(ContainerSpec("oci-archive:/root-only/img.tar"), task(*dirs), ENGINE)
    assert str(err.value) == (
        "image oci-archive:/root-only/img.tar: names the image transport 'oci-archive': only a "
        "registry reference may be run"
    )


def test_a_volume_is_mounted_where_its_link_leads_when_the_command_is_made(
    dirs: tuple[str, str], tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    spec = ContainerSpec("img", volumes=(Volume(f"{tmp_path}/link", "/data", read_only=True),))
    args = create_args(spec, task(*dirs), ENGINE)
    assert args[args.index("--volume") + 1] == f"{tmp_path}/data:/data:ro"


def test_a_workdir_is_mounted_where_it_leads_and_never_through_dot_dot(
    dirs: tuple[str, str], tmp_path: Path
) -> None:
    # The engine drops `..` from the text before following links, where the user's check
    # follows the link first: `~/link/../x` was checked in one place and mounted from another.
    (tmp_path / "real" / "w").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    work = f"{tmp_path}/link/w"
    args = create_args(ContainerSpec("img"), task(work, dirs[1]), ENGINE)
    assert f"{tmp_path}/real/w:{work}" in args
    sideways = f"{tmp_path}/link/../real/w"
    with pytest.raises(ContainerArgsError) as err:
        create_args(ContainerSpec("img"), task(sideways, dirs[1]), ENGINE)
    assert (
        str(err.value) == f"workdir: {sideways!r} holds '.' or '..': give the directory's own path"
    )
    assert (
        workdir_refusal("nobody", sideways)
        == f"workdir: {sideways!r} holds '.' or '..': give the directory's own path"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user needs root")
def test_a_checkpoint_directory_is_mounted_from_where_it_resolved_when_checked(
    reachable: Path,
) -> None:
    # A link on its way (~/.aisched, the user's) may be changed between the check and the
    # mount: the mount does not go through it. (Looked up by the user: where it may search.)
    from aisched.executors.supervisor_container import Container

    tmp_path = reachable
    nobody = (65534, 65534)
    (tmp_path / "real" / "ck").mkdir(parents=True)
    os.chown(tmp_path / "real" / "ck", *nobody)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    path = f"{tmp_path}/link/ck"
    c = Container(
        {"binary": "podman", "name": "n", "make_dirs": [path], "owner": list(nobody),
         "create": ["podman", "create", "--volume", f"{path}:{path}", "img"]}
    )  # fmt: skip
    c.mount_resolved(c.make_dirs())
    assert c.spec["create"] == ["podman", "create", "--volume", f"{tmp_path}/real/ck:{path}", "img"]


def test_start_attaches_without_proxying_signals() -> None:
    assert start_args(ENGINE, "n") == [
        "/usr/bin/podman",
        "start",
        "--attach",
        "--sig-proxy=false",
        "n",
    ]


def test_a_user_may_mount_only_what_it_could_read() -> None:
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        open_dir, closed_dir = Path(top) / "open", Path(top) / "closed"
        open_dir.mkdir(mode=0o755)
        closed_dir.mkdir(mode=0o700)
        inside = closed_dir / "inside"
        inside.mkdir(mode=0o755)
        assert [
            user_may_read("nobody", str(p)) for p in (open_dir, closed_dir, inside, "/no/such")
        ] == [True, False, False, False]
        assert user_may_read("root", str(closed_dir)) is True
        assert user_may_read("no-such-user-here", str(open_dir)) is False


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user needs root")
def test_a_mount_inside_another_may_not_make_root_create_where_the_user_cannot() -> None:
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)  # reachable by nobody, as the user's own paths would be
        rootonly, mine = Path(top) / "rootonly", Path(top) / "mine"
        rootonly.mkdir(mode=0o755)
        (rootonly / "there").mkdir()
        mine.mkdir()
        os.chown(mine, 65534, 65534)
        outer = ("volumes.0", str(rootonly), "/r")

        def why(inner_path: str) -> str | None:
            return nested_mount_refusal("nobody", [outer, ("volumes.1", str(mine), inner_path)])

        assert why("/r/planted/deeper") == (
            f"volumes.1: /r/planted/deeper is inside volumes.0 (/r from {rootonly}), so the "
            f"engine would create {rootonly}/planted/deeper as root, and user nobody may not "
            f"write {rootonly}: mount it elsewhere, or make {rootonly}/planted/deeper first"
        )
        # A mount point there already is used as it is; beside, not inside, is no nesting.
        assert [why(p) for p in ("/r/there", "/r", "/rr", "/elsewhere")] == [None] * 4
        # Inside a directory the user may write, the engine makes only what the user could.
        inside_mine = [("volumes.0", str(mine), "/m"), ("workdir", "/w", "/m/a/b")]
        assert nested_mount_refusal("nobody", inside_mine) is None
        assert nested_mount_refusal("root", [outer, ("volumes.1", str(mine), "/r/x")]) is None


def test_a_host_path_the_user_may_not_write_is_mounted_read_only(dirs: tuple[str, str]) -> None:
    # The task could not write there; mounted read-only, root's engine cannot make a nested
    # mount point there either, whatever link (in the image, in another mount) leads to it.
    work, ckpt = dirs
    os.chmod(work, 0o755)
    spec = ContainerSpec("img", volumes=(Volume("/usr", "/u"), Volume(work, "/w")))
    args = create_args(spec, task(work, ckpt, user=NOBODY), ENGINE)
    mounts = [args[i + 1] for i, a in enumerate(args) if a == "--volume"]
    assert mounts[:3] == ["/usr:/u:ro", f"{work}:/w:ro", f"{work}:{work}:ro"]
    assert create_args(spec, task(work, ckpt), ENGINE).count("/usr:/u") == 1  # no user: as given


def test_the_checkpoint_directory_is_mounted_before_it_exists(dirs: tuple[str, str]) -> None:
    work, ckpt = dirs
    later = os.path.join(ckpt, "not-yet")
    args = create_args(
        ContainerSpec("img"), replace(task(work, ckpt), checkpoint_dir=later), ENGINE
    )
    assert args[args.index(f"{later}:{later}") - 1] == "--volume"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_a_users_container_gets_its_checkpoint_directory_made_by_the_user() -> None:
    from aisched.executors.supervisor_container import Container
    from aisched.executors.task_files import ExecFailed

    nobody = (65534, 65534)
    top = Path(tempfile.mkdtemp())  # root's; the user may pass through it, not write in it
    try:
        top.chmod(0o755)
        home = top / "home"
        home.mkdir()
        os.chown(home, *nobody)
        made, kept = home / ".aisched" / "checkpoints" / "job-1", top / "kept"
        kept.mkdir(mode=0o750)
        os.chown(kept, *nobody)
        c = Container(
            {"binary": "podman", "name": "n", "make_dirs": [str(made), str(kept)],
             "owner": list(nobody)}
        )  # fmt: skip
        c.make_dirs()
        # Every directory it made is the user's (the missing parents too), the leaf private.
        for d in (made, made.parent, made.parent.parent):
            st = d.stat()
            assert (st.st_uid, st.st_gid) == nobody, d
        assert made.stat().st_mode & 0o777 == 0o700
        assert made.parent.stat().st_mode & 0o777 == 0o755
        assert kept.stat().st_mode & 0o777 == 0o750  # one of the user's that exists is left
        # Where the user may not write, nothing is made with root's rights: a one-line reason.
        denied = top / "not-yours" / "job-2"
        with pytest.raises(ExecFailed) as err:
            Container(
                {"binary": "podman", "name": "n", "make_dirs": [str(denied)],
                 "owner": list(nobody)}
            ).make_dirs()  # fmt: skip
        assert str(err.value).startswith(f"cannot make {denied}: mkdir: ")
        assert "Permission denied" in str(err.value)
        assert not denied.parent.exists()
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory of another user needs root")
def test_a_checkpoint_directory_that_is_a_link_or_anothers_is_refused(reachable: Path) -> None:
    # The engine mounts it read-write as root: a link the user placed would hand the task
    # whatever it leads to (a directory the user may not read).
    from aisched.executors.supervisor_container import Container
    from aisched.executors.task_files import ExecFailed

    tmp_path = reachable
    nobody = (65534, 65534)
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(secret)
    os.lchown(tmp_path / "link", *nobody)  # the user's own link
    (tmp_path / "file").touch()
    os.chown(tmp_path / "file", *nobody)
    refused = []
    for name, owner in (("link", nobody), ("secret", nobody), ("file", nobody), ("link", None)):
        with pytest.raises(ExecFailed) as err:
            Container(
                {"binary": "podman", "name": "n", "make_dirs": [str(tmp_path / name)],
                 "owner": list(owner) if owner else None}
            ).make_dirs()  # fmt: skip
        refused.append((err.value.code, err.value.message))
    link = f"checkpoint directory {tmp_path}/link"
    assert refused == [
        (126, f"{link} is a symbolic link, which the engine would follow with root's rights: "
              "refused; remove it"),
        (126, f"checkpoint directory {secret} belongs to uid 0, not to the task's user "
              "(uid 65534): refused; remove it"),
        (126, f"checkpoint directory {tmp_path}/file is not a directory: refused; remove it"),
        (126, f"{link} is a symbolic link, which the engine would follow with root's rights: "
              "refused; remove it"),
    ]  # fmt: skip


def _docker_daemon() -> bool:
    return os.path.exists("/var/run/docker.sock")


@pytest.mark.skipif(_docker_daemon(), reason="a docker daemon runs here")
def test_an_engine_that_cannot_run_containers_is_a_one_line_reason() -> None:
    with pytest.raises(EngineError) as err:
        detect_engine("docker")
    if shutil.which("docker") is None:
        assert str(err.value) == (
            "no container engine: docker is not installed (e.g. apt-get install podman runc)"
        )
    else:  # the client without its daemon (as on the development machine)
        assert str(err.value) == (
            "docker does not work here: Cannot connect to the Docker daemon at "
            "unix:///var/run/docker.sock. Is the docker daemon running?"
        )


def test_container_tasks_can_be_switched_off() -> None:
    with pytest.raises(EngineError) as err:
        detect_engine("none")
    assert str(err.value) == "container tasks are off on this node (container_runtime: none)"


def _docker_on_vfs(tmp_path: Path, export: str) -> dict[str, object]:
    """The spec of a docker container whose engine is a script: its storage driver is vfs (no
    overlay layers: the image's links are read from its `export`), `export` runs the shell
    line `export`, and every command it is given is recorded in `calls`."""
    engine = tmp_path / "docker"
    engine.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        'case "$1" in\n'
        """  container) echo '{"Name": "vfs", "Data": {}}' ;;\n"""
        f"  export) {export} ;;\n"
        "esac\n"
    )
    engine.chmod(0o755)
    return {"binary": str(engine), "name": "n", "engine": "docker", "image": "img",
            "engine_env": {"PATH": os.environ["PATH"]},
            "create": ["docker", "create", "--volume", f"{tmp_path}:/data/w", "img"]}  # fmt: skip


def test_an_export_that_never_ends_fails_the_start_and_is_killed(tmp_path: Path) -> None:
    # A hung engine: the export starts and never writes a byte nor ends.
    from aisched.executors.supervisor_container import Container
    from aisched.executors.task_files import ExecFailed

    spec = _docker_on_vfs(tmp_path, f"echo $$ > {tmp_path}/export.pid; exec sleep 3600")
    with pytest.raises(ExecFailed) as err:
        Container(spec, str(tmp_path), export_timeout_s=0.5).refuse_image_links()
    assert (err.value.code, err.value.message) == (
        125,
        f"container n could not be read: `{tmp_path}/docker export` did not end within 0.5 s "
        "(is the engine hung?): killed",
    )
    export_pid = int((tmp_path / "export.pid").read_text())
    assert not Path(f"/proc/{export_pid}").exists()  # killed and reaped, not left behind
    assert (tmp_path / "calls").read_text().splitlines() == [
        "container inspect --format {{json .GraphDriver}} n",
        "export n",
        "rm --force n",  # the container it could not judge is removed
    ]


def test_an_export_that_warns_more_than_a_pipe_holds_is_read_whole(tmp_path: Path) -> None:
    # 200 KB of warnings before the archive: before, they filled a pipe read only after the
    # archive, the engine blocked on it, and the start failed as if the engine were hung.
    import tarfile

    from aisched.executors.supervisor_container import Container
    from aisched.executors.task_files import ExecFailed

    with tarfile.open(tmp_path / "rootfs.tar", "w") as tar:
        entry = tarfile.TarInfo("data")
        entry.type, entry.linkname = tarfile.SYMTYPE, "/elsewhere"
        tar.addfile(entry)
    warn = "head -c 200000 /dev/zero | tr '\\0' w >&2; echo >&2; echo 'last warning' >&2"
    spec = _docker_on_vfs(tmp_path, f"{warn}; cat {tmp_path}/rootfs.tar")
    with pytest.raises(ExecFailed) as err:
        Container(spec, str(tmp_path), export_timeout_s=20).refuse_image_links()
    assert err.value.message.startswith("image img: /data is a symbolic link on the way")
    # An export that fails is still told by its last line of errors, however many came first
    # (before, a failed export was told only by what it left of the archive: `empty file`).
    spec = _docker_on_vfs(tmp_path, f"{warn}; exit 1")
    with pytest.raises(ExecFailed) as err:
        Container(spec, str(tmp_path), export_timeout_s=20).refuse_image_links()
    assert err.value.message == "container n could not be read: empty file (last warning)"


def test_an_export_is_read_whole_within_its_bound(tmp_path: Path) -> None:
    # The image's /data is a link: the mount at /data/w would be made where it leads.
    import tarfile

    from aisched.executors.supervisor_container import Container
    from aisched.executors.task_files import ExecFailed

    with tarfile.open(tmp_path / "rootfs.tar", "w") as tar:
        for name, kind in (("etc", tarfile.DIRTYPE), ("data", tarfile.SYMTYPE)):
            entry = tarfile.TarInfo(name)
            entry.type, entry.linkname = kind, "/elsewhere" if kind == tarfile.SYMTYPE else ""
            tar.addfile(entry)
    spec = _docker_on_vfs(tmp_path, f"cat {tmp_path}/rootfs.tar")
    with pytest.raises(ExecFailed) as err:
        Container(spec, str(tmp_path), export_timeout_s=60).refuse_image_links()
    assert (err.value.code, err.value.message) == (
        126,
        "image img: /data is a symbolic link on the way to /data/w, which the engine would "
        "follow as root: refused",
    )


def test_the_engine_gets_the_registry_settings_and_not_the_services_secrets() -> None:
    """The engine's environment, the same for the local executor and a Ray node's agent: the
    operator's registries and credentials pass, the system's tools are on its PATH, and the
    rest of the service's environment (a token, say) does not reach the engine."""
    env = engine_env(
        {
            "PATH": "/opt/tools",
            "HOME": "/root",
            "CONTAINERS_REGISTRIES_CONF": "/etc/ours/registries.conf",
            "REGISTRY_AUTH_FILE": "/etc/ours/auth.json",
            "AISCHED_TOKEN": "secret",
        }
    )
    assert env == {
        "PATH": "/opt/tools:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "CONTAINERS_REGISTRIES_CONF": "/etc/ours/registries.conf",
        "REGISTRY_AUTH_FILE": "/etc/ours/auth.json",
    }
    assert engine_env({})["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_a_pods_working_dir_is_a_path_in_its_image_never_a_host_directory_mounted_there(
    dirs: tuple[str, str],
) -> None:
    """A Volcano task's workingDir that was a directory on the host (/etc) had the host's
    directory mounted over the image's; it is only the container's --workdir now."""
    _, ckpt = dirs
    pod = ContainerSpec("img", workdir_in_image=True)
    args = create_args(pod, task("/etc", ckpt), ENGINE)
    volumes = [args[i + 1] for i, a in enumerate(args) if a == "--volume"]
    assert (volumes, args[args.index("--workdir") + 1]) == ([f"{ckpt}:{ckpt}"], "/etc")
    with tempfile.TemporaryDirectory() as private:  # 0700: nobody may not read it
        assert mount_refusal("nobody", pod, pod, private) is None  # nothing of the host's
        host = ContainerSpec("img")
        assert mount_refusal("nobody", host, host, private) == (
            f"workdir: user nobody may not read {private}, so its container may not mount it"
        )

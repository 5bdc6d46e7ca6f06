"""Tasks in OCI images: the engine (podman or docker) found and probed once, and the
`create` command line of each task's container.

`detect_engine` picks the engine (`container_runtime`: auto | podman | docker) and, for podman,
the OCI runtime and the ulimits it can really apply, by creating throw-away containers from an
empty root filesystem (nothing is pulled: the probe's command is missing on purpose, so "not
found" means every setting before the exec was accepted). What was chosen, and why, is in
`Engine.notes`, which the service prints at start and `aisched nodes` shows. On a host where
crun refuses the cgroup layout or where the default open-files limit cannot be raised (no
CAP_SYS_RESOURCE), the probe moves on to runc and to explicit `--ulimit` values.

Rootless podman (a service run by an ordinary user) is detected and said: its cgroup manager,
network backend and rootless network helper (slirp4netns, pasta). On cgroup v1 without a
delegated hierarchy such an engine cannot apply cgroup limits at all (podman drops them with a
warning), so `Engine.cgroup_limits` is False and the supervisor applies what still holds
instead: the memory limit as a per-process data-segment rlimit (the host tasks' own
fallback), set on the container's process between `init` and `start` (a `--ulimit data=`
would hold the OCI runtime's own start-up to it, which fails), and the cores by CPU affinity,
set on the engine's `init` and inherited by the container. `unapplied_limits` is the line
that says what is left unenforced (the CPU quota, pids); the task's log carries it.

`create_args` is the whole `create` command of one task: its name and labels (so that a
restarted scheduler can find, adopt and remove it), its limits (cpuset and quota, memory, pids,
/dev/shm), its network, its GPUs, its mounts (the working and checkpoint directories at the
same paths, hostPath volumes), the user it runs as, and the hardening every untrusted image
gets (`--cap-drop all`, `no-new-privileges`). The supervisor runs it and then `start --attach`
(see `supervisor_container.py`); nothing here starts a container.

Never stores registry credentials: an image that needs them must be pulled beforehand by the
node's operator (`podman login` belongs to the engine's own configuration).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aisched.executors.runas import user_can
from aisched.model.job import ContainerSpec, NetworkMode, image_transport, mount_option_char
from aisched.model.numerals import is_decimal

ENGINES = ("podman", "docker")
OCI_RUNTIMES = ("crun", "runc")
PULL_POLICIES = ("missing", "never", "always")
LABEL = "io.aisched"
# Processes one container may hold, unless the service is configured otherwise.
DEFAULT_PIDS_LIMIT = 4096
# Docker and podman both give a container 64 MiB of /dev/shm by default.
DEFAULT_SHM_MIB = 64
PROBE_TIMEOUT_S = 30.0
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_PROBE_COMMAND = "/aisched-probe-not-here"
# Where the engine's helpers (conmon, the OCI runtime, netavark) and the node's tools (nsenter,
# tc) are found, whatever PATH the service or the Ray worker was started with.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the engine's command line needs from the environment that starts it: rootless podman
# finds its storage through HOME and XDG_RUNTIME_DIR, and an operator may name its registries
# and their credentials. The task's own environment is separate (`task_env`).
ENGINE_ENV_NAMES = (
    "PATH",
    "HOME",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",  # where short names are looked for
    "REGISTRY_AUTH_FILE",  # the credentials of private registries
    "DOCKER_HOST",
    "DOCKER_CONFIG",
)


class EngineError(RuntimeError):
    """No usable container engine; the message says what is missing and how to get it."""


class ContainersOff(EngineError):
    """The node's configuration turns container tasks off: no probe will find an engine."""


class ContainerArgsError(ValueError):
    """A task whose container cannot be created safely; the message says what and where."""


@dataclass(frozen=True, slots=True)
class Engine:
    """A probed container engine. `runtime` None: the engine's default; `ulimits` are passed
    to every container (`nofile=S:H` ...); `gpu_cdi` whether NVIDIA GPUs are named through a
    CDI spec (`nvidia.com/gpu=IDX`) rather than `NVIDIA_VISIBLE_DEVICES`."""

    name: str
    binary: str
    runtime: str | None = None
    ulimits: tuple[str, ...] = ()
    cgroup_version: str = "v2"
    rootless: bool = False
    gpu_cdi: bool = False
    pull: str = "missing"
    pids_limit: int = DEFAULT_PIDS_LIMIT
    bridge_gateway: str | None = None
    # Whether the engine can put its containers in cgroups of their own with limits (not:
    # rootless on cgroup v1, which has no delegation).
    cgroup_limits: bool = True
    # How the engine makes its containers' cgroups: "cgroupfs" (paths in the hierarchies,
    # which `--cgroup-parent` names) or "systemd" (slices); "" when it did not say.
    cgroup_manager: str = ""
    notes: tuple[str, ...] = ()

    @property
    def takes_cgroup_parent(self) -> bool:
        """Whether a container may be placed under a cgroup path of ours (`--cgroup-parent`):
        a rootful engine with the cgroupfs manager."""
        return self.cgroup_limits and not self.rootless and self.cgroup_manager == "cgroupfs"


Runner = Any  # subprocess.run's signature; a parameter so detection can be driven by a test


def _run(
    argv: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """The engine's answer; one that cannot be started or does not answer in time reads as a
    failure (exit 125) with the reason as its stderr, so no caller dies of a stuck engine."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"no answer in {timeout_s:g}s" if isinstance(e, subprocess.TimeoutExpired) else e
        return subprocess.CompletedProcess(list(argv), 125, "", f"{argv[0]}: {why}")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _own_ulimits() -> tuple[str, ...]:
    """The open-files and processes limits this process has: a container may have up to them
    without CAP_SYS_RESOURCE (the engines' defaults ask for more, which fails without it).
    Processes are capped at the kernel's pid_max, as podman caps its own limit."""
    pid_max = 1 << 22
    with contextlib.suppress(OSError, ValueError), open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    out = []
    for name, which, cap in (
        ("nofile", resource.RLIMIT_NOFILE, 1 << 20),
        ("nproc", resource.RLIMIT_NPROC, pid_max),
    ):
        _, hard = resource.getrlimit(which)
        n = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        out.append(f"{name}={n}:{n}")
    return tuple(out)


def _cdi_has_nvidia() -> bool:
    for d in CDI_DIRS:
        with contextlib.suppress(OSError):
            for name in os.listdir(d):
                if not name.endswith((".yaml", ".yml", ".json")):
                    continue
                with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
                    if "nvidia.com/gpu" in f.read():
                        return True
    return False


def detect_engine(
    wanted: str = "auto",
    oci_runtime: str = "auto",
    *,
    pull: str = "missing",
    pids_limit: int = DEFAULT_PIDS_LIMIT,
) -> Engine:
    """The engine to run container tasks with (see the module docstring). Raises EngineError
    when the one asked for (or, for auto, any) is missing or cannot start a container."""
    if wanted == "none":
        raise ContainersOff("container tasks are off on this node (container_runtime: none)")
    if wanted not in ("auto", *ENGINES):
        raise EngineError(f"container_runtime: {wanted!r} is not one of auto, podman, docker")
    if pull not in PULL_POLICIES:
        raise EngineError(f"image_pull: {pull!r} is not one of {', '.join(PULL_POLICIES)}")
    names = ENGINES if wanted == "auto" else (wanted,)
    found = [(n, p) for n in names if (p := shutil.which(n)) is not None]
    if not found:
        raise EngineError(
            f"no container engine: {' or '.join(names)} is not installed "
            "(e.g. apt-get install podman runc)"
        )
    name, binary = found[0]
    if name == "docker":
        return _docker(binary, oci_runtime, pull, pids_limit)
    return _podman(binary, oci_runtime, pull, pids_limit)


def _podman(binary: str, oci_runtime: str, pull: str, pids_limit: int) -> Engine:
    info = _run(
        [
            binary,
            "info",
            "--format",
            "{{.Host.CgroupsVersion}} {{.Host.OCIRuntime.Name}} {{.Host.Security.Rootless}} "
            "{{.Host.CgroupManager}} {{.Host.NetworkBackend}}",
        ]
    )
    if info.returncode != 0:
        raise EngineError(f"podman does not work here: {_last_line(info.stderr)}")
    words = info.stdout.split()
    cgroup_version, default_runtime, rootless, manager, network = (words + [""] * 5)[:5]
    notes = [
        f"container engine: podman ({binary}), cgroup {cgroup_version or 'unknown'}"
        + (", rootless" if rootless == "true" else ", rootful")
        + f"; cgroup manager {manager or 'unknown'}, network backend {network or 'unknown'}"
    ]
    if rootless == "true":
        notes.append(_rootless_network_note())
    cgroup_limits = not (rootless == "true" and cgroup_version == "v1")
    if oci_runtime != "auto":
        candidates = [oci_runtime]
    else:
        candidates = [r for r in dict.fromkeys([default_runtime, *OCI_RUNTIMES]) if r]
    ulimit_sets = [(), _own_ulimits(), ("nofile=1024:1024", "nproc=4096:4096")]
    refusals: list[str] = []
    with tempfile.TemporaryDirectory(prefix="aisched-probe-") as rootfs:
        for rt in candidates:
            for ulimits in ulimit_sets:
                ok, why = _probe(binary, rt, ulimits, rootfs)
                if ok:
                    if refusals:
                        notes.append("probe: " + "; ".join(refusals))
                    notes.append(
                        f"OCI runtime {rt}"
                        + (" (the engine's default)" if rt == default_runtime else "")
                        + "; ulimits "
                        + (" ".join(ulimits) if ulimits else "the engine's defaults")
                    )
                    if not cgroup_limits:
                        notes.append(
                            "rootless on cgroup v1: no cgroup limits on containers; memory is "
                            "limited per process (RLIMIT_DATA) and cores by CPU affinity; the "
                            "CPU quota and the pids limit are NOT applied"
                        )
                    gpu_cdi = _cdi_has_nvidia()
                    notes.append(
                        "GPUs as CDI devices (nvidia.com/gpu=IDX)"
                        if gpu_cdi
                        else "GPUs through NVIDIA_VISIBLE_DEVICES (no NVIDIA CDI spec found)"
                    )
                    return Engine(
                        name="podman",
                        binary=binary,
                        runtime=rt,
                        ulimits=ulimits,
                        cgroup_version=cgroup_version or "v2",
                        rootless=rootless == "true",
                        gpu_cdi=gpu_cdi,
                        pull=pull,
                        pids_limit=pids_limit,
                        bridge_gateway=_bridge_gateway(binary),
                        cgroup_limits=cgroup_limits,
                        cgroup_manager=manager,
                        notes=tuple(notes),
                    )
                refusals.append(
                    f"{rt} with {' '.join(ulimits) or 'default ulimits'} refused: {why}"
                )
                if "rlimit" not in why:
                    break  # the runtime itself fails: other ulimits will not help
    raise EngineError("podman cannot start a container here: " + "; ".join(refusals))


def _rootless_network_note() -> str:
    """Which helper gives a rootless container its network (podman 4 uses slirp4netns by
    default, pasta where configured); none installed means only `network: host | none`."""
    found = [t for t in ("slirp4netns", "pasta") if shutil.which(t) is not None]
    if not found:
        return (
            "rootless networking: neither slirp4netns nor pasta is installed, so only "
            "network: host and none work (apt-get install slirp4netns)"
        )
    return f"rootless networking through {' and '.join(found)}"


def _probe(binary: str, runtime: str, ulimits: Sequence[str], rootfs: str) -> tuple[bool, str]:
    argv = [
        binary,
        "run",
        "--rm",
        "--runtime",
        runtime,
        "--network",
        "none",
        "--log-driver",
        "none",
    ]
    for u in ulimits:
        argv += ["--ulimit", u]
    # --rootfs is a switch: the first word after the options is the root filesystem.
    r = _run([*argv, "--rootfs", rootfs, _PROBE_COMMAND])
    # 127: the runtime set everything up and only the (missing) command failed.
    if r.returncode == 127:
        return True, ""
    why = _last_line(r.stderr) or f"exit code {r.returncode}"
    # runc's own chain of prefixes says nothing the last part does not.
    return False, why.rsplit("error during container init: ", 1)[-1].removeprefix("Error: ")


def _bridge_gateway(binary: str) -> str | None:
    """The default bridge's gateway: the host's address as containers on the bridge see it."""
    r = _run(
        [
            binary,
            "network",
            "inspect",
            "podman",
            "--format",
            "{{range .Subnets}}{{.Gateway}} {{end}}",
        ]
    )
    words = r.stdout.split() if r.returncode == 0 else []
    return words[0] if words else None


def _docker(binary: str, oci_runtime: str, pull: str, pids_limit: int) -> Engine:
    info = _run(
        [
            binary,
            "info",
            "--format",
            "{{.CgroupVersion}} {{.DefaultRuntime}} {{.CgroupDriver}} {{.SecurityOptions}}",
        ]
    )
    if info.returncode != 0:
        raise EngineError(f"docker does not work here: {_last_line(info.stderr)}")
    words = (info.stdout.split(maxsplit=3) + ["", "", "", ""])[:4]
    rootless = "name=rootless" in words[3]
    runtime = None if oci_runtime == "auto" else oci_runtime
    notes = (
        f"container engine: docker ({binary}), cgroup v{words[0] or '?'}; OCI runtime "
        f"{runtime or words[1] or 'the default'}; cgroup driver {words[2] or 'unknown'}"
        + (", rootless" if rootless else ""),
        "GPUs through NVIDIA_VISIBLE_DEVICES (docker: the nvidia runtime)",
    )
    return Engine(
        name="docker",
        binary=binary,
        runtime=runtime,
        cgroup_version=f"v{words[0]}" if words[0] else "v2",
        pull=pull,
        pids_limit=pids_limit,
        bridge_gateway="172.17.0.1",
        rootless=rootless,
        cgroup_manager=words[2],
        notes=notes,
    )


# --- one task's container -------------------------------------------------------------------


def engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the engine's command line gets: `ENGINE_ENV_NAMES` from `environ`,
    with `SYSTEM_PATH` after its PATH. The same for the local executor and a Ray node's."""
    env = {k: environ[k] for k in ENGINE_ENV_NAMES if k in environ}
    env["PATH"] = f"{env['PATH']}:{SYSTEM_PATH}" if env.get("PATH") else SYSTEM_PATH
    return env


def container_name(instance: str, job_id: str, attempt: int, task: str) -> str:
    """Unique per scheduler instance (its data directory) and task attempt."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in f"{job_id}.{attempt}.{task}")
    return f"aisched-{instance}-{safe}"[:250]


@dataclass(frozen=True, slots=True)
class ContainerTask:
    """What the executor knows of one task when it builds its container."""

    instance: str
    job_id: str
    attempt: int
    task: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str | None
    cores: tuple[int, ...]
    milli_cpu: int
    mem_limit_mib: int
    gpus: tuple[int, ...]
    checkpoint_dir: str | None
    env_file: str
    user: Mapping[str, Any] | None = None
    # The cgroup path the engine makes the container's cgroups under
    # (`cgroups.container_cgroup_parent`); None: the engine's default place.
    cgroup_parent: str | None = None


def task_env(spec: ContainerSpec, t: ContainerTask, engine: Engine) -> dict[str, str]:
    """The task's environment inside the container: the contract as on the host, with the
    GPUs renumbered as the container sees them (only its own, from 0), the master address
    reachable from a bridge, and HOME/USER/LOGNAME those of the user it runs as."""
    env = dict(t.env)
    if t.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(t.gpus)))
        if not engine.gpu_cdi:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g) for g in t.gpus)
    elif "CUDA_VISIBLE_DEVICES" in env:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    if spec.network == NetworkMode.BRIDGE and engine.bridge_gateway is not None:
        addr = env.get("MASTER_ADDR", "")
        if addr.startswith("127.") or addr in ("localhost", "::1", ""):
            # The host's loopback is not the container's: rank 0 publishes MASTER_PORT on the
            # host, and the gang reaches it through the bridge's gateway.
            env["MASTER_ADDR"] = engine.bridge_gateway
    if t.user is not None:
        env["HOME"] = str(t.user.get("home") or "/")
        env["USER"] = env["LOGNAME"] = str(t.user["name"])
    return env


def create_args(spec: ContainerSpec, t: ContainerTask, engine: Engine) -> list[str]:
    """The `create` command of the task's container (see the module docstring); its
    environment is read from `t.env_file` (`env_file_text`). Raises ContainerArgsError for an
    image behind a transport and for a mount path holding ':' or ','."""
    if (transport := image_transport(spec.image)) is not None:
        # The job spec refuses these; a job stored before it did must not run either.
        raise ContainerArgsError(
            f"image {spec.image}: names the image transport {transport!r}: only a registry "
            "reference may be run"
        )
    name = container_name(t.instance, t.job_id, t.attempt, t.task)
    a = [engine.binary, "create", "--name", name]
    for key, value in (
        ("instance", t.instance),
        ("job", t.job_id),
        ("attempt", str(t.attempt)),
        ("task", t.task),
    ):
        a += ["--label", f"{LABEL}.{key}={value}"]
    if engine.runtime:
        a += ["--runtime", engine.runtime]
    for u in engine.ulimits:
        a += ["--ulimit", u]
    a += ["--pull", engine.pull]
    # The supervisor copies the attached output into the task's log; no second copy.
    a += ["--log-driver", "none"]
    # 1. Untrusted image: no capabilities, no privilege gained through setuid binaries.
    a += ["--cap-drop", "all", "--security-opt", "no-new-privileges"]
    if t.user is not None:
        a += ["--user", f"{int(t.user['uid'])}:{int(t.user['gid'])}"]
        for g in t.user.get("groups") or ():
            if int(g) != int(t.user["gid"]):
                a += ["--group-add", str(int(g))]
    # 2. Limits.
    # Without a cgroup of its own (rootless, cgroup v1) the supervisor pins the cores and sets
    # the memory rlimit on the container's init instead (see supervisor_container.Container).
    if engine.cgroup_limits:
        if t.milli_cpu > 0:
            a += ["--cpus", f"{t.milli_cpu / 1000:g}"]
        if t.cores:
            a += ["--cpuset-cpus", ",".join(str(c) for c in t.cores)]
        if t.mem_limit_mib > 0:
            # Swap counted in: over the limit is an OOM kill, not a crawl through swap.
            a += ["--memory", f"{t.mem_limit_mib}m", "--memory-swap", f"{t.mem_limit_mib}m"]
        if engine.pids_limit > 0:
            a += ["--pids-limit", str(engine.pids_limit)]
        if t.cgroup_parent and engine.takes_cgroup_parent:
            # Under the user's pids cgroup: its bound and the one of all tasks count the
            # container's processes as they count a host task's.
            a += ["--cgroup-parent", t.cgroup_parent]
    a += ["--shm-size", f"{spec.shm_mib or DEFAULT_SHM_MIB}m"]
    # 3. Network: rank 0 of a bridged gang publishes its master port, for the others to reach
    #    through the bridge's gateway. A task alone has no one to reach it: published, its
    #    port was open on all the host's addresses for nothing.
    a += ["--network", spec.network.value]
    env = task_env(spec, t, engine)
    gang = env.get("WORLD_SIZE", "1") != "1"
    if (
        spec.network == NetworkMode.BRIDGE
        and gang
        and env.get("RANK") == "0"
        and env.get("MASTER_PORT")
    ):
        a += ["--publish", f"{env['MASTER_PORT']}:{env['MASTER_PORT']}"]
    # 4. GPUs.
    if t.gpus and engine.gpu_cdi:
        for g in t.gpus:
            a += ["--device", f"nvidia.com/gpu={g}"]
    # 5. Mounts: the working and checkpoint directories where the task expects them. A host
    #    path is mounted resolved: a link swapped after the service's check changes nothing.
    #    A host path its user may not write is mounted read-only: the task could not write
    #    there anyway (it runs as the user), and the engine, as root, then cannot make a mount
    #    point in it either, whatever link (in the image, in a mount) leads a nested mount in.
    mounted: set[str] = set()
    for i, v in enumerate(spec.volumes):
        host = os.path.realpath(v.host_path)
        read_only = v.read_only or not _user_may_write(t, host)
        a += ["--volume", _mount(f"volumes.{i}", host, v.container_path, read_only)]
        mounted.add(v.container_path)
    # The checkpoint directory is made before the container (supervisor_container.Container.prepare,
    # which mounts it resolved once it is made); the working directory is mounted resolved
    # when it exists (else the image's own is used).
    for what, d, must in (
        ("workdir", None if spec.workdir_in_image else t.workdir, False),
        ("checkpoint directory", t.checkpoint_dir, True),
    ):
        if d and d not in mounted and (must or os.path.isdir(d)):
            if (why := not_plain(d)) is not None:
                raise ContainerArgsError(f"{what}: {why}")
            host = os.path.realpath(d) if what == "workdir" else d
            read_only = what == "workdir" and not _user_may_write(t, host)
            a += ["--volume", _mount(what, host, d, read_only)]
            mounted.add(d)
    if t.workdir:
        a += ["--workdir", t.workdir]
    a += ["--env-file", t.env_file]
    # 6. The command replaces the image's entrypoint, as a pod's `command` does.
    a += ["--entrypoint", "", spec.image, *t.command]
    return a


def _user_may_write(t: ContainerTask, host: str) -> bool:
    """Whether the task's user may write `host` (a task of no local user's: the service's
    own, which may)."""
    if t.user is None:
        return True
    return user_can(str(t.user["name"]), host, 0o3 if os.path.isdir(host) else 0o2)


def _mount(what: str, host: str, path: str, read_only: bool) -> str:
    """The `--volume` value HOST:PATH[:ro]; a path holding what the engine reads as mount
    options (`mount_option_char`) is refused, whatever the job spec let through."""
    for p in (host, path):
        if (c := mount_option_char(p)) is not None:
            raise ContainerArgsError(
                f"{what}: cannot mount {p!r}: it holds a {c!r}, which the container "
                "engine would read as mount options"
            )
    return f"{host}:{path}" + (":ro" if read_only else "")


def unapplied_limits(t: ContainerTask, engine: Engine) -> str | None:
    """The line for the task's log that says which of its limits the engine cannot apply
    (and what holds instead), or None when all are applied."""
    if engine.cgroup_limits:
        return None
    held = []
    if t.mem_limit_mib > 0:
        held.append(f"memory {t.mem_limit_mib} MiB per process (RLIMIT_DATA), not in total")
    if t.cores:
        held.append(f"cores {','.join(str(c) for c in t.cores)} by CPU affinity")
    lost = []
    if t.milli_cpu > 0:
        lost.append(f"the CPU quota of {t.milli_cpu / 1000:g} CPUs")
    if engine.pids_limit > 0:
        lost.append(f"the pids limit of {engine.pids_limit}")
    return (
        "rootless podman on cgroup v1 cannot put this container in a cgroup of its own: "
        + (f"applied instead: {'; '.join(held)}; " if held else "")
        + f"NOT applied: {', '.join(lost) or 'nothing else'}"
    )


def env_file_text(env: Mapping[str, str]) -> str:
    """The env file the engine reads the task's environment from, one `NAME=value` a line.
    Raises ContainerArgsError for a value with a line break, which such a file cannot carry:
    the job spec refuses one in a container task (a command line would show it to every local
    user, and the engine's own environment is root's); a job stored before it did must not
    have its variable cut short."""
    lines = []
    for k, v in env.items():
        if "\n" in v or "\r" in v:
            raise ContainerArgsError(
                f"env {k}: holds a line break, which the engine's env file cannot carry"
            )
        lines.append(f"{k}={v}\n")
    return "".join(lines)


def start_args(engine: Engine, name: str) -> list[str]:
    return [
        engine.binary,
        "start",
        "--attach",
        *(["--sig-proxy=false"] if engine.name == "podman" else []),
        name,
    ]


def resolve_volumes(spec: ContainerSpec) -> ContainerSpec:
    """`spec` with each volume's host path resolved (links followed): what the service checks
    a user may read is then what the engine mounts, not where a link points later."""
    resolved = tuple(replace(v, host_path=os.path.realpath(v.host_path)) for v in spec.volumes)
    return replace(spec, volumes=resolved)


def shown_path(given: str, real: str) -> str:
    """A host path in a message: as the job gave it, and where it leads if elsewhere."""
    return given if given == real else f"{given} (a link to {real})"


def user_may_read(user: str, path: str) -> bool:
    """Whether the local user `user` could read (and enter, for a directory) `path` with its
    own uid and groups: a hostPath volume is mounted with the engine's privileges, so a user's
    job must not mount what that user could not open. Unknown users may read nothing."""
    return user_can(user, path, 0o5 if os.path.isdir(path) else 0o4)


def not_plain(path: str) -> str | None:
    """Why `path` may not be mounted as written, or None. The engine drops a `..` from the
    text before it follows any link, where the kernel (and so the check of what the user may
    read) follows the link first: `~/link/../x` would be checked in one place and mounted
    from another."""
    if any(part in (".", "..") for part in path.split("/")):
        return f"{path!r} holds '.' or '..': give the directory's own path"
    return None


def mount_refusal(
    user: str,
    given: ContainerSpec,
    resolved: ContainerSpec,
    workdir: str | None,
    checkpoint_dir: str | None = None,
) -> str | None:
    """Why a container task of the local user `user` may not have its mounts, or None: each
    hostPath volume (`resolved` is `given` after `resolve_volumes`: what is checked is what is
    mounted) and the working directory must be ones the user could read, since the engine
    mounts them with its own privileges, and no mount may make the engine create its mount
    point where the user could not (`nested_mount_refusal`)."""
    for i, (v, real) in enumerate(zip(given.volumes, resolved.volumes, strict=True)):
        if not user_may_read(user, real.host_path):
            return (
                f"volumes.{i}: user {user} may not read "
                f"{shown_path(v.host_path, real.host_path)}, so its job may not mount it"
            )
    if given.workdir_in_image:
        workdir = None  # not mounted (create_args)
    if (why := workdir_refusal(user, workdir)) is not None:
        return why
    mounts = [
        (f"volumes.{i}", v.host_path, v.container_path) for i, v in enumerate(resolved.volumes)
    ]
    if workdir and os.path.isdir(workdir):  # as create_args mounts it
        mounts.append(("workdir", os.path.realpath(workdir), workdir))
    if checkpoint_dir:
        mounts.append(("checkpoint directory", checkpoint_dir, checkpoint_dir))
    return nested_mount_refusal(user, mounts)


def nested_mount_refusal(user: str, mounts: Sequence[tuple[str, str, str]]) -> str | None:
    """Why a mount (what, host path, container path) may not go inside another, or None. A
    mount point that does not exist inside a mounted host directory is made there by the
    engine, as root, before the container starts: a job must not make root create files in
    a directory its user could only read (an empty /etc/nologin, say). Where the mount point
    exists already, nothing is made; else the user must be able to write where it would be."""
    for what, _host, inner in mounts:
        for outer_what, outer_host, outer in mounts:
            rel = os.path.relpath(os.path.normpath(inner), os.path.normpath(outer))
            if rel == "." or rel.startswith(".."):
                continue  # not strictly inside the other one
            target = os.path.join(outer_host, rel)
            if (link := _first_link(outer_host, rel)) is not None:
                # The engine follows it inside the container, where it may lead into another
                # mount: what is checked here would not be where the mount point is made.
                return (
                    f"{what}: {inner} is inside {outer_what} ({outer} from {outer_host}), "
                    f"through {link}, a symbolic link: give a path without links"
                )
            if os.path.lexists(target):
                continue
            parent = os.path.dirname(target)
            while not os.path.lexists(parent) and parent != outer_host:
                parent = os.path.dirname(parent)
            if not user_can(user, parent, 0o3):
                return (
                    f"{what}: {inner} is inside {outer_what} ({outer} from {outer_host}), so "
                    f"the engine would create {target} as root, and user {user} may not "
                    f"write {parent}: mount it elsewhere, or make {target} first"
                )
    return None


def workdir_refusal(user: str, workdir: str | None) -> str | None:
    """Why a container task of `user` may not have `workdir` mounted, or None: `create_args`
    mounts a working directory that is a directory here, resolved, read-write with the
    engine's privileges, so the user must be able to read and enter it (admission checks it
    too; this holds for a job admitted before it did, or a directory changed since)."""
    if not workdir or not os.path.isdir(workdir):
        return None
    if (why := not_plain(workdir)) is not None:
        return f"workdir: {why}"
    if user_may_read(user, os.path.realpath(workdir)):
        return None
    return f"workdir: {unreadable_workdir(user, workdir)}"


def _first_link(top: str, rel: str) -> str | None:
    """The first symbolic link among the directories on the way from `top` down to `rel` (as
    far as they exist), or None. (A mount point that is itself a link would be followed by
    root's engine: the supervisor refuses it when it nests the mount (`Pins.nest`), and a
    checkpoint directory that is a link when it makes it, each in words of its own.)"""
    path = top
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            return path
        if not os.path.lexists(path):
            return None
    return None


def unreadable_workdir(user: str, workdir: str) -> str:
    return f"user {user} may not read {workdir}, so its container may not mount it"


def list_containers(engine: Engine, instance: str) -> list[tuple[str, str, int, str]]:
    """(name, job, attempt, task) of every container of this scheduler instance, any state,
    read from the names (`container_name`), which both engines list alike."""
    r = _run(
        [engine.binary, "ps", "--all", "--filter", f"label={LABEL}.instance={instance}",
         "--format", "{{.Names}}"]
    )  # fmt: skip
    prefix = f"aisched-{instance}-"
    out = []
    for name in r.stdout.split() if r.returncode == 0 else ():
        job, _, rest = name.removeprefix(prefix).partition(".")
        attempt, _, task = rest.partition(".")
        if name.startswith(prefix) and job and is_decimal(attempt) and task:
            out.append((name, job, int(attempt), task))
    return out


def remove_container(binary: str, name: str) -> None:
    """Kills and removes a container at once; one that is already gone is fine. (Podman's
    `rm --force` would first wait out the image's stop timeout; docker's kills at once.)"""
    at_once = ["--time", "0"] if os.path.basename(binary) == "podman" else []
    _run([binary, "rm", "--force", *at_once, name])

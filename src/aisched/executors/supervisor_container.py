"""Container tasks: one task's container, driven through its engine's command line.

The executor writes the whole `create` and attached `start` commands (see `container.py`);
`Container` runs them for the supervisor (and for a Ray host's task runner, `ray_task.py`):
it makes the directories the engine mounts (as the task's user, refusing links and others'
directories), pins the user's host paths (`supervisor_pins.py`), judges the image's links
where the engine would mount over them (`_image_link`), creates and initialises the container
before its process starts (so its OOM watch and traffic shaping are in place first), and
stops, kills and removes it.

It must import only the standard library and the supervisor's stdlib-only modules, never
`supervisor` itself, and stay side-effect free at import (see `supervisor.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import stat

from aisched.executors.processes import describe_code, oom_kills, signal_name
from aisched.executors.supervisor_pins import Pins
from aisched.executors.task_files import ExecFailed, as_user, own_dir
from aisched.model.numerals import is_decimal

# Without importing typing (start-up time counts): mypy treats this name as always true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

# Docker's `export` streams the container's whole file system (an image of tens of GiB takes
# minutes on a slow disk), so it gets far more than a plain engine command's 60 s; yet a bound,
# like every engine command here: a hung engine must fail the task's start, not hold it for
# ever.
EXPORT_TIMEOUT_S = 900.0
# Of `export`'s errors, the last this many bytes are read (its last line says why it failed).
_ERRORS_KEPT = 64 * 1024


def _make_dir(path: str, owner: list[int] | None, groups: Sequence[int]) -> None:
    """`path` made by `owner` (uid, gid) with its supplementary `groups` (the rights it looks
    the path up with), the leaf 0700, its missing parents its own too; by the service, 0755,
    without one. Raises ExecFailed with the reason."""
    if owner:
        why = _run_as(owner, groups, ["mkdir", "-p", "-m", "700", "--", path])
        if why is not None:
            raise ExecFailed(126, f"cannot make {path}: {why}")
        return
    try:
        os.makedirs(path, mode=0o755)
    except OSError as exc:
        raise ExecFailed(126, f"cannot make {path}: {exc.strerror or exc}") from None


def _run_as(owner: Sequence[int], groups: Sequence[int], argv: list[str]) -> str | None:
    """Runs `argv` as `owner` (uid, gid) with `groups` and the usual umask; why it failed
    (its last line), or None."""
    import subprocess  # only container tasks pay for it

    done = subprocess.run(
        argv, user=int(owner[0]), group=int(owner[1]), extra_groups=list(groups),
        umask=0o022, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return None if done.returncode == 0 else _last(done.stderr)


# Why the engine must not be given a link for a checkpoint directory (see `own_dir`).
_ENGINE_FOLLOWS = "is a symbolic link, which the engine would follow with root's rights"


def _own_resolved(path: str, uid: int) -> str:
    """Where `path` resolves to, once it and that are both checked by `own_dir`: a link on
    the way (the user's to place) must lead to a directory of the task's user too; "" when
    nothing is there yet."""
    if not os.path.lexists(path):
        return ""
    own_dir(path, uid, _ENGINE_FOLLOWS)
    real = os.path.realpath(path)
    own_dir(real, uid, _ENGINE_FOLLOWS)
    return real


class _Pinned:
    """One `--volume` of `create` once pinned: where its value is (`at` is its flag's index),
    the host path, the normalised container path, the pin, and whether it is read-only. (A
    plain class: the supervisor imports no dataclasses, start-up time counts.)"""

    __slots__ = ("at", "host", "path", "pin", "read_only")

    def __init__(self, at: int, host: str, path: str, pin: str, read_only: bool) -> None:
        self.at, self.host, self.path, self.pin, self.read_only = at, host, path, pin, read_only


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a command line (its first), or None."""
    at = [i for i, a in enumerate(argv[:-1]) if a == flag]
    return argv[at[0] + 1] if at else None


def _enclosing(m: _Pinned, mounts: Sequence[_Pinned]) -> _Pinned | None:
    """The mount `m` is nested in (the deepest whose container path holds `m`'s), or None."""
    outers = [o for o in mounts if m.path.startswith(o.path.rstrip("/") + "/")]
    return max(outers, key=lambda o: len(o.path), default=None)


def _image_link(kind_of: Callable[[str], str], path: str, mounted: set[str]) -> str | None:
    """The first symbolic link on the way to `path` (itself included) in a container's root
    file system, as far as the names exist and up to a `mounted` path (what is below one is
    the mount's), or None. `kind_of` reads the file system (`_rootfs_kind`, `_layers_kind`,
    `_exported_kinds`): what a path is, "link", "dir" or anything else (no directory, or
    missing), never following a link; it is asked about each name on the way in turn, and
    only past directories. Paths are read as the engines read them: a `..` dropped from the
    text before any link is followed (`/x/../zz` is `/zz`, whatever `/x` is)."""
    path = _clean(path)
    mounted = {_clean(m) for m in mounted}
    seen = "/"
    for name in [p for p in path.split("/") if p]:
        seen = os.path.join(seen, name)
        kind = kind_of(seen)
        if kind == "link":
            return seen
        if kind != "dir" or seen in mounted:
            return None
    return None


def _clean(path: str) -> str:
    return os.path.normpath("/" + path.lstrip("/"))


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "link"
    return "dir" if stat.S_ISDIR(st.st_mode) else "other"


def _rootfs_kind(rootfs: str) -> Callable[[str], str]:
    """The reader of a mounted root file system (podman's `mount`). An lstat from its top:
    asked in turn (see `_image_link`), everything on the way is a directory, no link."""

    def kind_of(path: str) -> str:
        try:
            return _kind(os.lstat(os.path.join(rootfs, path.lstrip("/"))))
        except OSError:
            return "missing"

    return kind_of


def _layers_kind(layers: Sequence[str]) -> Callable[[str], str]:
    """The reader of a root file system not mounted, from the directories of its overlay
    layers (docker's overlay2: the container's own layer, then its `-init` layer and the
    image's, the uppermost first), merged as overlayfs merges them: the uppermost layer that
    holds a name decides what it is; a whiteout there (a character device 0/0) hides it; a
    directory is merged with the directories of that name below it, down to the first
    opaque one (`trusted.overlay.opaque`) or the first layer where the name is no directory."""

    def kind_of(path: str) -> str:
        dirs, kind = list(layers), "dir"
        for name in [p for p in path.split("/") if p]:
            if kind != "dir":
                return "missing"
            below: list[str] = []
            kind = "missing"
            for top in dirs:
                at = os.path.join(top, name)
                try:
                    st = os.lstat(at)
                except OSError:
                    continue  # not in this layer: the next one down may hold it
                if not stat.S_ISDIR(st.st_mode):
                    if not below and not (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
                        kind = _kind(st)
                    break
                below.append(at)
                kind = "dir"
                if _opaque(at):
                    break
            dirs = below
        return kind

    return kind_of


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _exported_kinds(tar_stream: Any, paths: Sequence[str]) -> Callable[[str], str]:
    """The reader of a root file system exported as a tar (docker's `export`, for storage
    drivers other than overlay2): what each name on the way to `paths` is, read from the
    whole stream (a name may come anywhere in it)."""
    import tarfile  # only this fallback pays for it

    names = [_clean(p).strip("/").split("/") for p in paths]  # as `_image_link` asks
    wanted = {"/".join(n[:k]) for n in names for k in range(1, len(n) + 1)}
    links: set[str] = set()  # every symbolic link: a hard link to one is one too
    kinds: dict[str, str] = {}
    with tarfile.open(fileobj=tar_stream, mode="r|") as tar:
        for entry in tar:
            name = os.path.normpath(entry.name).lstrip("/")
            if entry.issym():
                links.add(name)
            if name not in wanted:
                continue
            if entry.islnk():
                target = os.path.normpath(entry.linkname).lstrip("/")
                kinds[name] = "link" if target in links else "other"
            else:
                kinds[name] = "link" if entry.issym() else "dir" if entry.isdir() else "other"
    return lambda path: kinds.get(path.strip("/"), "missing")


class _TimedPipe:
    """A child's pipe read by a deadline (of `time.monotonic()`): `read` raises TimeoutError
    past it, so a stream that stalls (a hung engine) cannot hold its reader for ever. It is
    what tarfile's stream mode needs of a file: `read(size)`, short reads allowed."""

    def __init__(self, fd: int, deadline: float) -> None:
        import select
        import time

        self.fd, self.deadline, self.clock = fd, deadline, time.monotonic
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def read(self, size: int = -1) -> bytes:
        left_ms = (self.deadline - self.clock()) * 1000
        if left_ms <= 0 or not self.poller.poll(left_ms):
            raise TimeoutError(f"no end of its output by the deadline (fd {self.fd})")
        return os.read(self.fd, size if size > 0 else 1 << 16)


class Container:
    """One task's container, driven through its engine's command line (podman or docker).

    `launch["container"]` (written by the executor, see `container.py`): `binary`, `name`,
    `image`, `create` (the whole create command), `start` (the attached start command),
    `engine_env` (the environment the engine needs), `cgroup_version`, `bandwidth_bit_s`;
    where the engine has no cgroup for it (rootless podman on cgroup v1: `cgroup_version`
    "none"), `pin_cores` (set as the affinity of the engine's `init`, which the container's
    processes inherit), `rlimit_data` (bytes, set on the container's process before it
    execs the task) and `notice` (what is not enforced, for the log).
    The container is created and initialised before its process starts, so its OOM watch and
    its traffic shaping are in place before the task's first instruction. `export_timeout_s`
    bounds docker's `export` (see `exported_kinds`).
    """

    def __init__(
        self,
        spec: dict[str, Any],
        cwd: str | None = None,
        export_timeout_s: float = EXPORT_TIMEOUT_S,
    ) -> None:
        self.spec = spec
        self.export_timeout_s = export_timeout_s
        # Where the engine runs: conmon leaves files in its working directory (an `oom` file
        # after an OOM kill, with podman 4.3 on cgroup v1), so never the service's.
        self.cwd = cwd
        self.binary = str(spec["binary"])
        self.name = str(spec["name"])
        self.env = {str(k): str(v) for k, v in (spec.get("engine_env") or {}).items()}
        self.oom_fd = -1
        self.oom_cgroup: str | None = None
        self.oomed = False
        self.oom_events = 0  # what the v1 eventfd counted (`oom_signalled`)
        self.killed = False  # we sent SIGKILL ourselves
        self.stopper: Any = None  # the `stop -t GRACE` running in the background
        self.pin_cores = [int(c) for c in spec.get("pin_cores") or ()]
        # Memory held by a per-process rlimit, not a cgroup (bytes; 0: none): a failed
        # allocation is the sign of going over it.
        self.rlimit_data = int(spec.get("rlimit_data") or 0)
        # A user's container under root's engine has its host paths pinned (see Pins).
        owner = spec.get("owner")
        self.pins: Pins | None = None
        if owner and os.geteuid() == 0:
            groups = frozenset(int(g) for g in spec.get("owner_groups") or (owner[1],))
            self.pins = Pins(self.name, int(owner[0]), groups)

    def engine(
        self, *args: str, timeout_s: float = 60.0, cores: Sequence[int] = ()
    ) -> tuple[int, str, str]:
        import subprocess  # only container tasks pay for it

        def pin() -> None:  # inherited by conmon, the runtime and the container's init
            os.sched_setaffinity(0, cores)

        try:
            r = subprocess.run(
                [self.binary, *args],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=self.env,
                cwd=self.cwd,
                check=False,
                preexec_fn=pin if cores else None,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 125, "", str(exc)
        return r.returncode, r.stdout, r.stderr

    def prepare(self, log: Any) -> dict[str, Any]:
        """Creates and initialises the container; the launch its attached client runs with.
        Raises ExecFailed with one line (naming the image when it is the image's fault)."""
        try:
            return self.create(log)
        except BaseException:
            self.unpin()
            raise

    def create(self, log: Any) -> dict[str, Any]:
        if self.pins is not None:
            self.pin_mounts(self.make_dirs())
        else:
            self.mount_resolved(self.make_dirs())
        if self.spec.get("notice"):
            log(str(self.spec["notice"]))
        image = str(self.spec.get("image") or "")
        if image and self.engine("image", "inspect", "--format", "{{.Id}}", image)[0] != 0:
            if self.pull_policy() == "never":
                log(f"image {image} is not on this node, and {_NO_PULL}")
            else:
                log(f"image {image} is not on this node: pulling it")
        code, _, err = self.engine(*self.spec["create"][1:], timeout_s=3600.0)
        if code != 0:
            message, image_missing = self.create_failure(err)
            raise ExecFailed(125, message, "unrunnable" if image_missing else "exited")
        if self.pins is not None:
            self.refuse_image_links()
        if self.spec.get("engine") == "docker":
            # Docker has no `init`: the container starts with its attached client, and docker
            # reports its OOM kills itself (bandwidth is refused for it at launch).
            return self.client_launch()
        code, _, err = self.engine("init", self.name, cores=self.pin_cores)
        if code != 0:
            self.remove()
            raise ExecFailed(125, f"container {self.name} could not start: {_last(err)}")
        self.unpin()  # its mounts are in the container now
        _, out, _ = self.engine("inspect", "--format", "{{.State.Pid}}", self.name)
        pid_text = out.strip()
        pid = int(pid_text) if is_decimal(pid_text) else 0
        if pid > 0 and self.rlimit_data:
            # The container's process waits to exec the task's command: what it execs keeps
            # the limit (ours to lower: rootless, that process is our own uid).
            try:
                limit = (self.rlimit_data, self.rlimit_data)
                resource.prlimit(pid, resource.RLIMIT_DATA, limit)
            except OSError as exc:
                self.remove()
                raise ExecFailed(
                    125, f"cannot limit the memory of {self.name}: {exc.strerror or exc}"
                ) from None
        if pid > 0:
            self.watch_oom(pid)
            rate = self.spec.get("bandwidth_bit_s")
            if rate:
                self.shape(pid, int(rate), log)
        return self.client_launch()

    def client_launch(self) -> dict[str, Any]:
        """The launch its attached client runs with (see `self_launch_defaults`)."""
        return {
            **self_launch_defaults(),
            "container": self.spec,
            "command": list(self.spec["start"]),
            "env": self.env,
            "workdir": self.cwd,
        }

    def pin_mounts(self, resolved: dict[str, str]) -> None:
        """Each host path `create` mounts replaced by its pin (see Pins): the directories made
        (`make_dirs`) by where they resolved, which must be the user's own; one the user may
        not write mounted read-only. A mount inside another one is put in that one's pin by
        the supervisor (`Pins.nest`), not left to the engine."""
        assert self.pins is not None
        own = set(resolved.values())
        create = self.spec["create"]
        mounts: list[_Pinned] = []
        for i in range(len(create) - 1):
            if create[i] != "--volume":
                continue
            host, _, rest = create[i + 1].partition(":")
            host = resolved.get(host, host)
            pinned, writable = self.pins.pin(host, own=host in own)
            read_only = rest.endswith(":ro") or not writable
            inner = rest.removesuffix(":ro")
            create[i + 1] = f"{pinned}:{inner}" + (":ro" if read_only else "")
            mounts.append(_Pinned(i, host, os.path.normpath(inner), pinned, read_only))
        if (workdir := self.nested_workdir(mounts)) is not None:
            mounts.append(workdir)
        nested: set[int] = set()
        holders: set[int] = set()  # the mounts something is nested in
        # The deepest first: a pin holds what is nested in it before it is nested itself.
        for m in sorted(mounts, key=lambda m: m.path.count("/"), reverse=True):
            if (outer := _enclosing(m, mounts)) is None:
                continue
            rel = os.path.relpath(m.path, outer.path)
            self.make_mount_point(os.path.join(outer.host, rel), os.path.isdir(m.pin))
            self.pins.nest(m.pin, outer.pin, rel, outer.host, m.read_only)
            nested |= {m.at, m.at + 1} if m.at >= 0 else set()
            holders.add(outer.at)
        if self.spec.get("engine") == "docker":
            # Docker (25 on) makes all of a `:ro` mount read-only, what is nested in it too:
            # such a pin is made read-only here instead, itself alone.
            for m in mounts:
                if m.at >= 0 and m.at in holders and m.at not in nested and m.read_only:
                    self.pins.make_read_only(m.pin, m.host)
                    create[m.at + 1] = create[m.at + 1].removesuffix(":ro")
        self.spec["create"] = [a for k, a in enumerate(create) if k not in nested]

    def nested_workdir(self, mounts: list[_Pinned]) -> _Pinned | None:
        """The working directory pinned, when it is inside a mount but not mounted itself (it
        was no directory when `create` was made): the runtime would make it as root, through
        whatever links the user put on its way. Made by the user instead, and nested like a
        mount (`at` -1: no `--volume` of its own)."""
        assert self.pins is not None
        workdir = _flag_value(self.spec["create"], "--workdir")
        if workdir is None:
            return None
        path = os.path.normpath(workdir)
        m = _Pinned(-1, "", path, "", False)
        if any(o.path == path for o in mounts) or (outer := _enclosing(m, mounts)) is None:
            return None
        host = os.path.join(outer.host, os.path.relpath(path, outer.path))
        self.make_mount_point(host, True)
        pinned, writable = self.pins.pin(host, own=False)
        return _Pinned(-1, host, path, pinned, outer.read_only or not writable)

    def refuse_image_links(self) -> None:
        """Fails the launch when a symbolic link of the image is on the way to where a host
        path is mounted or to the working directory: the runtime follows it inside the
        container, as root, into whatever is mounted where it leads (a writable volume
        holding a directory its user may not write), and makes the mount point or the
        working directory there. Read from the created container's root file system, which
        nothing else changes before it is initialised (podman) or started (docker)."""
        create = self.spec["create"]
        mounted = {create[i + 1].split(":")[1] for i in range(len(create) - 1)
                   if create[i] == "--volume"}  # fmt: skip
        paths = sorted(mounted)
        if (workdir := _flag_value(create, "--workdir")) is not None:
            paths.append(workdir)
        try:
            links = self.image_links(paths, mounted)
        except ExecFailed:
            self.remove()
            raise
        if links:
            self.remove()
            path, link = links[0]
            image = self.spec.get("image", "?")
            raise ExecFailed(
                126,
                f"image {image}: {link} is a symbolic link on the way to {path}, which the "
                "engine would follow as root: refused",
            )

    def image_links(self, paths: list[str], mounted: set[str]) -> list[tuple[str, str]]:
        """Each of `paths` with the image's link on its way (see `_image_link`). Podman mounts
        the container's root file system for reading. Docker has no such command: under
        overlay2 (its default) the container's layer directories are read where `inspect`
        says they are; under another storage driver the file system is exported whole."""
        if self.spec.get("engine") != "docker":
            code, out, err = self.engine("mount", self.name)
            if code != 0:
                raise ExecFailed(125, f"container {self.name} could not be read: {_last(err)}")
            kind_of = _rootfs_kind(out.strip())
            links = [(p, link) for p in paths if (link := _image_link(kind_of, p, mounted))]
            self.engine("umount", self.name)
            return links
        layers = self.overlay_layers()
        kind_of = _layers_kind(layers) if layers is not None else self.exported_kinds(paths)
        return [(p, link) for p in paths if (link := _image_link(kind_of, p, mounted))]

    def overlay_layers(self) -> list[str] | None:
        """The layer directories of a docker container under overlay2, the uppermost first;
        None under another storage driver."""
        code, out, err = self.engine("container", "inspect", "--format", "{{json .GraphDriver}}",
                                     self.name)  # fmt: skip
        if code != 0:
            raise ExecFailed(125, f"container {self.name} could not be read: {_last(err)}")
        try:
            driver = json.loads(out) or {}
        except ValueError:
            driver = {}
        data = driver.get("Data") or {}
        # Else (vfs, btrfs, zfs, containerd's snapshotters) the file system is exported.
        if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
            return None
        layers = [str(data["UpperDir"]), *str(data.get("LowerDir") or "").split(":")]
        layers = [d for d in layers if d]
        for d in layers:  # root's: not looked up through a link of anyone's
            try:
                is_dir = stat.S_ISDIR(os.lstat(d).st_mode)
            except OSError as exc:
                is_dir, d = False, f"{d}: {exc.strerror}"
            if not is_dir:
                raise ExecFailed(125, f"container {self.name} could not be read: {d}")
        return layers

    def exported_kinds(self, paths: list[str]) -> Callable[[str], str]:
        """`_exported_kinds` of the container's `export`, which must be over (its output read
        to the end, the process exited) within `export_timeout_s`: past that it is killed and
        the start fails, naming the export."""
        import subprocess
        import tarfile
        import tempfile
        import time

        deadline = time.monotonic() + self.export_timeout_s
        # Its errors go to a file, not a pipe read after the archive: an engine that fills a
        # pipe's 64 KiB with warnings before the archive ends would block on it, the archive
        # would stop, and the start would fail as if the engine were hung.
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen([self.binary, "export", self.name], stdout=subprocess.PIPE,
                                    stderr=errors, env=self.env, cwd=self.cwd)  # fmt: skip
            assert proc.stdout is not None
            unread = ""  # why the archive could not be read, if it could not
            try:
                try:
                    kind_of = _exported_kinds(_TimedPipe(proc.stdout.fileno(), deadline), paths)
                except (OSError, tarfile.TarError) as exc:
                    unread = str(exc) or type(exc).__name__
                proc.stdout.close()  # the archive's end is all it has to say
                proc.wait(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, subprocess.TimeoutExpired):
                raise ExecFailed(
                    125,
                    f"container {self.name} could not be read: `{self.binary} export` did not "
                    f"end within {self.export_timeout_s:g} s (is the engine hung?): killed",
                ) from None
            finally:
                if proc.returncode is None:  # it timed out: not left running
                    proc.kill()
                    proc.wait()
                proc.stdout.close()
            errors.seek(max(0, errors.seek(0, os.SEEK_END) - _ERRORS_KEPT))
            err = errors.read().decode(errors="replace")
        if unread or proc.returncode != 0:
            # What the engine said, beside what it left of the archive (an engine that failed
            # says why better than an archive cut short does).
            said = _last(err) if proc.returncode != 0 and err.strip() else ""
            if not unread:
                why = said or f"`{self.binary} export` exited with {proc.returncode}"
            else:
                why = f"{unread} ({said})" if said else unread
            raise ExecFailed(125, f"container {self.name} could not be read: {why}")
        return kind_of

    def make_mount_point(self, path: str, is_dir: bool) -> None:
        """A missing mount point inside a mounted host directory made by the task's user
        (the engine would make it as root); one the user cannot make fails the launch.
        Whether it is there is the user's to see (`look`), as what `mkdir` says is."""
        if self.look(lambda: "there" if os.path.lexists(path) else ""):
            return
        assert self.pins is not None
        make = ["mkdir", "-p", "--", path] if is_dir else ["touch", "--", path]
        why = _run_as(self.spec["owner"], sorted(self.pins.groups), make)
        if why is not None:
            raise ExecFailed(126, f"cannot make {path} to mount on: {why}")

    def unpin(self) -> None:
        if self.pins is not None:
            self.pins.release()

    def mount_resolved(self, resolved: dict[str, str]) -> None:
        """`create` mounts each made directory from where it resolved when it was checked
        (`make_dirs`), not through the links on its way, which its user may change since."""
        create = self.spec["create"]
        for path, real in resolved.items():
            create[:] = [f"{real}:{path}" if a == f"{path}:{path}" else a for a in create]

    def make_dirs(self) -> dict[str, str]:
        """The directories the container mounts that must exist first (its checkpoint
        directory); one that exists is left as it is. For a task run as a user they are made
        by that user (`mkdir` run with its ids, the leaf 0700): missing parents in its home
        are its own too, never root's, and a link it placed is followed with its rights alone.
        Else the service makes them, 0755. Either way the directory must then be a directory
        of the task's user (of the service's, without one) and no link (see `own_dir`), and
        so must the directory it resolves to. Returns each one's resolved path.

        A user's are looked up and judged by a process of that user's (`as_user`), never by
        root: through a link the user placed, root's look would tell it (in what is refused,
        and why) whether a path it may not see exists, and whose it is."""
        owner = self.spec.get("owner")
        uid = int(owner[0]) if owner else os.geteuid()
        resolved: dict[str, str] = {}
        for path in self.spec.get("make_dirs") or ():
            real = self.own_resolved(path, uid)
            if not real:
                _make_dir(path, owner, self.spec.get("owner_groups") or ())
                real = self.own_resolved(path, uid)
            if not real:  # made, then gone: the user's doing
                raise ExecFailed(126, f"checkpoint directory {path}: removed as it was made")
            resolved[path] = real
        return resolved

    def own_resolved(self, path: str, uid: int) -> str:
        """`_own_resolved`, looked up by the task's user when it runs as one (`look`)."""
        return self.look(lambda: _own_resolved(path, uid))

    def look(self, check: Callable[[], str]) -> str:
        """What `check` returns, run as the task's user when it runs as one (`as_user`): it
        looks up paths that user controls."""
        owner = self.spec.get("owner")
        if not owner:
            return check()
        user = {"uid": owner[0], "gid": owner[1], "groups": self.spec.get("owner_groups")}
        return as_user(user, check)

    def pull_policy(self) -> str:
        """The `--pull` of the container's `create` (the service's `image_pull`)."""
        args = [str(a) for a in self.spec.get("create") or ()]
        return args[args.index("--pull") + 1] if "--pull" in args[:-1] else "missing"

    def create_failure(self, err: str) -> tuple[str, bool]:
        """The one line that says why `create` failed, and whether the image is missing."""
        image = self.spec.get("image", "?")
        line = _last(err).removeprefix("Error: ")
        low = err.lower()
        # podman's "short-name ... did not resolve to an alias" is a name no registry it may
        # search knows: no retry can find it either.
        words = ("image not known", "manifest unknown", "pull", "no such image",
                 "unable to find image", "repository", "name unknown",
                 "did not resolve to an alias")  # fmt: skip
        if any(w in low for w in words):
            if self.pull_policy() == "never":
                why = f"not present on this node, and {_NO_PULL} ({line})"
            else:
                why = f"not present on this node and could not be pulled ({line})"
            return f"image {image}: {why}", True
        return f"container for image {image} could not be created: {line}", False

    def watch_oom(self, pid: int) -> None:
        """Finds the container's memory cgroup, whose OOM-kill counter `oom_seen` reads while
        it runs. Under cgroup v1 an eventfd on its memory.oom_control is registered as well:
        the cgroup goes with the container, and v1 counts its kills in no parent, so a kill
        just before the end is known only through the eventfd (which the kernel also signals
        when the cgroup is removed: `oom_signalled` counts that one out). A container
        without a cgroup of its own is in the service's: nothing there is its OOM."""
        if self.spec.get("cgroup_version") == "none":
            return
        try:
            with open(f"/proc/{pid}/cgroup", encoding="ascii") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                self.oom_cgroup = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
                try:
                    ctl = os.open(os.path.join(self.oom_cgroup, "memory.oom_control"), os.O_RDONLY)
                    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                    with open(os.path.join(self.oom_cgroup, "cgroup.event_control"), "w") as f:
                        f.write(f"{efd} {ctl}")
                    self.oom_fd = efd
                except OSError:
                    pass
                return
            if controllers == "" and self.spec.get("cgroup_version") == "v2":
                self.oom_cgroup = os.path.join("/sys/fs/cgroup", path.lstrip("/"))

    def oom_seen(self) -> bool:
        """Whether the kernel OOM-killed in the container's cgroup (while it still exists)."""
        if not self.oomed and self.oom_cgroup and os.path.isdir(self.oom_cgroup):
            self.oomed = oom_kills(self.oom_cgroup) > 0
        return self.oomed

    def oom_signalled(self) -> bool:
        """The v1 eventfd counted an OOM. The kernel signals it once per OOM and once more
        when the cgroup is removed (the container's end): a removed cgroup's last signal is
        no OOM (each SIGKILL from outside, and `exit 137`, read as one)."""
        if self.oom_fd >= 0:
            with contextlib.suppress(OSError):
                self.oom_events += os.eventfd_read(self.oom_fd)
        removed = self.oom_cgroup is not None and not os.path.isdir(self.oom_cgroup)
        return self.oom_events - (1 if removed else 0) > 0

    def shape(self, pid: int, rate_bit_s: int, log: Any) -> None:
        """Egress shaping of the container's interface (a token bucket, as the CNI bandwidth
        plugin sets): what the container sends is held to the rate; what it receives is not."""
        import subprocess

        # A burst of 10 ms at the rate, at least 16 KiB; a queue (`limit`) of that and 50 ms
        # at the rate (what tc's `latency 50ms` makes). tc takes no size above 2^32-1 bytes:
        # it refused the burst from 3.4 Tbit on, and wrapped the limit it worked out from a
        # latency (572.7 Gbit had a queue of 5 bytes: nearly all was dropped). So the limit
        # is given in bytes, at most 2^32-1, and the burst at most half that, so the queue
        # still holds more than the burst. At 10 Tbit that is 1.7 ms of burst and 1.7 ms of
        # queue beyond it; the rate itself is exact.
        burst = min(max(rate_bit_s // 8 // 100, 16 * 1024), _TC_MAX_BYTES // 2)
        limit = min(rate_bit_s // 8 * 50 // 1000 + burst, _TC_MAX_BYTES)
        nsenter = str(self.spec.get("nsenter") or "nsenter")
        tc = str(self.spec.get("tc") or "tc")
        # Written once: the same words a CNI bandwidth plugin would give tc.
        qdisc = f"tbf rate {rate_bit_s}bit burst {burst} limit {limit}".split()
        argv = [nsenter, "-t", str(pid), "-n", tc, "qdisc", "replace", "dev", "eth0", "root"]
        argv += qdisc
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            ok, why, refused = r.returncode == 0, _last(r.stderr), True
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, why, refused = False, str(exc), False
        if not ok:
            self.remove()
            # tc's refusal of the qdisc is that of the rate: it would refuse every retry.
            kind = "unrunnable" if refused else "exited"
            raise ExecFailed(125, f"cannot limit the bandwidth of {self.name}: {why}", kind)
        log(f"egress shaped to {rate_bit_s} bit/s (tc tbf on eth0)")

    def signal(self, sig: int, grace_s: float) -> None:
        import subprocess

        if sig == signal.SIGTERM:
            if self.stopper is None:
                # stop: SIGTERM (or the image's stop signal), the grace, then SIGKILL.
                with contextlib.suppress(OSError):
                    self.stopper = subprocess.Popen(
                        [
                            self.binary,
                            "stop",
                            "--time",
                            str(max(0, int(grace_s + 0.999))),
                            self.name,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env=self.env,
                        cwd=self.cwd,
                    )
            return
        self.killed = self.killed or sig == signal.SIGKILL
        self.engine("kill", "--signal", signal_name(sig).removeprefix("SIG"), self.name)

    def end(self, client_code: int) -> tuple[int | None, bool, str]:
        """How the container ended, once its attached client has: its own exit code (a
        signal's death as -N, like a host task's), whether it was OOM-killed, and "" or why
        its end is unknown; then it is removed.

        The client ends with the container, unless it (or conmon, which it reads the exit
        from) died first: the container is then still running, and its `ExitCode` (0 until
        it ends) says nothing. Such a container is killed, not waited for: nothing would copy
        its output into the log any more, and without conmon nothing would record its exit
        (podman makes one up). Its task is then reported lost (the code None, the reason
        said), never succeeded, and it is gone before that report: a retry cannot run beside
        it."""
        if self.stopper is not None:  # a stop under way ends first: then the state is final
            with contextlib.suppress(Exception):
                self.stopper.wait(timeout=5)
        code, out, _ = self.engine(
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}",
            self.name,
        )
        words = out.split() if code == 0 else []
        if words and words[0] not in _ENDED:
            return None, False, self.outlived(client_code, words[0])
        words = words[1:]
        # One sign at most: "--5" passed `lstrip("-")`, and `int` refuses it.
        exit_code = (
            int(words[0]) if words and is_decimal(words[0].removeprefix("-")) else client_code
        )
        # A SIGKILL nobody here sent, to a container whose memory cgroup signalled: the OOM
        # killer's (a container that merely ended signals too, but was not SIGKILLed).
        unexplained_kill = bool(words) and exit_code == 128 + signal.SIGKILL and not self.stopper
        oom = (
            (len(words) > 1 and words[1] == "true")
            or self.oom_seen()
            or (unexplained_kill and not self.killed and self.oom_signalled())
        )
        self.remove()
        if 128 < exit_code < 128 + 65:
            exit_code = -(exit_code - 128)
        return exit_code, oom, ""

    def outlived(self, client_code: int, status: str) -> str:
        """Kills and removes a container that outlived its attached client; why its task's
        end is unknown."""
        self.killed = True
        self.remove()
        why = (
            f"its container's attached client (`{self.binary} start --attach`) "
            f"{describe_code(client_code)} while the container was still {status}: nothing "
            "could follow its output and exit any more, so the container was killed"
        )
        if self.engine("container", "inspect", "--format", "{{.State.Status}}", self.name)[0]:
            return why  # gone, as it must be before its task is reported
        return f"{why}, but it could not be removed: remove {self.name} by hand"

    def remove(self) -> None:
        # Podman's `rm --force` would first wait out the stop timeout; docker's kills at once.
        at_once = [] if self.spec.get("engine") == "docker" else ["--time", "0"]
        self.engine("rm", "--force", *at_once, self.name)
        self.unpin()


def self_launch_defaults() -> dict[str, Any]:
    """What the attached client of a container runs with: no host cgroup, pinning or rlimit
    of its own (the container has them), in the engine's working directory (`client_launch`),
    not the task's."""
    return {"cgroup": None, "cores": [], "mechanism": "none", "mem_limit_mib": 0, "workdir": None}


# The largest size tc takes for a tbf's burst or limit (bytes): it reads them as 32 bits.
_TC_MAX_BYTES = 2**32 - 1
# The states of a container whose process has ended (podman's, docker's): only then is its
# `ExitCode` its own.
_ENDED = frozenset({"exited", "stopped", "dead"})
_NO_PULL = "image_pull: never forbids a pull"  # said of a missing image, in the log and the end


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"

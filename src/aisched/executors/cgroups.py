"""How the local executor bounds a task's memory: which mechanism, and the cgroups it uses.

`choose_memory_control` decides once, at the executor's start: cgroup v2 where a cgroup with the
memory controller can be delegated to us, else cgroup v1 where the memory hierarchy is writable,
else a per-process rlimit (which the supervisor backs with a watch of what the task's
processes hold: their RSS and the memory files only they reach), or none.
A forced mechanism that is not available is an error that says why.

Task cgroups live under one parent (`<own cgroup>/aisched/` unless a parent is given) and are
named `<job>.<attempt>.<task>`; the supervisor removes its task's cgroup when the task ends.

Never moves an existing process (the scheduler included) between cgroups: only a task's own
child joins its cgroup, before it execs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from aisched.executors.device_filter import deny_devices
from aisched.executors.processes import remove_cgroup

MECHANISMS = ("auto", "cgroup-v2", "cgroup-v1", "rlimit", "none")
Devices = tuple[tuple[int, int], ...]  # character devices by (major, minor)
PARENT_NAME = "aisched"
# How often a launch makes its cgroup below the shared parents that other services may be
# removing meanwhile (`_mkdir_in_shared`).
SHARED_PARENT_TRIES = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class MemoryControlError(ValueError):
    """A memory mechanism was asked for that this machine cannot provide; says why."""


@dataclass(frozen=True, slots=True)
class MemoryControl:
    """The chosen mechanism; `base` is the parent of the task cgroups (cgroup mechanisms),
    `owned` whether we created it (and may remove it when empty)."""

    mechanism: str
    base: str | None = None
    owned: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Mount:
    root: str
    point: str
    fstype: str
    options: frozenset[str]


def _mounts() -> list[_Mount]:
    out = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        out.append(_Mount(fields[3], fields[4], tail[0], frozenset(tail[2].split(","))))
    return out


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> our cgroup's path in that hierarchy."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            out[ctrl] = parts[2]
    return out


def _join(mount: _Mount, path: str) -> str:
    """Our cgroup's directory under a mount whose root may itself be a sub-cgroup."""
    root = mount.root.rstrip("/")
    if root and path.startswith(root):
        path = path[len(root) :]
    return os.path.join(mount.point, path.lstrip("/"))


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _probe(base: str, limit_file: str) -> None:
    """Creates a throwaway child with a memory limit, then removes it: raises OSError unless
    task cgroups can really be made here."""
    probe = os.path.join(base, f".probe-{os.getpid()}")
    os.mkdir(probe)
    try:
        _write(os.path.join(probe, limit_file), str(64 << 20))
    finally:
        os.rmdir(probe)


def _v1(parent: str | None) -> tuple[MemoryControl | None, str]:
    if parent is None:
        mount = next((m for m in _mounts() if m.fstype == "cgroup" and "memory" in m.options), None)
        own = _own_cgroups().get("memory")
        if mount is None or own is None:
            return None, "no cgroup v1 memory hierarchy is mounted"
        base, owned = os.path.join(_join(mount, own), PARENT_NAME), True
    else:
        base, owned = parent, False
    try:
        os.makedirs(base, exist_ok=True)
        if not os.path.exists(os.path.join(base, "memory.limit_in_bytes")):
            return None, f"{base} is not a cgroup v1 memory cgroup"
        _probe(base, "memory.limit_in_bytes")
    except OSError as exc:
        return None, f"cannot create memory cgroups under {base}: {exc.strerror or exc}"
    return MemoryControl("cgroup-v1", base, owned, (f"memory cgroups (v1) under {base}",)), ""


def _v2(parent: str | None) -> tuple[MemoryControl | None, str]:
    if parent is None:
        mount = next((m for m in _mounts() if m.fstype == "cgroup2"), None)
        own = _own_cgroups().get("")
        if mount is None or own is None:
            return None, "no cgroup v2 hierarchy is mounted"
        holder = _join(mount, own)
        base, owned = os.path.join(holder, PARENT_NAME), True
    else:
        holder = base = parent
        owned = False
    try:
        if "memory" not in _read(os.path.join(holder, "cgroup.controllers")).split():
            return None, f"the memory controller is not available in {holder}"
        if "memory" not in _read(os.path.join(holder, "cgroup.subtree_control")).split():
            # Fails (EBUSY) when the cgroup holds processes: v2 has no internal processes.
            _write(os.path.join(holder, "cgroup.subtree_control"), "+memory")
        if base != holder:
            os.makedirs(base, exist_ok=True)
            if "memory" not in _read(os.path.join(base, "cgroup.subtree_control")).split():
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
        _enable_bounds_v2(holder, base)
        _probe(base, "memory.max")
    except OSError as exc:
        why = exc.strerror or str(exc)
        return None, (
            f"cannot delegate the memory controller below {holder}: {why} (run the scheduler "
            "in a delegated cgroup, or give a cgroup parent)"
        )
    return MemoryControl("cgroup-v2", base, owned, (f"memory cgroups (v2) under {base}",)), ""


def _enable_bounds_v2(holder: str, base: str) -> None:
    """Enable the pids and cpuset controllers for task cgroups where the holder offers them
    (`choose_task_bounds` notes any that is not)."""
    offered = _read(os.path.join(holder, "cgroup.controllers")).split()
    for ctrl in BOUND_CONTROLLERS:
        if ctrl in offered:
            for at in dict.fromkeys((holder, base)):
                _try_write(os.path.join(at, "cgroup.subtree_control"), f"+{ctrl}")


def choose_memory_control(wanted: str = "auto", cgroup_parent: str | None = None) -> MemoryControl:
    """The mechanism to use. `auto` takes the first available of cgroup-v2, cgroup-v1, rlimit;
    anything else is used if available, else MemoryControlError says why not."""
    if wanted not in MECHANISMS:
        raise MemoryControlError(
            f"memory mechanism {wanted!r} is not one of {', '.join(MECHANISMS)}"
        )
    if wanted == "none":
        return MemoryControl("none", notes=("memory limits are not enforced",))
    if wanted == "rlimit":
        return MemoryControl("rlimit", notes=_RLIMIT_NOTES)
    reasons: list[str] = []
    for name, probe in (("cgroup-v2", _v2), ("cgroup-v1", _v1)):
        if wanted not in ("auto", name):
            continue
        ctrl, why = probe(cgroup_parent)
        if ctrl is not None:
            return ctrl
        if wanted == name:
            raise MemoryControlError(f"memory mechanism {name} is not available: {why}")
        reasons.append(f"{name}: {why}")
    return MemoryControl("rlimit", notes=(*_RLIMIT_NOTES, *reasons))


_RLIMIT_NOTES = (
    "memory limits by RLIMIT_DATA per process, and the supervisor kills a task whose processes "
    "together hold more than its limit, their resident memory and the memfds and deleted tmpfs "
    "files they hold counted (checked every 0.5 s; files of a shared tmpfs that keep a name are "
    "not)",
)


def cgroup_name(instance: str, job_id: str, attempt: int, task: str) -> str:
    """A task's cgroup under the parent: named by its executor's instance too, since two
    services started from one shell share that parent, and a launch replaces a leftover of its
    own name (it would empty another service's task of the same key)."""
    return _UNSAFE.sub("_", f"{instance}.{job_id}.{attempt}.{task}")[:200]


def instance_prefix(instance: str) -> str:
    """How the names of the task cgroups of executor instance `instance` begin."""
    return _UNSAFE.sub("_", f"{instance}.")


def list_task_cgroups(ctrl: MemoryControl, bounds: TaskBounds, prefix: str) -> dict[str, list[str]]:
    """The task cgroups whose names begin with `prefix` under the parents `ctrl` and `bounds`
    use (the memory one, the v1 cpuset one, each user's v1 pids one), by name: a task's
    memory, pids and cpuset cgroups share its name."""
    parents = [ctrl.base] if ctrl.base and ctrl.mechanism in ("cgroup-v1", "cgroup-v2") else []
    for kind, base in bounds.bases:
        if kind == "pids":
            parents += [p for n, p in _subdirs(base) if n.startswith("user-")]
        else:
            parents.append(base)
    out: dict[str, list[str]] = {}
    for parent in parents:
        for name, path in _subdirs(parent):
            if name.startswith(prefix):
                out.setdefault(name, []).append(path)
    return out


def _subdirs(path: str) -> list[tuple[str, str]]:
    try:
        with os.scandir(path) as entries:
            return [(e.name, e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def create_task_cgroup(ctrl: MemoryControl, name: str, mem_limit_mib: int) -> str | None:
    """The task's cgroup, created with its limit (0: none), or None when the mechanism uses no
    cgroups. A leftover of the same name is emptied and replaced. Raises OSError."""
    if ctrl.base is None or ctrl.mechanism not in ("cgroup-v1", "cgroup-v2"):
        return None
    base = ctrl.base

    def make_base() -> None:
        # Removed when another executor sharing it closed while it was empty, and maybe being
        # made again by another one now: a base that is there may still lack its controllers,
        # so they are checked whatever made it (the writes below are idempotent).
        os.makedirs(base, exist_ok=True)
        if ctrl.mechanism == "cgroup-v2" and ctrl.owned:
            _try_write(os.path.join(base, "cgroup.subtree_control"), "+memory")
            _enable_bounds_v2(os.path.dirname(base), base)

    path = os.path.join(base, name)
    _mkdir_in_shared(path, make_base)
    try:
        limit = str(mem_limit_mib << 20)
        if ctrl.mechanism == "cgroup-v1":
            if mem_limit_mib:
                _write(os.path.join(path, "memory.limit_in_bytes"), limit)
                _try_write(os.path.join(path, "memory.memsw.limit_in_bytes"), limit)
        else:
            if mem_limit_mib:
                _write(os.path.join(path, "memory.max"), limit)
                _try_write(os.path.join(path, "memory.swap.max"), "0")
            # One OOM kill takes the whole task, as the v1 path does by hand.
            _try_write(os.path.join(path, "memory.oom.group"), "1")
    except OSError:
        remove_cgroup(path)
        raise
    return path


def _try_write(path: str, value: str) -> None:
    """For knobs that exist only with some kernel options (swap accounting...)."""
    with contextlib.suppress(OSError):
        _write(path, value)


def release_base(ctrl: MemoryControl) -> None:
    """Removes the parent cgroup we created, when no task cgroup is left in it."""
    if ctrl.owned and ctrl.base:
        with contextlib.suppress(OSError):
            os.rmdir(ctrl.base)


def own_memory_limit_mib() -> int | None:
    """The memory limit of the cgroup this process runs in (v2 `memory.max`, else v1
    `memory.limit_in_bytes`), or None when there is none or it cannot be read."""
    mounts = _mounts()
    own = _own_cgroups()
    candidates: list[str] = []
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2 is not None and "" in own:
        candidates.append(os.path.join(_join(v2, own[""]), "memory.max"))
    v1 = next((m for m in mounts if m.fstype == "cgroup" and "memory" in m.options), None)
    if v1 is not None and "memory" in own:
        candidates.append(os.path.join(_join(v1, own["memory"]), "memory.limit_in_bytes"))
    for path in candidates:
        try:
            value = _read(path).strip()
        except OSError:
            continue
        if value == "max":
            return None
        try:
            limit = int(value)
        except ValueError:
            continue
        # v1 writes "no limit" as a huge page-rounded number.
        return limit >> 20 if limit < (1 << 60) else None
    return None


# --- processes and cores: the bounds besides memory --------------------------------------


@dataclass(frozen=True, slots=True)
class TaskBounds:
    """Where a host task's process count (`pids.max`) and cores (`cpuset.cpus`) are bounded,
    so that a task can neither take every PID of the machine nor widen its own CPU affinity.
    Under cgroup v1 each is a hierarchy of its own: `bases` holds (controller, the parent of
    the task cgroups there), and the task joins a cgroup in each. Under cgroup v2 they are
    files of the task's one cgroup: `in_task_cgroup` names the controllers enabled for it.
    `devices`, where asked for, walls off the GPUs a task was not given (`gpu_walls.py`): a v1
    base, or under v2 a BPF device filter on the task's cgroup (`device_filter.py`)."""

    bases: tuple[tuple[str, str], ...] = ()
    in_task_cgroup: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def gpu_walls(self) -> bool:
        """Whether each task gets a devices cgroup that denies the GPUs it was not given."""
        return "devices" in self.in_task_cgroup or any(c == "devices" for c, _ in self.bases)

    @property
    def pins_cores(self) -> bool:
        """Whether each task's cores are those of a cpuset cgroup (not its affinity only)."""
        return "cpuset" in self.in_task_cgroup or any(c == "cpuset" for c, _ in self.bases)

    @property
    def gpu_note(self) -> str | None:
        """The note on the GPU walls (up, or why not); None when none were asked for."""
        return next((n for n in self.notes if n.startswith(GPU_WALLS)), None)


BOUND_CONTROLLERS = ("pids", "cpuset")


def choose_task_bounds(mem: MemoryControl, gpus: Devices = ()) -> TaskBounds:
    """The bounds this machine lets us set, with a note for each one it does not. With `gpus`
    (the device numbers of every GPU's file) GPU walls are asked for too."""
    if mem.mechanism == "cgroup-v2" and mem.base is not None:
        enabled = _read(os.path.join(mem.base, "cgroup.subtree_control")).split()
        found = tuple(c for c in BOUND_CONTROLLERS if c in enabled)
        if "pids" in found:
            _try_write(os.path.join(mem.base, "pids.max"), str(all_tasks_pids_max()))
        missing = [c for c in BOUND_CONTROLLERS if c not in found]
        notes = [f"{', '.join(found)} bounded in each task's cgroup (v2)"] if found else []
        if "pids" in found:
            notes.append("processes are bounded per task and for all tasks, not per user (v2)")
        notes += [_UNBOUNDED[c] + f" (the {c} controller is not enabled in {mem.base})"
                  for c in missing]  # fmt: skip
        if gpus:
            why = _v2_filter_fails(mem.base, gpus[:1])
            if why is None:
                found += ("devices",)
                notes.append(_WALLED.format(f"BPF device filters (v2) on {mem.base}"))
            else:
                notes.append(f"{_UNBOUNDED['devices']} ({why})")
        return TaskBounds(in_task_cgroup=found, notes=tuple(notes))
    bases: list[tuple[str, str]] = []
    notes = []
    for ctrl in (*BOUND_CONTROLLERS, *(("devices",) if gpus else ())):
        base, why = _v1_base(ctrl, gpus[:1])
        if base is None:
            notes.append(f"{_UNBOUNDED[ctrl]} ({why})")
        else:
            bases.append((ctrl, base))
            where = f"{ctrl} cgroups (v1) under {base}"
            notes.append(_WALLED.format(where) if ctrl == "devices" else where)
    return TaskBounds(bases=tuple(bases), notes=tuple(notes))


GPU_WALLS = "GPU walls"  # how the start-up line on them begins
_UNBOUNDED = {
    "pids": "a task's processes and threads are not bounded",
    "cpuset": "a task's cores are its CPU affinity only, which it may widen",
    "devices": f"{GPU_WALLS}: none, a host task's GPUs are its CUDA_VISIBLE_DEVICES only: it "
    "could open the others' device files",
}
_WALLED = GPU_WALLS + ": {}; a host task opens its own GPUs' device files only"


def _v2_filter_fails(base: str, deny: Devices) -> str | None:
    """Why a task cgroup under `base` cannot have a device filter (None: it can), tried on a
    cgroup made for the probe."""
    probe = os.path.join(base, f".probe-devices-{os.getpid()}")
    try:
        os.mkdir(probe)
        try:
            deny_devices(probe, deny)
        finally:
            os.rmdir(probe)
    except OSError as exc:
        return f"cgroup v2: {exc.strerror or exc}"
    return None


def _v1_base(ctrl: str, probe_deny: Devices = ()) -> tuple[str | None, str]:
    mount = next((m for m in _mounts() if m.fstype == "cgroup" and ctrl in m.options), None)
    own = _own_cgroups().get(ctrl)
    if mount is None or own is None:
        return None, f"no cgroup v1 {ctrl} hierarchy is mounted"
    base = os.path.join(_join(mount, own), PARENT_NAME)
    probe = os.path.join(base, f".probe-{os.getpid()}")
    try:
        _make_v1_base(ctrl, base)
        os.mkdir(probe)
        try:
            _set_bound(probe, ctrl, 64, (), base, probe_deny)
        finally:
            os.rmdir(probe)
    except OSError as exc:
        return None, f"cannot create {ctrl} cgroups under {base}: {exc.strerror or exc}"
    return base, ""


def _make_v1_base(ctrl: str, base: str) -> None:
    """Make (or complete) the v1 parent of the task cgroups of `ctrl`: a cpuset starts empty,
    so it gets its own parent's cores and memory nodes; the pids one bounds all tasks together.
    Idempotent: another service may be doing the same at the same time. Raises OSError."""
    os.makedirs(base, exist_ok=True)
    holder = os.path.dirname(base)
    if ctrl == "cpuset":
        for name in ("cpuset.cpus", "cpuset.mems"):
            if not _read(os.path.join(base, name)).strip():
                _write(os.path.join(base, name), _read(os.path.join(holder, name)))
    elif ctrl == "pids":
        limit = str(all_tasks_pids_max())
        if _read(os.path.join(base, "pids.max")).strip() != limit:
            _write(os.path.join(base, "pids.max"), limit)
    # devices: the parent inherits its holder's rules; each task cgroup denies more.


# PIDs the machine keeps outside every task, whatever the tasks do together: its services,
# logins, and aisched itself (a supervisor must still fork to stop a task).
PIDS_KEPT_FREE = 4096


def all_tasks_pids_max() -> int:
    """The most processes and threads all tasks together may hold (the parent cgroup's
    `pids.max`): each task has its own bound, but many tasks of one user could still take
    every PID of the machine (`kernel.pid_max`) without this."""
    try:
        pid_max = int(_read("/proc/sys/kernel/pid_max"))
    except (OSError, ValueError):
        pid_max = 32768
    return max(pid_max - max(PIDS_KEPT_FREE, pid_max // 8), pid_max // 2)


def _set_bound(
    path: str,
    ctrl: str,
    pids_max: int,
    cores: tuple[int, ...],
    parent: str,
    deny: Devices = (),
) -> None:
    if ctrl == "pids":
        _write(os.path.join(path, "pids.max"), str(pids_max) if pids_max > 0 else "max")
        return
    if ctrl == "devices":
        for major, minor in deny:  # one rule per write: the kernel parses one line at a time
            _write(os.path.join(path, "devices.deny"), f"c {major}:{minor} rwm")
        return
    cpus = ",".join(map(str, cores)) or _read(os.path.join(parent, "cpuset.cpus")).strip()
    _write(os.path.join(path, "cpuset.cpus"), cpus)
    mems = os.path.join(path, "cpuset.mems")
    wanted = _read(os.path.join(parent, "cpuset.mems")).strip()
    if wanted and not _read(mems).strip():  # v1: empty until set (v2: empty is inherited)
        _write(mems, wanted)


def bound_cgroups(bounds: TaskBounds, name: str, uid: int, user_pids_max: int) -> list[str]:
    """The v1 cgroups (beside the memory one) a task of cgroup name `name` run as `uid` joins:
    its pids cgroup is under its user's (`user_cgroup`), whose bound all its tasks share."""
    return [
        os.path.join(user_cgroup(base, uid, user_pids_max) if ctrl == "pids" else base, name)
        for ctrl, base in bounds.bases
    ]


def user_cgroup(base: str, uid: int, user_pids_max: int) -> str:
    """The pids cgroup of a user's tasks, bounded by `user_pids_max`. Named by the bound too:
    every service of the machine shares the parent, and one that wrote its own bound into a
    cgroup of the user alone would lower (or raise) another service's bound for that user's
    tasks already running; services of one bound (a leader and its standby) share one."""
    return os.path.join(base, f"user-{uid}.max-{user_pids_max}")


def create_bounds(
    bounds: TaskBounds,
    name: str,
    task_cgroup: str | None,
    pids_max: int,
    cores: tuple[int, ...],
    uid: int,
    user_pids_max: int,
    deny: Devices = (),
) -> None:
    """Make the task's v1 bound cgroups (`bound_cgroups`; a leftover of the name is emptied
    and replaced) and set its bounds there, or in `task_cgroup` under v2. Its user's pids
    cgroup is made when missing, and bounded by `user_pids_max` (all of the user's tasks
    together); its devices cgroup denies `deny` (the GPUs it was not given). Raises OSError;
    what it made is removed first."""
    made: list[str] = []
    try:
        for ctrl, base in bounds.bases:
            parent = user_cgroup(base, uid, user_pids_max) if ctrl == "pids" else base

            def make_parents(ctrl: str = ctrl, base: str = base, parent: str = parent) -> None:
                _make_parents(ctrl, base, parent, user_pids_max)

            path = os.path.join(parent, name)
            _mkdir_in_shared(path, make_parents)
            made.append(path)
            _set_bound(path, ctrl, pids_max, cores, base, deny)
        if task_cgroup is not None:
            parent = os.path.dirname(task_cgroup)
            for ctrl in bounds.in_task_cgroup:
                if ctrl != "devices":
                    _set_bound(task_cgroup, ctrl, pids_max, cores, parent)
                elif deny:
                    deny_devices(task_cgroup, deny)
    except OSError:
        for path in made:
            remove_cgroup(path)
        raise


def _make_parents(ctrl: str, base: str, parent: str, user_pids_max: int) -> None:
    """Make (or complete) the v1 base of `ctrl` and, for pids, the user's cgroup `parent`
    in it, bounded by `user_pids_max`. Every service of the machine shares the base, and one
    that stopped while none of its tasks ran removed it (`release_bounds`): a standby beside a
    leader. Completed even when it is there: another service may have made it and not yet
    filled it, and a task cannot join a cpuset without memory nodes. Raises OSError."""
    _make_v1_base(ctrl, base)
    if parent != base:
        os.makedirs(parent, exist_ok=True)
        _write(os.path.join(parent, "pids.max"), str(user_pids_max))


def container_cgroup_parent(bounds: TaskBounds, uid: int, user_pids_max: int) -> str | None:
    """The `--cgroup-parent` of a container task run as `uid` by a rootful engine with the
    cgroupfs manager: its user's v1 pids cgroup (`user_cgroup`), made and bounded here, as a
    path from the root of the pids hierarchy. The engine makes that path in every v1
    hierarchy and the container's cgroups below it (its own limits stay on those), so the
    user's bound and the one of all tasks count the container's processes as a host task's.
    None without a v1 pids base (cgroup v2: the per-task and all-tasks bounds are on the
    memory base, which a container does not join). Raises OSError."""
    base = next((b for ctrl, b in bounds.bases if ctrl == "pids"), None)
    mount = next((m for m in _mounts() if m.fstype == "cgroup" and "pids" in m.options), None)
    if base is None or mount is None or not base.startswith(mount.point.rstrip("/") + "/"):
        return None
    parent = user_cgroup(base, uid, user_pids_max)
    _in_shared(lambda: _make_parents("pids", base, parent, user_pids_max))
    return "/" + os.path.relpath(parent, mount.point)


def _mkdir_in_shared(path: str, make_parents: Callable[[], None]) -> None:
    """Make the task cgroup `path` (a leftover of its name is emptied and replaced) below
    parents that `make_parents` makes where missing. Every service of the machine shares those
    parents, and one that stops with none of its tasks running removes them (`release_base`,
    `release_bounds`), maybe between our making them and our mkdir: that ENOENT (or ENODEV,
    when the kernel was still taking the parent down as we made a cgroup in it) makes them
    once more. Once the task cgroup is in, the parents are not empty and stay. Several services
    may stop in turn, and each completion of the parents reads their files (a window of its
    own), so a few tries are made, not one. Raises OSError."""

    def make() -> None:
        make_parents()
        if os.path.isdir(path):
            remove_cgroup(path)
        os.mkdir(path)

    _in_shared(make)


def _in_shared(step: Callable[[], None]) -> None:
    """`step`, which makes cgroups in parents every service of the machine shares, tried again
    while it fails with ENOENT or ENODEV: another service stopping removed a parent meanwhile
    (`_mkdir_in_shared`). Raises OSError."""
    for tries_left in reversed(range(SHARED_PARENT_TRIES)):
        try:
            step()
            return
        except OSError as exc:
            if not tries_left or exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise
        time.sleep(0.001)  # the kernel may still be taking the old parent down


def release_bounds(bounds: TaskBounds) -> None:
    """Removes the v1 parents of the bound cgroups when no task cgroup is left in them, and
    what the container engine made for containers in a user's pids cgroup
    (`container_cgroup_parent`) in every hierarchy, when empty."""
    mounts = [m for m in _mounts() if m.fstype in ("cgroup", "cgroup2")]
    for ctrl, base in bounds.bases:
        if ctrl == "pids":  # its users' cgroups first, the empty ones
            pids = next((m for m in mounts if m.fstype == "cgroup" and "pids" in m.options), None)
            with contextlib.suppress(OSError):
                for entry in os.scandir(base):
                    if entry.name.startswith("user-") and entry.is_dir(follow_symlinks=False):
                        if pids is not None and entry.path.startswith(pids.point + "/"):
                            rel = os.path.relpath(entry.path, pids.point)
                            _remove_engine_parents(mounts, rel)
                        with contextlib.suppress(OSError):
                            os.rmdir(entry.path)
        with contextlib.suppress(OSError):
            os.rmdir(base)


def _remove_engine_parents(mounts: list[_Mount], rel: str) -> None:
    """Removes the empty cgroups the engine made at `rel` in each hierarchy for the containers
    placed there: the one its monitors (conmon) share, then `rel` and its parent, the pids
    base's path (the pids ones are the caller's)."""
    for m in mounts:
        paths = [os.path.join(m.point, rel, "conmon")]
        if not (m.fstype == "cgroup" and "pids" in m.options):
            paths += [os.path.join(m.point, rel), os.path.join(m.point, os.path.dirname(rel))]
        for path in paths:
            with contextlib.suppress(OSError):
                os.rmdir(path)

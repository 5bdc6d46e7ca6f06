"""Processes and cgroups as /proc and cgroupfs show them: the helpers the supervisor and the
executor share to identify, signal, measure and kill a task's processes.

A process is identified by its pid and its start time together (`ProcStat.start`), never by
its pid alone: a pid may be reused once its process has ended. Killing helpers never raise
for a process that is already gone or not ours.

It must import only the standard library and stay side-effect free at import: the supervisor
imports it (see `supervisor.py`), running with `-I -S`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

# Without importing typing (start-up time counts): mypy treats this name as always true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MIB = 1 << 20
# How long emptying a cgroup may take before it is left behind (its processes are SIGKILLed).
CGROUP_DRAIN_S = 2.0


class ProcStat:
    """The fields of /proc/PID/stat that identify and group a process."""

    __slots__ = ("pid", "state", "ppid", "pgid", "sid", "start", "rss_pages")

    def __init__(
        self, pid: int, state: str, ppid: int, pgid: int, sid: int, start: int, rss_pages: int
    ) -> None:
        self.pid = pid
        self.state = state
        self.ppid = ppid
        self.pgid = pgid
        self.sid = sid
        self.start = start  # clock ticks since boot: with the pid, a process's identity
        self.rss_pages = rss_pages


def proc_stat(pid: int) -> ProcStat | None:
    """None when the process does not exist (or /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    try:
        return ProcStat(
            pid,
            rest[0].decode(),
            int(rest[1]),
            int(rest[2]),
            int(rest[3]),
            int(rest[19]),
            int(rest[21]),
        )
    except (IndexError, ValueError):
        return None


def user_bits(st: os.stat_result, uid: int, groups: frozenset[int]) -> int:
    """The permission bits (0o4 read, 0o2 write, 0o1 execute or search) `uid` with `groups`
    has on what `st` describes, in the kernel's order: the owner's bits for the owner (even
    when group or others have more), else the group's for a member, else the others'. POSIX
    ACLs are not read."""
    if st.st_uid == uid:
        return (st.st_mode >> 6) & 0o7
    if st.st_gid in groups:
        return (st.st_mode >> 3) & 0o7
    return st.st_mode & 0o7


def start_time(pid: int) -> int | None:
    st = proc_stat(pid)
    return None if st is None else st.start


def is_alive(pid: int, start: int) -> bool:
    """True when `pid` is still the process that started at `start` and has not exited.
    A zombie counts as gone; a pid reused by another process counts as gone."""
    st = proc_stat(pid)
    return st is not None and st.start == start and st.state not in ("Z", "X")


def all_procs() -> list[ProcStat]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out.append(st)
    return out


def kill_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def killpg_quietly(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def cgroup_pids(cgroup: str) -> list[int]:
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except (FileNotFoundError, ValueError):
        return []


def signal_cgroup(cgroup: str, sig: int, skip_group: int = 0) -> None:
    """Signals every process of the cgroup, except those of process group `skip_group` (already
    signalled through it: a second SIGTERM can reach a task's handler twice). Under v2, SIGKILL
    goes through `cgroup.kill`, which cannot miss a process forked meanwhile."""
    if sig == signal.SIGKILL:
        try:
            with open(os.path.join(cgroup, "cgroup.kill"), "w", encoding="ascii") as f:
                f.write("1")
        except OSError:
            pass
    for pid in cgroup_pids(cgroup):
        if skip_group > 0:
            st = proc_stat(pid)
            if st is not None and st.pgid == skip_group:
                continue
        kill_quietly(pid, sig)


def remove_task_cgroups(launch: dict[str, Any]) -> None:
    """`remove_cgroup` for each cgroup a task's launch document names."""
    for cgroup in [launch.get("cgroup"), *launch.get("bound_cgroups", ())]:
        remove_cgroup(cgroup)


def remove_cgroup(cgroup: str | None, drain_s: float = CGROUP_DRAIN_S) -> None:
    """Kills whatever is left in the cgroup, waits for it to empty, and removes it. Idempotent;
    a cgroup that will not empty is left behind (rmdir fails) rather than waited on forever.
    An rmdir refused as busy is tried again until `drain_s` has passed: a killed process can
    be gone from the cgroup's list and still hold it while it exits (under load, a while)."""
    if not cgroup or not os.path.isdir(cgroup):
        return
    deadline = time.monotonic() + drain_s
    while True:
        if cgroup_pids(cgroup):
            signal_cgroup(cgroup, signal.SIGKILL)
        else:
            try:
                os.rmdir(cgroup)
                return
            except OSError as e:
                if e.errno != errno.EBUSY:
                    return  # gone already, or not ours to remove
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)
            return
        time.sleep(0.005)


def oom_kills(cgroup: str | None) -> int:
    """How many processes the kernel OOM-killed in the cgroup: v2 `memory.events` or v1
    `memory.oom_control` (kernels >= 4.13), both with an `oom_kill N` line."""
    if not cgroup:
        return 0
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(cgroup, name), encoding="ascii") as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        except (FileNotFoundError, ValueError):
            continue
    return 0


def kill_leftovers(
    *,
    sup_pid: int | None,
    sup_start: int | None,
    child_pid: int | None,
    child_start: int | None,
    cgroup: str | None,
    skip: int | None = None,
) -> None:
    """SIGKILLs every process of a task: its cgroup's, those of the supervisor's session (the
    task's processes that kept it) and those of the child's process group. Identity is checked
    against pid reuse: a session or group member must have started no earlier than its leader,
    and the supervisor's session is not touched when its pid now names another process."""
    if cgroup:
        signal_cgroup(cgroup, signal.SIGKILL)
    me = os.getpid()
    sup_reused = False
    if sup_pid is not None:
        st = proc_stat(sup_pid)
        sup_reused = st is not None and st.start != sup_start
    for p in all_procs():
        if p.pid in (me, 1, skip):
            continue
        in_session = (
            sup_pid is not None
            and sup_start is not None
            and not sup_reused
            and p.sid == sup_pid
            and p.start >= sup_start
        )
        in_group = (
            child_pid is not None
            and child_start is not None
            and p.pgid == child_pid
            and p.start >= child_start
        )
        if in_session or in_group:
            kill_quietly(p.pid, signal.SIGKILL)


# prctl(2): this process becomes the parent of its descendants orphaned (Linux 3.4+).
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the one its orphaned descendants are given to, instead of init: a
    task's process that leaves its group and session (setsid, a double fork) stays under the
    supervisor, where it is measured and killed with the task, even with no cgroup to hold it.
    False where the kernel refuses it."""
    import ctypes  # here: only a supervisor of a host task needs it, and it costs at import

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[ProcStat]:
    """Every process under `pid` in the process tree (not `pid` itself)."""
    children: dict[int, list[ProcStat]] = {}
    for p in all_procs():
        children.setdefault(p.ppid, []).append(p)
    out: list[ProcStat] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child.pid)
    return out


# File systems whose files are memory: a file of theirs that no name reaches any more holds its
# memory for as long as a process holds the file open or mapped.
MEMORY_FS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})
DELETED = " (deleted)"


def tree_memory_bytes(pid: int) -> int:
    """The memory every process under `pid` holds: its resident memory, plus the files of
    memory it holds that no name reaches (memfds, deleted files of a tmpfs: an rlimit does not
    bound them and RSS shows only what of them is mapped), each file once (by device and
    inode) however many processes hold it, and what of it they map not counted twice. A file
    of a tmpfs that still has a name is not counted: it is not the task's alone."""
    files: dict[tuple[int, int], int] = {}  # (device, inode) -> bytes it holds
    total = 0
    for p in descendants(pid):
        total += p.rss_pages * os.sysconf("SC_PAGE_SIZE")
        memory_devs = _memory_devices(p.pid)
        _held_files(p.pid, memory_devs, files)
        total -= _mapped_files(p.pid, memory_devs, files)
    return max(0, total + sum(files.values()))


def _memory_devices(pid: int) -> frozenset[int]:
    """The devices of the memory file systems mounted where `pid` sees them (its own mount
    namespace: a private /dev/shm is one)."""
    devs = set()
    try:
        with open(f"/proc/{pid}/mountinfo", "rb") as f:
            for line in f:
                fields = line.split()
                fstype = fields[fields.index(b"-") + 1].decode()
                if fstype in MEMORY_FS:
                    major, minor = fields[2].split(b":")
                    devs.add(os.makedev(int(major), int(minor)))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(devs)


def _may_be_unnamed(target: str) -> bool:
    """Whether a file that /proc names `target` may be memory no name reaches (a memfd, or a
    deleted file): read cheaply, before its device is known."""
    return target.startswith("/memfd:") or target.endswith(DELETED)


def _is_unnamed_memory(target: str, dev: int, memory_devs: frozenset[int]) -> bool:
    """Whether a file that /proc names `target` is memory no name reaches."""
    return target.startswith("/memfd:") or (target.endswith(DELETED) and dev in memory_devs)


def _held_files(pid: int, memory_devs: frozenset[int], files: dict[tuple[int, int], int]) -> None:
    """Add to `files` the unnamed memory files `pid` holds open."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return
    for fd in fds:
        path = os.path.join(fd_dir, fd)
        try:
            target = os.readlink(path)
            if not _may_be_unnamed(target):
                continue  # most of them: no stat
            st = os.stat(path)
        except OSError:
            continue  # closed meanwhile
        if _is_unnamed_memory(target, st.st_dev, memory_devs):
            files[(st.st_dev, st.st_ino)] = st.st_blocks * 512  # what it holds, holes aside


def _mapped_files(pid: int, memory_devs: frozenset[int], files: dict[tuple[int, int], int]) -> int:
    """Add to `files` the unnamed memory files `pid` maps (kept after their fd is closed), and
    return how much of its RSS their mappings are, counted already with the files. A mapped
    file whose size cannot be read (map_files is root's) stays counted by its RSS alone."""
    mapped: dict[tuple[int, int], list[str]] = {}  # file -> its mappings' address ranges
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) < 6 or not _may_be_unnamed(fields[5]):
                    continue
                major, minor = fields[3].split(":")
                dev = os.makedev(int(major, 16), int(minor, 16))
                if _is_unnamed_memory(fields[5], dev, memory_devs):
                    mapped.setdefault((dev, int(fields[4])), []).append(fields[0])
    except (OSError, ValueError):
        return 0
    if not mapped:
        return 0
    for key, ranges in mapped.items():
        if key not in files:
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/{pid}/map_files/{ranges[0]}")
                files[key] = st.st_blocks * 512
    counted = {r for key, ranges in mapped.items() if key in files for r in ranges}
    return _rss_of(pid, counted)


def _rss_of(pid: int, ranges: set[str]) -> int:
    """The resident bytes of `pid`'s mappings at `ranges` (as /proc/PID/maps writes them)."""
    total = 0
    inside = False
    try:
        with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                head = line.split(maxsplit=1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    inside = head in ranges
                elif inside and head == "Rss:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return total


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def describe_code(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code} ({signal_name(-code)})"
    return f"exited with code {code}"

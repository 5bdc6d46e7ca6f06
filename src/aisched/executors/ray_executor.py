"""The Ray executor: each task runs on the Ray node the core chose, as a process started by
that node's agent.

aisched's core decides placement; this executor carries it out exactly, as Ray's own guidance
for gang scheduling has it: the tasks launched together (a gang) reserve their resources in
Ray through ONE placement group, a bundle per task with exactly its CPUs, GPUs and memory,
each bundle held to the task's node by a label selector on `ray.io/node-id`. So Ray's
accounting agrees with aisched's, and nothing else Ray schedules can take what a task holds.
The processes are started by a long-lived agent per node (`NodeAgent`, `ray_agent.py`: one
detached, named actor pinned to its node by `NodeAffinitySchedulingStrategy(soft=False)`,
started when the node is first seen), which waits until the gang's reservation is in place
and then starts the command (`TaskRunner`, `ray_task.py`) with the DESIGN.md environment (its
GPU indices in CUDA_VISIBLE_DEVICES, MASTER_ADDR the address of rank 0's node), pinned to the
cores it chose. Starting a gang is one placement group and one call per task: no Ray worker
process is started for it. The reservation goes back to Ray when the gang's last task ended
(a placement group cannot give back one bundle, so when a task ends before its gang-mates,
the rest are re-reserved in a new group of their bundles: the old one is removed first, since
the new one needs its room). A group is removed only once Ray has placed it (`ray_groups.py`:
Ray leaks what it prepared for a group removed while being placed).

Tasks sharing a GPU (`gpu_milli` < 1000) reserve that share of one GPU in Ray (fractional
`num_gpus`) and get the index the core chose in CUDA_VISIBLE_DEVICES, never the device Ray picked
for the share. The GPU-memory watchdog runs on each task's node, in its actor (`ray_task.py`);
the watcher thread fetches its readings every `gpu_check_s` and writes what it reports in the
scheduler's log, as the local executor does.

Threads: the service's loop thread calls the protocol; one watcher thread waits on the actors'
results (`ray.wait`) and refreshes the node list from `ray.nodes()` every `refresh_s`, waking
the loop when a task ends or a node joins or leaves.

Invariants:
- `launch` returns once Ray has accepted the actor; it does not wait for Ray to start it. A
  task that Ray does not start within `start_timeout_s` (or whose node dies first) ends LOST
  with "could not start", and the loop rolls the whole gang back.
- every launched or adopted task yields exactly one `TaskExited`; an actor whose node died is
  LOST ("its Ray node ... left the cluster"), which the loop turns into a failed attempt that
  is restarted per the job's restart policy, on healthy nodes.
- tasks outlive the scheduler (their agents are detached actors in a namespace derived from
  the data directory, their placement groups detached): a restarted `aisched up --ray` adopts
  them through their agent, by name. A placement group of ours that no task claims any more
  (every task of it ended while no scheduler watched) is removed by a sweep.
- a task is LOST only when neither its agent nor its exit record (`ray_task.exit_record_path`,
  written on its node once it ended) says how it ended: one that ended is never run again.
  A task killed by SIGKILL from outside is the exception: Ray kills an agent's children as
  its worker exits, so such an end counts only once the agent has answered again (alive);
  with the agent dead it is LOST with the agent, as its node's loss and not the task's own.
- the service outlives an outage of the GCS: the driver in this process is kept from
  terminating (`connect`), the GCS is probed before the calls that would wait on it, and
  while it does not answer `unavailable` says why (the loop holds new launches, readiness
  reports it) and the tasks are watched through their agents alone.

Importing this module imports Ray; nothing else in aisched does, so Ray stays optional.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray._raylet import PlacementGroupID
from ray.exceptions import ActorUnavailableError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from aisched.executors.base import (
    AdoptState,
    ExecutorInfo,
    ExitKind,
    LaunchError,
    TaskExited,
    TaskHandle,
    TaskKey,
    TaskLaunch,
    exit_from_record,
)
from aisched.executors.container import DEFAULT_PIDS_LIMIT
from aisched.executors.gpu_watchdog import GPU_CHECK_INTERVAL_S, TaskGpuMemory
from aisched.executors.ray_agent import NodeAgent
from aisched.executors.ray_groups import GroupRemovals, reserve
from aisched.executors.ray_nodes import RayNode, nodes_from_ray
from aisched.executors.ray_task import MakeWatchdog, exit_record_path, recorded_exit
from aisched.executors.task_files import not_theirs_alone
from aisched.executors.task_log import LOG_MAX_BYTES, LOG_MAX_FILES
from aisched.model.cluster import Node
from aisched.model.job import ContainerSpec
from aisched.model.numerals import is_decimal

log = logging.getLogger(__name__)

MIB = 1 << 20
# An agent's calls in flight at once (coroutines of its event loop, not threads): per task a
# start (waiting for its reservation) or a wait, and the short stop, status and GPU-memory
# calls (Ray queues those past it). Not a cap in practice: a task holds about two at once,
# and a node runs out of pids (a process and two threads of its agent per task) well before
# 5000 tasks. Coroutines cost no thread each, so it need not be small.
AGENT_CALLS = 10_000
# Placement groups of ours that no task claims are removed at the second sweep that finds
# them (the first may see one between its creation and its tasks' registration).
SWEEP_S = 10.0
WAIT_SLICE_S = 0.2
# An actor Ray calls "temporarily unavailable" (its node missed heartbeats, or a network blip)
# is asked again this often, until Ray either reaches it or declares its node dead.
UNAVAILABLE_RETRY_S = 1.0
CONNECT_PROBE_S = 5.0
# How long the watcher waits for the GCS to accept a connection before it calls Ray unreachable.
GCS_PROBE_S = 1.0
# How long this process's Ray driver keeps trying to reach a GCS that went away before Ray
# terminates the whole process (Ray's default: 60 s). The service must outlive an outage of
# the GCS: a year, in effect never.
GCS_RECONNECT_TIMEOUT_S = 365 * 24 * 3600
GCS_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"  # Ray's own spelling

_RemoteAgent: Any = ray.remote(NodeAgent)
# Ray's stubs type get() by its argument; our references are untyped actor-call results.
_get: Callable[..., Any] = ray.get


class RayConnectError(RuntimeError):
    """The Ray cluster cannot be reached; the message says which address and why."""


@dataclass(slots=True)
class _Tracked:
    key: TaskKey
    node: str
    agent: Any  # the node's NodeAgent
    start_ref: Any | None  # pending until the process exists
    wait_ref: Any | None = None
    launched_at: float = 0.0
    grace_period_s: float = 0.0
    retry_at: float = 0.0  # while unavailable: when to ask the agent again
    gpus: tuple[int, ...] = ()
    node_id: str = ""
    start_args: tuple[Any, ...] = ()  # what `start` is (re)sent with: spec, watchdog, group
    stopping: bool = False  # a stop was asked: it ends soon, its gang is not re-reserved
    exit_record: str = ""  # where its runner records its end (see ray_task.exit_record_path)
    launch_id: str = ""  # this launch's id, in its exit record
    # Its end, when that says SIGKILL from outside aisched, until its agent answers again
    # (`_on_ready`).
    unconfirmed: dict[str, Any] | None = None


@dataclass(slots=True)
class _Gang:
    group: PlacementGroup
    keys: set[TaskKey] = field(default_factory=set)
    name: str = ""
    # Each task's bundle and node id, to re-reserve the rest when one ends first (unknown,
    # so not done, for a gang adopted after a restart).
    bundles: dict[TaskKey, tuple[dict[str, float], str]] = field(default_factory=dict)


def namespace_for(data_dir: str) -> str:
    """The Ray namespace of one aisched service: stable across its restarts (adoption finds
    its actors), different for two services sharing a cluster (job ids repeat)."""
    return "aisched-" + hashlib.sha256(data_dir.encode()).hexdigest()[:12]


def agent_name(node_id: str) -> str:
    """The name of the agent of the Ray node `node_id` (hex), in the service's namespace."""
    return f"agent-{node_id}"


def connect(address: str) -> None:
    """Connect this process to the Ray cluster at `address` (`host:port` of its head, or
    `auto` for the one started on this machine). Raises RayConnectError with the reason."""
    if ray.is_initialized():
        return
    if address != "auto":
        _probe(address)
    # Read by Ray's C++ core when it starts in this process (set over whatever the environment
    # said: the service never dies of an outage of the GCS; see RayExecutor.unavailable).
    os.environ[GCS_RECONNECT_ENV] = str(GCS_RECONNECT_TIMEOUT_S)
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayConnectError(f"cannot connect to the Ray cluster at {address}: {e}") from None


def writable_by_all(path: str) -> bool:
    """Whether every local user may rename or remove what is in directory `path` (others may
    write it, and no sticky bit keeps them to their own files)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IWOTH) and not mode & stat.S_ISVTX


def sealed_above(path: str) -> bool:
    """Whether a directory above `path` shuts every other local user out: one of this
    process's user (or root's) that grants no search to group or others, reached through
    directories no one else can change. What is inside is then out of their reach, whatever
    its own mode: Ray's 0777 temporary directory inside such a one, as docs/ray.md says."""
    uid = os.geteuid()
    above = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            st = os.stat(above)
        except OSError:
            return False
        closed = st.st_uid in (0, uid) and not st.st_mode & (stat.S_IXGRP | stat.S_IXOTH)
        if closed and not_theirs_alone(above, uid) is None:
            return True
        if above == "/":
            return False
        above = os.path.dirname(above)


def _open_temp_dir_note() -> str | None:
    """A warning when Ray's files on this machine (its temporary directory: sockets, session
    files, logs) may be changed by every local user, as Ray makes /tmp/ray (0777): one could
    replace a socket of root's workers, or read their logs (docs/ray.md)."""
    try:  # Ray's own record of where it put them (no public API says)
        from ray._private import worker

        node: Any = worker._global_node
        temp = os.path.dirname(node.get_session_dir_path())
    except Exception:  # another Ray version: say nothing rather than guess
        return None
    if not writable_by_all(temp) or sealed_above(temp):
        return None
    return (
        f"Ray's files at {temp} may be changed by every local user (mode "
        f"{stat.S_IMODE(os.stat(temp).st_mode):o}): start Ray with --temp-dir inside a "
        "directory of root's alone on every node (docs/ray.md)"
    )


def _probe(address: str) -> None:
    """Fail fast and clearly on an address nobody answers (ray.init would retry for long)."""
    host, sep, port = address.rpartition(":")
    if address.startswith("ray://"):
        raise RayConnectError(
            f"{address}: Ray Client addresses are not supported; give the head's GCS "
            "address HOST:PORT (port 6379 by default) from a machine of the cluster"
        )
    if not sep or not is_decimal(port) or not host:
        raise RayConnectError(
            f"{address!r} is not a Ray address: give HOST:PORT of the head node, or auto"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_PROBE_S) as sock:
            answer = _http2_answer(sock)
    except OSError as e:
        raise RayConnectError(
            f"cannot reach the Ray cluster at {address}: {e.strerror or e} "
            "(is `ray start --head` running there?)"
        ) from None
    # The GCS is a gRPC server: it answers an HTTP/2 client's preface with its settings. Once
    # connected, ray.init waits for it for as long as an outage may last (a year): a stopped
    # GCS, or another program on the port, hung `aisched up` without a word.
    if answer is None:
        raise RayConnectError(
            f"the Ray cluster at {address} does not answer within {CONNECT_PROBE_S:g} s (is "
            "its GCS stopped, or the machine overloaded?)"
        )
    if not answer:
        raise RayConnectError(
            f"{address} answers, but not as a Ray head's GCS (a gRPC server): give the "
            "head's GCS port (6379 by default)"
        )


# An HTTP/2 client's first bytes: its preface and an empty SETTINGS frame.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _http2_answer(sock: socket.socket) -> bool | None:
    """Whether the server on `sock` answers an HTTP/2 client as one (its first frame is its
    SETTINGS); None when it says nothing within the socket's time-out."""
    sock.sendall(_HTTP2_HELLO)
    head = b""
    try:
        while len(head) < 9 and (more := sock.recv(9 - len(head))):
            head += more
    except TimeoutError:
        return None
    return len(head) == 9 and head[3] == 4  # the frame's type: SETTINGS


class RayExecutor:
    """Runs tasks on a Ray cluster (see the module docstring). The caller connects first
    (`connect`); `namespace` keeps this service's actors apart from other services'.
    `gpu_watchdog` makes, on each task's node, the watchdog of a GPU task's memory
    (`functools.partial(GpuMemoryWatchdog.with_nvml, action)`; picklable, it travels with the
    task); None: GPU memory is not watched. `gpu_check_s`: how often it looks."""

    def __init__(
        self,
        namespace: str,
        *,
        refresh_s: float = 1.0,
        start_timeout_s: float = 60.0,
        gpu_watchdog: MakeWatchdog | None = None,
        gpu_check_s: float = GPU_CHECK_INTERVAL_S,
        log_max_bytes: int = LOG_MAX_BYTES,
        log_max_files: int = LOG_MAX_FILES,
        memory_limit: str = "auto",
        task_pids_limit: int = DEFAULT_PIDS_LIMIT,
        user_pids_limit: int = 4 * DEFAULT_PIDS_LIMIT,
        shm_max_mib: int = 0,
    ) -> None:
        if not ray.is_initialized():
            raise RayConnectError("not connected to a Ray cluster (call connect first)")
        self._namespace = namespace
        self._refresh_s = refresh_s
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._tracked: dict[TaskKey, _Tracked] = {}
        self._gpu_watchdog = gpu_watchdog
        self._gpu_check_s = gpu_check_s
        self._log_cap = (log_max_bytes, log_max_files)  # each task's log, on its node
        self._memory_limit = memory_limit  # the mechanism each node's agent uses
        self._pids_limits = (task_pids_limit, user_pids_limit)
        self._shm_max_mib = shm_max_mib  # a user's host task's private /dev/shm, at most
        self._next_gpu_check = 0.0
        self._gpu_refs: dict[Any, tuple[TaskKey, str]] = {}  # pending gpu_memory calls
        self._gpu_usage: dict[TaskKey, TaskGpuMemory] = {}
        self._gpu_states: dict[str, str] = {}  # node -> the watchdog's state there
        self._events: list[TaskExited] = []
        self._wakeup: Callable[[], None] | None = None
        self._closed = threading.Event()
        self._ray_nodes: dict[str, RayNode] = {}
        self._nodes: tuple[Node, ...] = ()
        self._agents: dict[str, Any] = {}  # Ray node id -> its agent's handle
        self._gangs: dict[str, _Gang] = {}  # placement group id (hex) -> its tasks
        self._unclaimed: set[str] = set()  # our groups the last sweep found no task of
        self._removals = GroupRemovals()  # groups removed once Ray has placed them
        self._reserve_lock = threading.Lock()  # one gang's groups changed by one thread
        # Task -> its gang's group id now (re-reserving moves the rest to a new group).
        self._gang_of: dict[TaskKey, str] = {}
        self._next_sweep = time.monotonic() + SWEEP_S
        # The GCS this driver is connected to, and its session: a GCS that went away is
        # probed (a TCP connect) before any call that would block on it, and one that comes
        # back is believed only with the same session (a new cluster crashes Ray's driver).
        self._gcs_address = str(ray.get_runtime_context().gcs_address)
        self._session = _session_here()
        self.temp_note = _open_temp_dir_note()  # read once: Ray made it before we came
        self._unreachable: str | None = None  # why new launches are held, while they are
        self._replaced = False  # the cluster came back as a new one: never usable again
        self._refresh_nodes()
        self._next_refresh = time.monotonic() + refresh_s
        self._thread = threading.Thread(target=self._watch, name="aisched-ray", daemon=True)
        self._thread.start()

    # --- the protocol ----------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why no task can be started now (the GCS is unreachable), or None (`Availability`)."""
        return self._unreachable

    def info(self) -> ExecutorInfo:
        notes = [
            f"Ray cluster: {len(self._nodes)} node(s), namespace {self._namespace}",
            *([self._unreachable] if self._unreachable else []),
            *([self.temp_note] if self.temp_note else []),
            "memory, processes and cores bounded on each task's node by its cgroups where the "
            "node has them, else memory by RLIMIT_DATA (the task's log says which)",
            "each gang reserves through one placement group; each node's agent starts its "
            "tasks, pinned to the cores it chose there",
        ]
        if self._gpu_watchdog is None:
            notes.append("GPU-memory watchdog off")
        else:
            notes.append("GPU-memory watchdog on each GPU task's node (NVML where present)")
            with self._lock:
                states = sorted(self._gpu_states.items())
            notes += [f"GPU-memory watchdog on {node}: {state}" for node, state in states]
        return ExecutorInfo(
            name="ray", memory_limit="node cgroups", cpu_affinity=True, notes=tuple(notes)
        )

    def nodes(self) -> Sequence[Node]:
        return self._nodes

    def node_address(self, node: str) -> str | None:
        """The IP of `node` (MASTER_ADDR for a gang whose rank 0 runs there)."""
        rn = self._ray_nodes.get(node)
        return None if rn is None else rn.address

    def launch(self, req: TaskLaunch) -> TaskHandle:
        got = self.launch_gang([req])[0]
        if isinstance(got, LaunchError):
            raise got
        return got

    def launch_gang(self, reqs: Sequence[TaskLaunch]) -> list[TaskHandle | LaunchError]:
        """Start the tasks of one gang (see the module docstring): all of them, or, when one
        is refused, none (every answer is then a LaunchError, the refused one's first)."""
        self._refresh_if_overdue()
        refusals = [self._refusal(r) for r in reqs]
        if first := next((why for why in refusals if why is not None), None):
            return [
                LaunchError(why or f"task {_show(r.key)}: not started: {first}")
                for r, why in zip(reqs, refusals, strict=True)
            ]
        placed = [self._ray_nodes[r.node] for r in reqs]
        bundles, node_ids, owners = [], [], []
        for r, rn in zip(reqs, placed, strict=True):
            bundle = _bundle(r)
            if bundle:
                bundles.append(bundle)
                node_ids.append(rn.node_id)
                owners.append(r.key)
        group: PlacementGroup | None = None
        gang_id: str | None = None
        job_id, attempt, task = reqs[0].key
        name = f"{self._namespace}:{job_id}:{attempt}:{task}"
        if bundles:
            try:
                group = reserve(name, bundles, node_ids)
            except (ValueError, TypeError) as e:
                return [LaunchError(f"task {_show(r.key)}: Ray refused it: {e}") for r in reqs]
            gang_id = group.id.hex()
            held = dict(zip(owners, zip(bundles, node_ids, strict=True), strict=True))
            with self._lock:
                self._gangs[gang_id] = _Gang(group, set(owners), name, held)
                self._gang_of.update(dict.fromkeys(owners, gang_id))
        out: list[TaskHandle | LaunchError] = []
        for r, rn in zip(reqs, placed, strict=True):
            mine = group if r.key in owners else None
            out.append(self._start_on_agent(r, rn, mine, gang_id, name))
        return out

    def _refresh_if_overdue(self) -> None:
        """Re-reads Ray's node table now when the watcher's look at it is a whole period
        late (this process was stopped, or the watcher held up): a node replaced meanwhile is
        started on under its new Ray id, not the dead one's (whose agent died with it)."""
        if time.monotonic() < self._next_refresh + self._refresh_s or self._unreachable:
            return
        self._next_refresh = time.monotonic() + self._refresh_s
        if self._check_gcs() and self._refresh_nodes() and self._wakeup is not None:
            self._wakeup()

    def _refusal(self, req: TaskLaunch) -> str | None:
        """Why `req` cannot be launched here, or None."""
        key = req.key
        if self._closed.is_set():
            return f"task {_show(key)}: the executor is closed"
        if (why := self._unreachable) is not None:
            return f"task {_show(key)}: not started: {why}"
        rn = self._ray_nodes.get(req.node)
        if rn is None:
            return f"task {_show(key)}: node {req.node!r} is not in the Ray cluster"
        if not req.command or not req.command[0]:
            return f"task {_show(key)}: command: empty"
        with self._lock:
            if key in self._tracked:
                return f"task {_show(key)} is already running"
        known = {g.index for g in rn.node.gpus}
        if missing := [g for g in req.gpus if g not in known]:
            return f"task {_show(key)}: gpus: {missing} not on node {req.node!r}"
        return None

    def _start_on_agent(
        self,
        req: TaskLaunch,
        rn: RayNode,
        group: PlacementGroup | None,
        gang_id: str | None,
        gang_name: str,
    ) -> TaskHandle:
        key = req.key
        agent = self._agent(rn.node_id)
        launch_id = uuid.uuid4().hex
        spec = {
            **_spec(req, self._gpu_check_s, req.container, self._namespace),
            "log_max_bytes": self._log_cap[0],
            "log_max_files": self._log_cap[1],
            "launch": launch_id,
            # A host task's bounds on its node (ray_limits), as the local executor's.
            "memory_limit": self._memory_limit,
            "task_pids_limit": self._pids_limits[0],
            "user_pids_limit": self._pids_limits[1],
            "shm_max_mib": self._shm_max_mib,
        }
        record = exit_record_path(req.log_path)
        start_args = (spec, self._gpu_watchdog, group)
        start_ref = agent.start.remote(list(key), *start_args)
        with self._lock:
            self._tracked[key] = _Tracked(
                key,
                req.node,
                agent,
                start_ref,
                None,
                time.monotonic(),
                req.grace_period_s,
                gpus=tuple(req.gpus),
                node_id=rn.node_id,
                start_args=start_args,
                exit_record=record,
                launch_id=launch_id,
            )
        return TaskHandle(
            key=key,
            node=req.node,
            data={
                "agent": agent_name(rn.node_id),
                "namespace": self._namespace,
                "node_id": rn.node_id,
                "placement_group": gang_id if group is not None else None,
                "placement_group_name": gang_name if group is not None else None,
                "gpu_share": _gpu_share(req),
                "gpus": list(req.gpus),
                "exit_record": record,
                "launch": launch_id,
            },
        )

    def _agent(self, node_id: str) -> Any:
        """The agent of Ray node `node_id`: the one started before (by us, or by an earlier
        scheduler on this data directory), else a new one."""
        with self._lock:
            agent = self._agents.get(node_id)
        if agent is None:
            agent = _RemoteAgent.options(
                name=agent_name(node_id),
                namespace=self._namespace,
                get_if_exists=True,
                lifetime="detached",
                max_restarts=0,
                max_concurrency=AGENT_CALLS,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            with self._lock:
                agent = self._agents.setdefault(node_id, agent)
        return agent

    def stop(self, key: TaskKey, grace_period_s: float | None = None) -> None:
        with self._lock:
            t = self._tracked.get(key)
            if t is None:
                return
            t.stopping = True
            not_started = t.start_ref is not None
        if not_started:  # Ray may not even have placed it: removing the actor is the stop
            self._end(t, TaskExited(key, ExitKind.STOPPED, None, "stopped before it started"))
            if self._wakeup is not None:
                self._wakeup()
            return
        grace = t.grace_period_s if grace_period_s is None else grace_period_s
        try:
            t.agent.stop.remote(list(key), grace)
        except Exception as e:  # the agent is gone: its wait() reports that
            log.debug("stop %s: %s", key, e)

    def poll(self) -> list[TaskExited]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def gpu_memory(self) -> list[TaskGpuMemory]:
        """The last GPU-memory reading of every running task whose node's watchdog is active,
        as fetched by the watcher thread (at most `gpu_check_s` old), by task key."""
        with self._lock:
            return [self._gpu_usage[k] for k in sorted(self._gpu_usage) if k in self._tracked]

    def adopt(self, handle: TaskHandle) -> tuple[AdoptState, TaskExited | None]:
        """As the protocol says; a task its agent cannot account for (the agent is gone, or
        is a new one) is looked for in its exit record first, and is LOST only without one:
        a task that ended while no agent remembered it is never run again."""
        key = handle.key
        with self._lock:
            if key in self._tracked:
                return AdoptState.RUNNING, None
        state, ended = self._adopt(handle)
        if state == AdoptState.LOST and (recorded := self._recorded(handle)) is not None:
            return AdoptState.EXITED, recorded
        return state, ended

    def _recorded(self, handle: TaskHandle) -> TaskExited | None:
        """The end of the task of `handle` from its exit record, if it wrote one."""
        data = handle.data
        path = data.get("exit_record") or (
            exit_record_path(str(data["log_path"])) if data.get("log_path") else None
        )
        if not path:
            return None
        rec = recorded_exit(str(path), handle.key, str(data.get("launch") or "") or None)
        return None if rec is None else exit_from_record(handle.key, rec)

    def _adopt(self, handle: TaskHandle) -> tuple[AdoptState, TaskExited | None]:
        key = handle.key
        node_id = str(handle.data.get("node_id") or "")
        if not node_id and (rn := self._ray_nodes.get(handle.node)) is not None:
            # A launch committed without a handle: the agent of the node it was bound to gives
            # it up, so a deposed leader that makes that launch late cannot start it there.
            node_id = rn.node_id
        if "actor" in handle.data and "agent" not in handle.data:
            # Started by an older aisched, as an actor of its own: stopped, never left running
            # beside a retry.
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(str(handle.data["actor"]), namespace=self._namespace))
            why = "it was started by an older aisched (one Ray actor per task): stopped"
            return AdoptState.LOST, _lost(key, why)
        try:
            agent = ray.get_actor(agent_name(node_id), namespace=self._namespace)
        except ValueError:
            why = "its node's Ray agent is gone (its node left the cluster?)"
            return AdoptState.LOST, _lost(key, why)
        try:
            started: dict[str, Any] = _get(
                agent.start.remote(list(key), None), timeout=self._start_timeout_s
            )
            if started.get("unknown"):
                return AdoptState.LOST, _lost(key, "its node's Ray agent does not know it")
            result = started.get("exit") or _get(agent.status.remote(list(key)), timeout=30)
        except Exception as e:
            agent.forget.remote(list(key))
            return AdoptState.LOST, _lost(key, f"its node's Ray agent cannot be reached: {_why(e)}")
        if result is not None:
            agent.forget.remote(list(key))
            return AdoptState.EXITED, exit_from_record(key, result)
        gang_id = _current_group(
            handle.data.get("placement_group"), handle.data.get("placement_group_name")
        )
        with self._lock:
            self._agents.setdefault(node_id, agent)
            if isinstance(gang_id, str):
                gang = self._gangs.get(gang_id)
                if gang is None:
                    group = PlacementGroup(PlacementGroupID.from_hex(gang_id))
                    name = str(handle.data.get("placement_group_name") or "")
                    gang = self._gangs[gang_id] = _Gang(group, name=name)
                gang.keys.add(key)
                self._gang_of[key] = gang_id
            self._tracked[key] = _Tracked(
                key,
                handle.node,
                agent,
                None,
                agent.wait.remote(list(key)),
                time.monotonic(),
                gpus=tuple(int(g) for g in handle.data.get("gpus") or ()),
                node_id=node_id,
                exit_record=str(handle.data.get("exit_record") or ""),
                launch_id=str(handle.data.get("launch") or ""),
            )
        return AdoptState.RUNNING, None

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup

    def close(self) -> None:
        """Stop watching; the tasks keep running as detached actors, adopted at next start."""
        self._closed.set()
        self._thread.join(timeout=5.0)
        if self._unreachable is None:
            self._removals.drain()  # else the next scheduler's sweep removes them

    # --- watching ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closed.is_set():
            try:
                self._watch_once()
            except Exception:  # the watcher must outlive any one task's trouble
                log.exception("ray watcher")
                self._closed.wait(WAIT_SLICE_S)

    def _watch_once(self) -> None:
        now = time.monotonic()
        with self._lock:
            by_ref = {}
            for t in self._tracked.values():
                if t.retry_at > now:
                    continue
                if t.retry_at:
                    t.retry_at = 0.0
                    if t.start_ref is not None:
                        t.start_ref = t.agent.start.remote(list(t.key), *t.start_args)
                    else:
                        t.wait_ref = t.agent.wait.remote(list(t.key))
                ref = t.start_ref if t.start_ref is not None else t.wait_ref
                if ref is not None:
                    by_ref[ref] = t
        if by_ref:
            refs = list(by_ref)
            ready, _ = ray.wait(refs, num_returns=1, timeout=WAIT_SLICE_S)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            changed = False
            for ref in ready:
                changed |= self._on_ready(by_ref[ref], ref)
            changed |= self._start_timeouts()
        else:
            self._closed.wait(WAIT_SLICE_S)
            changed = False
        if self._gpu_watchdog is not None:
            self._check_gpu_memory()
        if time.monotonic() >= self._next_refresh:
            self._next_refresh = time.monotonic() + self._refresh_s
            before = self._unreachable
            if self._check_gcs():
                changed |= self._refresh_nodes()
            changed |= self._unreachable != before
        if self._unreachable is None:
            self._removals.step()
        if time.monotonic() >= self._next_sweep and self._unreachable is None:
            self._next_sweep = time.monotonic() + SWEEP_S
            self._sweep_groups()
        if changed and self._wakeup is not None:
            self._wakeup()

    def _check_gcs(self) -> bool:
        """Whether Ray's GCS can be called now. Calls into Ray that need the GCS (the node
        table, placement groups) block while it is down, and the driver in this process is
        kept from terminating then (see `connect`); so it is probed first, and while it does
        not answer, `unavailable` says why: new launches are held, groups are left as they
        are, and the tasks are watched through their agents, which need no GCS."""
        addr = self._gcs_address
        why = _gcs_refusal(addr)
        if why is None and self._unreachable is not None and not self._replaced:
            session = _session_at(addr)
            if session is None:
                why = "it accepts connections but does not answer yet"
            elif self._session and session != self._session:
                self._replaced = True
        if self._replaced:
            why = (
                "it came back as a new Ray cluster (its GCS lost its state): this service "
                "cannot use it; restart aisched, which accounts for every task from its agent "
                "or its exit record"
            )
        with self._lock:
            was = self._unreachable
            if why is None:
                self._unreachable = None
            elif was is None:
                since = time.strftime("%H:%M:%S")
                self._unreachable = (
                    f"the Ray cluster is unreachable: its GCS at {addr}: {why} (since {since});"
                    " new launches are held"
                )
            elif self._replaced and "new Ray cluster" not in was:
                self._unreachable = f"the Ray cluster at {addr}: {why}; new launches are held"
        if why is not None and was is None:
            log.warning("%s", self._unreachable)
        elif why is None and was is not None:
            log.warning("the Ray cluster's GCS at %s answers again: launching again", addr)
        return why is None

    def _on_ready(self, t: _Tracked, ref: Any) -> bool:
        """A start or a wait finished. Returns True when an event was produced."""
        if ref is t.start_ref:
            try:
                started: dict[str, Any] = _get(ref)
            except ActorUnavailableError:
                return self._ask_again(t)
            except Exception as e:
                why = f"could not start on {t.node}: {self._died(t, e)}"
                return self._end(t, self._recorded_or_lost(t, why))
            if "exit" in started:
                return self._end(t, exit_from_record(t.key, started["exit"]))
            if started.get("unknown"):
                why = (
                    "not started: a scheduler that recovered it before this launch gave it up "
                    "(another instance leads now)"
                )
                return self._end(t, _lost(t.key, why))
            with self._lock:
                t.start_ref = None
                t.start_args = ()  # the spec and the group are not needed any more
                t.wait_ref = t.agent.wait.remote(list(t.key))
            return False
        try:
            result = _get(ref)
        except ActorUnavailableError:
            return self._ask_again(t)
        except Exception as e:
            return self._end(t, self._recorded_or_lost(t, self._died(t, e)))
        if _killed_from_outside(result) and t.unconfirmed is None:
            # Ray kills an agent's children as its worker exits (its raylet died, or it
            # was killed), and the agent may answer in between: it answers again only if it
            # lives on, else the task is lost with it.
            with self._lock:
                t.unconfirmed = result
                t.wait_ref = t.agent.wait.remote(list(t.key))
            return False
        for line in result.get("gpu_reports") or ():
            log.warning("%s", line)
        if t.unconfirmed is not None:  # which way a SIGKILL was taken, should it be doubted
            log.info("task %s: SIGKILL from outside, its agent answered again", _show(t.key))
        return self._end(t, exit_from_record(t.key, result))

    def _recorded_or_lost(self, t: _Tracked, why: str) -> TaskExited:
        """A task whose agent died: ended as its exit record says, if it wrote one before (it
        ended, and the agent died before it could tell), else LOST for `why`; LOST too when
        the record says SIGKILL from outside: what Ray does to the children of an agent's
        worker as it exits."""
        if t.exit_record:
            rec = recorded_exit(t.exit_record, t.key, t.launch_id or None)
            if rec is not None and _killed_from_outside(rec):
                return _lost(t.key, f"{why}; its process was killed with it")
            if rec is not None:
                return exit_from_record(t.key, rec)
        return _lost(t.key, why)

    def _check_gpu_memory(self) -> None:
        """Collects the answers of the watchdogs asked before (never waiting), writes what
        they report in our log, and every gpu_check_s asks the started GPU tasks again."""
        if self._gpu_refs:
            refs = list(self._gpu_refs)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                key, node = self._gpu_refs.pop(ref)
                try:
                    got: dict[str, Any] = _get(ref)
                except Exception as e:  # the actor ended meanwhile: its exit says how
                    log.debug("gpu memory of %s: %s", key, e)
                    continue
                for line in got.get("reports") or ():
                    log.warning("%s", line)
                with self._lock:
                    if got.get("state"):
                        self._gpu_states[node] = str(got["state"])
                    if isinstance(got.get("usage"), TaskGpuMemory) and key in self._tracked:
                        self._gpu_usage[key] = got["usage"]
        now = time.monotonic()
        if now < self._next_gpu_check:
            return
        self._next_gpu_check = now + self._gpu_check_s
        with self._lock:
            asking = {key for key, _ in self._gpu_refs.values()}
            due = [
                t
                for t in self._tracked.values()
                if t.gpus and t.start_ref is None and not t.retry_at and t.key not in asking
            ]
        for t in due:
            try:
                self._gpu_refs[t.agent.gpu_memory.remote(list(t.key))] = (t.key, t.node)
            except Exception as e:
                log.debug("gpu memory of %s: %s", t.key, e)

    def _ask_again(self, t: _Tracked) -> bool:
        """Not known to be dead: ask again later (start and wait are idempotent). A node that
        is really gone is declared dead by Ray after its heartbeat timeout; then the call fails
        with ActorDiedError and the task is LOST."""
        with self._lock:
            t.retry_at = time.monotonic() + UNAVAILABLE_RETRY_S
        return False

    def _start_timeouts(self) -> bool:
        now = time.monotonic()
        with self._lock:
            late = [
                t
                for t in self._tracked.values()
                if t.start_ref is not None and now - t.launched_at > self._start_timeout_s
            ]
        for t in late:
            why = (
                f"could not start: Ray did not start it on {t.node} within "
                f"{self._start_timeout_s:g}s (its resources there are held by work aisched "
                "does not know of)"
            )
            self._end(t, _lost(t.key, why))
        return bool(late)

    def _end(self, t: _Tracked, event: TaskExited) -> bool:
        """Report the task's end once; its agent forgets it, and the gang's reservation goes
        back to Ray with its last task."""
        try:
            t.agent.forget.remote(list(t.key))
        except Exception as e:  # the agent is gone, and the task with it
            log.debug("forget %s: %s", t.key, e)
        with self._lock:
            self._gpu_usage.pop(t.key, None)
            if self._tracked.pop(t.key, None) is None:
                return False
            self._events.append(event)
        with self._reserve_lock:
            self._release(t.key)
        return True

    def _release(self, key: TaskKey) -> None:
        """Task `key` has ended: its gang's group goes with the gang's last task; before, the
        rest are re-reserved without its bundle, once every one of them has started (one
        still waiting for the group waits on that group), and none is being stopped or has
        ended unreleased."""
        with self._lock:
            gang_id = self._gang_of.pop(key, None)
            gang = self._gangs.get(gang_id) if gang_id is not None else None
            if gang_id is None or gang is None:
                return
            gang.keys.discard(key)
            mine = gang.bundles.pop(key, None)
            rest = [self._tracked.get(k) for k in sorted(gang.keys)]
            if not gang.keys:
                del self._gangs[gang_id]
            elif (
                mine is None
                or self._unreachable is not None  # re-reserved once the GCS answers, if ever
                or any(
                    r is None or r.start_ref is not None or r.stopping or r.key not in gang.bundles
                    for r in rest
                )
            ):
                # Nothing to give back, or not now (one still waits for the group, or is
                # ending too: a cancel): held until the next end, or the gang's last.
                return
            else:
                del self._gangs[gang_id]
        if self._unreachable is not None:
            return  # no task claims its group now: the sweep removes it once the GCS answers
        self._removals.remove(gang.group)
        if not gang.keys:
            return
        keys = sorted(gang.keys)
        try:
            group = reserve(
                gang.name, [gang.bundles[k][0] for k in keys], [gang.bundles[k][1] for k in keys]
            )
        except (ValueError, TypeError) as e:
            log.warning("cannot re-reserve the rest of gang %s in Ray: %s", gang.name, e)
            return
        new_id = group.id.hex()
        with self._lock:
            self._gangs[new_id] = _Gang(group, set(keys), gang.name, gang.bundles)
            self._gang_of.update(dict.fromkeys(keys, new_id))
        log.info("gang %s: %d task(s) re-reserved after %s ended", gang.name, len(keys), key)

    def _sweep_groups(self) -> None:
        """Removes our placement groups that no task claims, at the second sweep that finds
        them so (see SWEEP_S)."""
        try:
            table: dict[str, Any] = ray.util.placement_group_table()
        except Exception as e:
            log.debug("placement groups: %s", e)
            return
        prefix = f"{self._namespace}:"
        with self._lock:
            ours = {
                gid
                for gid, row in table.items()
                if str(row.get("name", "")).startswith(prefix)
                and row.get("state") != "REMOVED"
                and gid not in self._gangs
            }
            stale, self._unclaimed = ours & self._unclaimed, ours - self._unclaimed
        for gid in sorted(stale):
            log.info("removing placement group %s: none of its tasks is running", gid)
            self._removals.remove(PlacementGroup(PlacementGroupID.from_hex(gid)))

    def _died(self, t: _Tracked, e: Exception) -> str:
        if self._unreachable is None:
            self._refresh_nodes()
        with self._lock:  # the next task there gets a new agent
            if self._agents.get(t.node_id) is t.agent:
                del self._agents[t.node_id]
        if t.node not in self._ray_nodes:
            return f"lost: its Ray node {t.node} left the cluster"
        self._sweep_after_agent_death(t.node_id)
        return f"lost: its node's Ray agent died ({_why(e)})"

    def _sweep_after_agent_death(self, node_id: str) -> None:
        """A new agent for the node at once, to kill what the dead one's tasks left running
        (the lost tasks may be retried on another node, and nothing else would go there)."""
        try:
            self._agent(node_id).sweep.remote(_instance(self._namespace), self._memory_limit)
        except Exception as e:  # the node is going too: nothing there to sweep for now
            log.debug("sweep of node %s: %s", node_id[:8], e)

    def _refresh_nodes(self) -> bool:
        """Re-reads Ray's node table; True when the set of nodes changed."""
        found = nodes_from_ray(ray.nodes())  # type: ignore[no-untyped-call]
        with self._lock:
            # Compared with their Ray ids and addresses, not as `Node`s only: a node replaced
            # (a new raylet, a new id) between two looks is the same `Node`, and work placed
            # there must go to the new id, not wait for ever on the dead one.
            ray_nodes = {rn.node.name: rn for rn in found}
            if ray_nodes == self._ray_nodes:
                return False
            nodes = tuple(rn.node for rn in found)
            changed = nodes != self._nodes
            self._ray_nodes = ray_nodes
            self._nodes = nodes
            new = [rn.node_id for rn in found if rn.node_id not in self._agents]
        log.info(
            "Ray nodes: %s",
            ", ".join(f"{rn.node.name} ({rn.node_id[:8]})" for rn in found) or "none",
        )
        for node_id in new:  # started now, so that a first gang there does not wait for it
            self._agent(node_id)
        return changed


def _gcs_refusal(address: str) -> str | None:
    """Why the GCS at `address` (HOST:PORT) does not take a connection now, or None."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=GCS_PROBE_S):
            return None
    except (OSError, ValueError) as e:
        return str(getattr(e, "strerror", None) or e)


def _session_here() -> str:
    """The session name of the Ray cluster this driver joined ("" if Ray does not say)."""
    try:
        node: Any = ray._private.worker.global_worker.node
        return str(node.session_name)
    except Exception:
        return ""


def _session_at(address: str) -> str | None:
    """The session name of the Ray cluster whose GCS is at `address`, asked by a client of its
    own (never the driver's: that one aborts the process on a GCS of another cluster); None
    when it does not answer."""
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        got = GcsClient(address=address).internal_kv_get(
            b"session_name", b"session", timeout=GCS_PROBE_S
        )
    except Exception as e:
        log.debug("session of the GCS at %s: %s", address, e)
        return None
    return got.decode() if isinstance(got, bytes) else None


def _bundle(req: TaskLaunch) -> dict[str, float]:
    """The task's bundle in its gang's placement group: what it reserves in Ray."""
    out = {
        "CPU": req.milli_cpu / 1000,
        "GPU": _gpu_share(req),
        "memory": float(req.mem_limit_mib * MIB),
    }
    return {k: v for k, v in out.items() if v > 0}


def _gpu_share(req: TaskLaunch) -> float:
    """GPUs to reserve in Ray: whole devices, or the share of one a fractional task holds."""
    return len(req.gpus) * req.gpu_milli / 1000


def _instance(namespace: str) -> str:
    """What a service's things on a node are named by (`ray_limits.task_names`)."""
    return hashlib.sha256(namespace.encode()).hexdigest()[:10]


def _spec(
    req: TaskLaunch, gpu_check_s: float, container: ContainerSpec | None, namespace: str
) -> dict[str, Any]:
    out = _host_spec(req, gpu_check_s)
    out["instance"] = _instance(namespace)
    if container is not None:
        # Run with podman (or docker) on the task's node: see ray_task.TaskRunner.
        out["container"] = {
            "image": container.image,
            "network": container.network.value,
            "bandwidth_bit_s": container.bandwidth_bit_s,
            "shm_mib": container.shm_mib,
            "volumes": [[v.host_path, v.container_path, v.read_only] for v in container.volumes],
            "workdir_in_image": container.workdir_in_image,
            "instance": out["instance"],
            "milli_cpu": req.milli_cpu,
            "mem_limit_mib": req.mem_limit_mib,
        }
    return out


def _host_spec(req: TaskLaunch, gpu_check_s: float) -> dict[str, Any]:
    return {
        "command": list(req.command),
        "env": dict(req.env),
        "workdir": req.workdir,
        "log_path": req.log_path,
        "grace_period_s": req.grace_period_s,
        "key": list(req.key),
        "gpus": list(req.gpus),
        "gpu_mem_mib": req.gpu_mem_mib,
        "gpu_check_s": gpu_check_s,
        "user": req.user,
        "uid": req.uid,  # checked on the node: the name must still be that account there
        "milli_cpu": req.milli_cpu,  # its agent pins it to that many cores
        "mem_limit_mib": req.mem_limit_mib,
    }


def _killed_from_outside(result: Mapping[str, Any]) -> bool:
    """A task's end (result or exit record) that says SIGKILL, sent by no stop of aisched's
    and not the kernel's for its memory limit (those are other kinds)."""
    return result.get("kind") == "exited" and result.get("exit_code") == -signal.SIGKILL


def _lost(key: TaskKey, message: str) -> TaskExited:
    return TaskExited(key, ExitKind.LOST, None, message, time.time())


def _current_group(gang_id: object, name: object) -> str | None:
    """The id of a gang's group now: the stored one, or, when that one was replaced (the rest
    of the gang re-reserved), the live group of the same name."""
    if not isinstance(gang_id, str):
        return None
    try:
        table: dict[str, Any] = ray.util.placement_group_table()
    except Exception as e:
        log.debug("placement groups: %s", e)
        return gang_id
    row = table.get(gang_id) or {}
    if row.get("state") not in (None, "REMOVED") or not isinstance(name, str) or not name:
        return gang_id
    live = [g for g, r in table.items() if r.get("name") == name and r.get("state") != "REMOVED"]
    return live[0] if live else gang_id


def _why(e: BaseException) -> str:
    first = str(e).strip().splitlines()
    return f"{type(e).__name__}: {first[0]}" if first else type(e).__name__


def _show(key: TaskKey) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"

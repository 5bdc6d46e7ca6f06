"""Job specifications: what a user asks for, frozen once submitted.

A job is one or more task groups; each group has `replicas` identical tasks with the same
per-replica request. A gang is the whole job: at least `min_available` tasks start together or
none do. Runtime state (attempts, attained service, placement) lives elsewhere; a `Job` never
changes after submission.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field
from enum import StrEnum

from aisched.model.cluster import TopologyLevel
from aisched.model.resources import Resources
from aisched.model.service import ServiceSpec


class _Shape:
    """One interned placement shape: the jobs of one shape share this object. `serial` names
    the shape cheaply (`Job.shape_id`); it comes from a counter, so it is never reused, even
    after every job of a shape is gone and the entry dropped (an `id()` could be, and a cache
    keyed by it would then answer for the wrong shape)."""

    __slots__ = ("key", "serial", "__weakref__")

    def __init__(self, key: tuple[object, ...], serial: int) -> None:
        self.key = key
        self.serial = serial


# Shapes of the jobs alive now: an entry goes when its last job does, so a long-running
# service holds the shapes of its live jobs, not of every job it ever saw.
_SHAPES: weakref.WeakValueDictionary[tuple[object, ...], _Shape] = weakref.WeakValueDictionary()
_SHAPES_LOCK = threading.Lock()  # jobs are built on the API's threads and the loop's
_SERIALS = itertools.count(1)


def _intern(key: tuple[object, ...]) -> _Shape:
    with _SHAPES_LOCK:
        shape = _SHAPES.get(key)
        if shape is None:
            shape = _SHAPES[key] = _Shape(key, next(_SERIALS))
        return shape


class JobKind(StrEnum):
    TRAIN = "train"
    INFER = "infer"
    BATCH = "batch"
    # Replicas scaled by the autoscaler (model.service); the job itself never runs a task.
    SERVICE = "service"


class RestartPolicy(StrEnum):
    NEVER = "never"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class DependencyCondition(StrEnum):
    """When a dependency counts as met: `success` needs it to succeed (its failure or
    cancellation cancels the dependent); `any` only needs it to have ended, however."""

    SUCCESS = "success"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class Dependency:
    """This job may start only once job `job_id` has ended as `condition` asks."""

    job_id: str
    condition: DependencyCondition = DependencyCondition.SUCCESS


class TopologyMode(StrEnum):
    REQUIRED = "required"
    PREFERRED = "preferred"


@dataclass(frozen=True, slots=True)
class TopologyRequirement:
    """Where a gang's tasks may go relative to each other.

    `pack` keeps all tasks inside one domain of that level (one node, one rack, one zone);
    `spread` puts at most one task of the job on each domain of that level.
    """

    pack: TopologyLevel | None = None
    mode: TopologyMode = TopologyMode.REQUIRED
    spread: TopologyLevel | None = None


class NetworkMode(StrEnum):
    """A container's network: the host's own (`host`, as a host task), none but loopback
    (`none`), or its own address on the engine's bridge (`bridge`, needed for `bandwidth`)."""

    HOST = "host"
    NONE = "none"
    BRIDGE = "bridge"


@dataclass(frozen=True, slots=True)
class Volume:
    """A host directory or file mounted into a container (Kubernetes' `hostPath` volume)."""

    host_path: str
    container_path: str
    read_only: bool = False


# The containers-image transports: `docker-archive:/some/file.tar` and the like load an image
# from a file, a directory or another store. The engine runs as root for every user, so it
# would read a file the job's user may not, into the store all users share, under a tag another
# user's job then runs. Some of them (`oci:x`, `dir:x`) are valid references by the grammar.
IMAGE_TRANSPORTS = frozenset(
    ("atomic", "containers-storage", "dir", "docker", "docker-archive", "docker-daemon", "oci",
     "oci-archive", "openshift", "ostree", "sif", "tarball")
)  # fmt: skip


def image_transport(image: str) -> str | None:
    """The transport `image` names (as written), or None for a registry reference."""
    transport, colon, _ = image.partition(":")
    return transport if colon and transport.lower() in IMAGE_TRANSPORTS else None


def mount_option_char(path: str) -> str | None:
    """The character of `path` the engine would read as mount options, or None: its
    `--volume HOST:PATH[:OPTIONS]` reads what follows a ':' as options (`/mnt:U` has root chown
    the host path to the job's user), ',' separating them."""
    return next((c for c in (":", ",") if c in path), None)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """How a task group runs in an OCI image instead of on the host.

    `bandwidth_bit_s` shapes what the container sends (egress) to that rate; None: unshaped.
    `shm_mib` is the size of its /dev/shm (None: the engine's default, 64 MiB for podman).
    `workdir_in_image`: the task's workdir is a path inside the image, never a host directory
    mounted there, and no workdir means the image's own (a pod's `workingDir`); else a workdir
    that is a directory on the host is mounted (a native job's, the submitter's by default).
    The executor reads this; the core never does (placement does not depend on it).
    """

    image: str
    network: NetworkMode = NetworkMode.HOST
    bandwidth_bit_s: int | None = None
    shm_mib: int | None = None
    volumes: tuple[Volume, ...] = ()
    workdir_in_image: bool = False


@dataclass(frozen=True, slots=True)
class TaskGroup:
    """`replicas` identical tasks. `command`, `env`, `workdir` and `container` say how an
    executor runs each one; the core never reads them (placement depends on `request` and
    `replicas` only). `container` None: on the host. `kubernetes_pod`: the group comes from a
    Kubernetes pod template (a Volcano file), so it is run as Kubernetes runs a container: its
    command expands `$(NAME)` against the task's environment (`model.expansion`).
    `file_index`: where the group stands among its file's tasks, when the job's groups are in
    another order (a Volcano pytorch job's master first, for its ranks); None: its index here."""

    name: str
    replicas: int
    request: Resources
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    container: ContainerSpec | None = None
    kubernetes_pod: bool = False
    file_index: int | None = None

    @property
    def total(self) -> Resources:
        return self.request.times(self.replicas)


def account_key(user: str, uid: int | None) -> str:
    """The key what one account holds is counted under (per-user limits and rates, fair shares):
    `name#uid`, or the name alone where the uid is not known (a job or token stored before uids
    were kept). A name is not an account: once an account is deleted and its name given to
    another uid, the old account's jobs must not count against the new one. `#` is in no user
    name (POSIX's portable names, and the names tokens are made for), so no name is a key of
    another account. Shown to no one: tables, metrics and reasons name the user."""
    return user if uid is None else f"{user}#{uid}"


def accounts_counted(user: str, uid: int | None) -> tuple[str, ...]:
    """The keys whose holdings count against the account `user` (uid `uid`): its own and,
    where its uid is known, its name's alone, which holds the jobs stored before uids were
    kept; those count for every account of their name, as their owner checks go by name
    (`identity.same_account`)."""
    return (user,) if uid is None else (f"{user}#{uid}", user)


def split_account(key: str) -> tuple[str, int | None]:
    """`account_key`'s inverse: the user name and uid (None where the key has none)."""
    user, sep, uid = key.rpartition("#")
    return (user, int(uid)) if sep and uid.isdigit() else (key, None)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    groups: tuple[TaskGroup, ...]
    name: str = ""
    kind: JobKind = JobKind.BATCH
    user: str = "default"
    queue: str = "default"
    priority: int = 0
    preemptible: bool = True
    min_available: int | None = None
    topology: TopologyRequirement = field(default_factory=TopologyRequirement)
    gpu_models: tuple[str, ...] = ()
    # Models the job would rather run on (scored, never required); not part of its shape,
    # since preferences change where a job goes, not whether it fits.
    gpu_models_preferred: tuple[str, ...] = ()
    restart_policy: RestartPolicy = RestartPolicy.ON_FAILURE
    max_retries: int = 3
    time_limit_s: float | None = None
    estimate_s: float | None = None
    checkpoint_interval_s: float | None = None
    submit_time_s: float = 0.0
    # How a live executor stops and retries the job: SIGTERM, this long, then SIGKILL; a failed
    # attempt waits `backoff_s * 2**(failures-1)` (capped by the service) before it is retried.
    grace_period_s: float = 30.0
    backoff_s: float = 10.0
    # Jobs that must end first (pipelines); placement never reads them: the service holds a
    # job back until they are met (`core.dependencies`).
    depends_on: tuple[Dependency, ...] = ()
    # Set on `service` jobs only: what replicas to keep and how to scale them.
    service: ServiceSpec | None = None
    # Set on a replica: the id of the service job it serves.
    replica_of: str | None = None
    # Runs with min_available..all tasks; the service restarts it larger (from its checkpoint)
    # when idle capacity could take more of its tasks and nothing else is waiting.
    elastic: bool = False
    # The uid of the account that submitted it, on the service's machine (None: not known, a
    # job stored before it was recorded). A task runs as `user` only while that name still
    # names this uid: a name deleted and given to another account does not inherit its jobs.
    uid: int | None = None
    # Whose holdings it counts in (per-user limits, fair shares): `account_key(user, uid)`.
    account: str = field(init=False, repr=False, compare=False)
    # Derived once: read on every cycle the job waits.
    _total: Resources = field(init=False, repr=False, compare=False)
    _shape: _Shape = field(init=False, repr=False, compare=False)
    tie_break: tuple[float, float, str] = field(init=False, repr=False, compare=False)
    # Equal for jobs of equal shape, different otherwise (and never reused): the interned
    # shape's serial number.
    shape_id: int = field(init=False, repr=False, compare=False)
    # Tasks in all, and those that must start together (all of them unless `min_available`
    # says fewer): read by placement and preemption for every job they look at.
    num_tasks: int = field(init=False, repr=False, compare=False)
    gang_min: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"job {self.id}: needs at least one task group")
        if any(g.replicas < 1 for g in self.groups):
            raise ValueError(f"job {self.id}: every task group needs at least one replica")
        num_tasks = sum(g.replicas for g in self.groups)
        object.__setattr__(self, "num_tasks", num_tasks)
        gang_min = num_tasks if self.min_available is None else self.min_available
        object.__setattr__(self, "gang_min", gang_min)
        if self.min_available is not None and not 1 <= self.min_available <= self.num_tasks:
            raise ValueError(
                f"job {self.id}: min_available {self.min_available} must be in 1..{self.num_tasks}"
            )
        total = Resources()
        for g in self.groups:
            total = total.plus(g.total)
        object.__setattr__(self, "_total", total)
        shape = (
            tuple((g.request, g.replicas) for g in self.groups),
            self.gpu_models,
            self.topology,
            self.min_available,
        )
        # Interned, so equal shapes are one object and `shape_id` names the class cheaply.
        interned = _intern(shape)
        object.__setattr__(self, "_shape", interned)
        object.__setattr__(self, "shape_id", interned.serial)
        # The last word of every ordering: higher priority, then earlier, then by id.
        object.__setattr__(self, "tie_break", (-self.priority, self.submit_time_s, self.id))
        object.__setattr__(self, "account", account_key(self.user, self.uid))

    @property
    def counted_with(self) -> tuple[str, ...]:
        """The accounts whose holdings a per-user cap counts for this job (`accounts_counted`)."""
        return accounts_counted(self.user, self.uid)

    @property
    def app(self) -> str:
        """What a node's `max_per_node` counts instances of: the service a replica serves,
        else the job itself (its tasks are one job group)."""
        return self.replica_of if self.replica_of is not None else self.id

    @property
    def serves_until_scaled_down(self) -> bool:
        """A service's replica: it runs until its service scales down or is cancelled, so it
        has no runtime of its own, to predict or for a reservation to wait out."""
        return self.replica_of is not None

    @property
    def total_request(self) -> Resources:
        return self._total

    @property
    def shape(self) -> tuple[object, ...]:
        """What placement depends on: jobs of one shape fit or fail alike (equivalence class)."""
        return self._shape.key

    @property
    def num_gpus(self) -> float:
        """GPUs held by the whole job, shares counted as fractions."""
        return self.total_request.gpu_equivalent_milli / 1000.0

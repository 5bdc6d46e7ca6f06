"""The service's configuration: embedded defaults, an optional YAML file, then command-line flags.

`aisched up` with no file and no flags is a complete configuration: loopback port 8470, state in
`$AISCHED_HOME` (default `~/.aisched`), this machine's CPUs, memory and GPUs, one `default`
queue, the `default` policy. Every problem in a file is a `SpecError` naming the file and field.
Pydantic stays in this module: `ServiceConfig` is turned into model types (`QueueTree`,
`Policy`, `JobDefaults`) by its methods.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from aisched.core.policy import Policy, PolicyError, build_policy
from aisched.model.queue import DEFAULT_QUEUE, Queue, QueueTree
from aisched.model.resources import Dim, Resources
from aisched.service.defaults import DEFAULT_PORT, default_home, default_socket
from aisched.service.ratelimit import Budget
from aisched.spec.errors import (
    Number,
    SpecError,
    describe,
    parse_yaml,
    read_text_file,
    validation_problems,
)
from aisched.spec.job import DEFAULT_PRIORITY_CLASSES, JobDefaults
from aisched.spec.job_common import GpuModel, Priority
from aisched.spec.policy import load_policy
from aisched.spec.units import UnitError, parse_bytes, parse_mem_mib, to_duration_s, to_mem_mib

if TYPE_CHECKING:
    from aisched.service.leader import LeaseTimes

MemoryLimit = Literal["auto", "cgroup-v2", "cgroup-v1", "rlimit", "none"]
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        # No path, name or URL of the configuration may hold one (the OS refuses it deep in a
        # call, as a traceback).
        if isinstance(v, str) and "\x00" in v:
            raise ValueError("holds a NUL byte")
        return v


def _no_boolean(v: Any) -> Any:
    # pydantic reads true as 1: `port: true` listened on port 1.
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {str(v).lower()} (a boolean)")
    return v


Int = Annotated[int, BeforeValidator(_no_boolean)]
Float = Number  # finite, and no boolean

# The longest any duration of the configuration may be, as a job's: a timer much past it
# overflows the platform's time_t (100000000000000d killed the autoscaler's thread).
MAX_DURATION_S = 366 * 86400.0
MIN_CYCLE_INTERVAL_S = 0.1
MIN_LOG_BYTES = 4096  # a task's log file, before it rotates (`task_log.CappedLog`)


def _duration(v: Any, what: str = "") -> float:
    """The seconds of a duration key; a ValueError (after `what: ` when given) for a value
    that is not a duration, or is longer than 366 days."""
    try:
        if isinstance(v, bool):
            raise UnitError("expected a duration such as 30s or 5m")
        seconds = to_duration_s(v)
        if seconds > MAX_DURATION_S:
            raise UnitError(f"{v!r} is longer than 366 days")
    except UnitError as e:
        raise ValueError(f"{what}: {e}" if what else str(e)) from None
    return seconds


class AmountModel(_Model):
    """An amount of resources: `{gpus: 2, cpus: 8, mem: 64G}`."""

    gpus: Annotated[Float, Field(ge=0, le=100_000)] = 0
    cpus: Annotated[Float, Field(ge=0, le=10_000_000)] = 0
    mem: Any = None  # a size; a bare number is refused by the validator, for its missing unit

    def to_resources(self) -> Resources:
        gpus = int(self.gpus)
        return Resources(
            milli_cpu=round(self.cpus * 1000),
            mem_mib=0 if self.mem is None else parse_mem_mib(self.mem, "mem"),
            gpu=gpus,
            gpu_milli=round((self.gpus - gpus) * 1000),
        )

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        if v is not None:
            to_mem_mib(v)  # its own words: the key is named by the caller
        return v

    def named(self) -> frozenset[Dim]:
        """The resources written in it, a 0 among them: those a limit caps."""
        keys = {"cpus": Dim.CPU, "mem": Dim.MEMORY, "gpus": Dim.GPU}
        given = self.model_fields_set - ({"mem"} if self.mem is None else set())
        return frozenset(keys[k] for k in given if k in keys)


class QueueModel(_Model):
    name: Name
    parent: Name | None = None
    weight: Annotated[Float, Field(gt=0, le=1_000_000)] = 1.0
    guarantee: AmountModel = AmountModel()
    limit: AmountModel | None = None
    borrowing: bool = True
    # What one user's running jobs here (and under here) may hold together, like Slurm's QOS
    # MaxTRESPerUser; None: no cap per user.
    user_limit: AmountModel | None = None
    # Who may submit to this queue (and the queues under it), like Slurm's AllowGroups: a user
    # named here or in one of the groups. Both empty: everyone. Admins always may.
    users: list[Name] = Field(default_factory=list)
    groups: list[Name] = Field(default_factory=list)
    # The highest priority a job of a user who is no admin may ask for here (and in the queues
    # under it that set none): a higher priority evicts other users' work in the queue, so it
    # is the admins' to grant. None: its parent's; a top-level queue that sets none, 0.
    max_priority: Priority | None = None


class AdminsModel(_Model):
    """Who, besides root and the service's own user, may act on every job."""

    users: list[Name] = Field(default_factory=list)
    groups: list[Name] = Field(default_factory=list)


class NodeModel(_Model):
    """Overrides of what discovery finds on this machine."""

    name: Name | None = None
    gpus: Annotated[Int, Field(ge=0, le=1024)] | None = None
    # Both describe the GPUs, so they come after `gpus`, which their checks read; with no GPUs
    # (`gpus: 0`, or none found: `discovery`) they are refused, not ignored.
    gpu_model: GpuModel | None = None  # checked as a job's gpu_models are
    gpu_mem: Any = None  # sizes, as AmountModel.mem
    cpus: Annotated[Float, Field(ge=0.001, le=100_000)] | None = None
    mem: Any = None
    # Each GPU's device file, in index order, for the GPU walls (default: NVML's /dev/nvidiaN).
    gpu_device_files: Annotated[list[str], Field(max_length=1024)] | None = None

    @field_validator("gpu_device_files")
    @classmethod
    def _absolute(cls, v: list[str] | None) -> list[str] | None:
        for i, path in enumerate(v or ()):
            if not path.startswith("/") or "\0" in path:
                raise ValueError(f"[{i}]: {path!r} is not an absolute path")
        return v

    @field_validator("gpu_model")
    @classmethod
    def _gpu_model(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            _some_gpus(info, "names the model of the node's GPUs")
        return v

    @field_validator("gpu_mem")
    @classmethod
    def _gpu_mem(cls, v: Any, info: ValidationInfo) -> Any:
        if v is not None:
            if to_mem_mib(v) == 0:  # as a job's gpu_mem: a GPU without memory holds no task
                raise ValueError("must be more than 0")
            _some_gpus(info, "gives the memory of each of the node's GPUs")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        # Below 1M it was refused later, by discovery, as `mem_mib`, naming neither file nor key.
        if v is not None and to_mem_mib(v) < 1:
            raise ValueError(f"{v!r} is below 1M")
        return v


def _some_gpus(info: ValidationInfo, what: str) -> None:
    """Refuse a key that describes the node's GPUs when `gpus: 0` gives it none."""
    if info.data.get("gpus") == 0:
        raise ValueError(f"{what}, but gpus is 0 (none): leave it out, or declare the GPUs")


class DefaultsModel(_Model):
    grace_period: Any = "30s"
    max_retries: Annotated[Int, Field(ge=0, le=1000)] = 3
    backoff: Any = "10s"

    @field_validator("grace_period", "backoff")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        _duration(v)
        return v


class LimitsModel(_Model):
    """What the service keeps bounded (docs/service.md, Operations)."""

    # Each task's log: rotated past this size, at most this many files kept (the current one
    # included), as kubelet's containerLogMaxSize / containerLogMaxFiles.
    log_max_size: str | int = "10M"
    log_max_files: Annotated[Int, Field(ge=1, le=100)] = 3
    # Below this much free space on the data or log directory's filesystem, new submissions
    # are refused (507) and readiness reports disk pressure.
    disk_min_free: str | int = "256M"  # 0: not watched
    # And below this many free inodes (where the filesystem counts them): many small files
    # can use them all up with bytes to spare, and then no file can be made (a launch makes a
    # few per task). 0: not watched.
    disk_min_free_inodes: Annotated[Int, Field(ge=0)] = 10_000
    # SIGTERM: how long the service may take to stop before it exits anyway.
    shutdown_grace: Any = "10s"
    # How long a write may wait for a database locked by another process before the step
    # fails (and is retried after a back-off).
    store_busy_timeout: Any = "5s"
    # PostgreSQL: a statement the server works on longer than this is cancelled by it, and a
    # server that does not answer at all (stopped, stuck, unreachable) within this and 5 s more
    # has the connection closed; the step fails and is retried, a request gets 503.
    store_statement_timeout: Any = "30s"
    # The most jobs one user may have not yet ended (waiting or running; a service counts as
    # itself and every replica it may scale to): past it a submission is refused with 429, so
    # one user cannot fill the queue, the store and every cycle for the others. 0: no limit.
    user_max_jobs: Annotated[Int, Field(ge=0)] = 10_000
    # And the most their job documents may take in the store together (as stored; a service
    # counts once for itself and each replica it may scale to): past it, 429. Without it one
    # user's 10,000 jobs of 1 MiB each would put 10 GB in the database. 0: no limit.
    user_max_job_bytes: str | int = "256M"
    # Ended jobs (their rows, events and logs) are kept this long after they end, then
    # forgotten, so months of history do not fill the disk. 0: kept for ever.
    keep_ended: Any = "30d"
    # Audit rows (who cancelled whose job, token changes) are kept this long, then deleted by
    # the same pass, so years of them do not fill the store. 0: kept for ever.
    keep_audit: Any = "365d"
    # What one user's ended jobs may keep, their documents in the store and their files (logs)
    # together: past it, the user's oldest ended jobs are forgotten as `keep_ended` forgets
    # them, never their newest. Each task's log is capped, but not how many jobs one user
    # runs in `keep_ended`: without it they could fill the disk for everyone. 0: no bound.
    user_max_ended_bytes: str | int = "10G"
    # What one user's running jobs' logs may take together, in bytes or as a share of the data
    # directory's disk ("25%"): past it, the user's running jobs with the most logs are stopped
    # (failed, not retried) until the rest fit. Each task's log is capped, but not how many
    # tasks one user runs at once. A share, not a fixed size, so that a large gang's capped
    # logs are not stopped on a large disk, nor one user let fill a small one. 0: no bound.
    user_max_running_log_bytes: str | int = "25%"
    # A live job keeps the records of its latest this many attempts (task rows, their folders
    # in the data directory, their events); older ones are forgotten. A job that restarts for
    # ever (`restart: always`) otherwise keeps a row, two folders and events per attempt,
    # without end. 0: every attempt is kept.
    keep_attempts: Annotated[Int, Field(ge=0, le=100_000)] = 20
    # A job's private /dev/shm on a node (host tasks run as a user by a root service) holds
    # at most the memory its tasks there asked for, and at most this (None: no other cap).
    shm_max_size: str | int | None = None
    # Requests per caller (a user on the socket or by token; an address without a valid
    # token): a token bucket of `request_burst` refilled at `request_rate` a second; past it,
    # 429 with Retry-After. Submissions and bulk cancels also take from the smaller `submit_`
    # budget. Admins are not limited; healthz and readyz never. A rate of 0: no limit.
    request_rate: Annotated[Float, Field(ge=0)] = 20.0
    request_burst: Annotated[Int, Field(ge=1)] = 200
    submit_rate: Annotated[Float, Field(ge=0)] = 5.0
    submit_burst: Annotated[Int, Field(ge=1)] = 100
    # Connections one peer (a local user on the socket, an address on TCP) may hold open at
    # once; one more is answered 429 and closed, so that nobody can take every connection the
    # server has from the others. Admins are not bound.
    connections_per_peer: Annotated[Int, Field(ge=1, le=4096)] = 128

    @field_validator("log_max_size")
    @classmethod
    def _log_size(cls, v: str | int) -> str | int:
        # '0' turned the cap off, and 1K was taken as 4K without a word.
        if parse_bytes(v, "size") < MIN_LOG_BYTES:
            raise ValueError(f"{v!r} is below 4K, the least a log file holds before it rotates")
        return v

    @field_validator("shm_max_size")
    @classmethod
    def _shm_size(cls, v: str | int | None) -> str | int | None:
        if v is not None and parse_mem_mib(v, "size") < 1:  # '0' was 1 MiB
            raise ValueError(f"{v!r} is below 1M (null: no cap)")
        return v

    @field_validator(
        "disk_min_free",
        "user_max_job_bytes",
        "user_max_ended_bytes",
    )
    @classmethod
    def _size(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            parse_mem_mib(v, "size")
        return v

    @field_validator("user_max_running_log_bytes")
    @classmethod
    def _size_or_share(cls, v: str | int) -> str | int:
        if _share(v) is None:
            parse_mem_mib(v, "size")
        return v

    @field_validator("shutdown_grace", "store_busy_timeout", "store_statement_timeout")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if _duration(v) <= 0:
            raise ValueError("must be a duration above 0, such as 10s")
        return v

    @field_validator("keep_ended", "keep_audit")
    @classmethod
    def _duration_or_zero(cls, v: Any) -> Any:
        _duration(v)  # negative durations are refused there
        return v

    def log_max_bytes(self) -> int:
        return parse_bytes(self.log_max_size, "limits.log_max_size")

    def shm_max_mib(self) -> int:
        """0: no cap."""
        if self.shm_max_size is None:
            return 0
        return max(1, parse_mem_mib(self.shm_max_size, "limits.shm_max_size"))

    def user_max_job_bytes_(self) -> int:
        """0: no limit."""
        return parse_bytes(self.user_max_job_bytes, "limits.user_max_job_bytes")

    def user_max_ended_bytes_(self) -> int:
        """0: no bound."""
        return parse_bytes(self.user_max_ended_bytes, "limits.user_max_ended_bytes")

    def user_max_running_log_bytes_(self, data_dir: Path) -> int:
        """0: no bound; a share is of the size of `data_dir`'s file system, read now."""
        share = _share(self.user_max_running_log_bytes)
        if share is not None:
            return int(shutil.disk_usage(data_dir).total * share)
        return parse_bytes(self.user_max_running_log_bytes, "limits.user_max_running_log_bytes")

    def disk_min_free_bytes(self) -> int:
        return parse_bytes(self.disk_min_free, "limits.disk_min_free")

    def shutdown_grace_s(self) -> float:
        return _duration(self.shutdown_grace, "limits.shutdown_grace")

    def keep_ended_s(self) -> float:
        return _duration(self.keep_ended, "limits.keep_ended")

    def keep_audit_s(self) -> float:
        return _duration(self.keep_audit, "limits.keep_audit")

    def store_busy_timeout_s(self) -> float:
        return _duration(self.store_busy_timeout, "limits.store_busy_timeout")

    def store_statement_timeout_s(self) -> float:
        return _duration(self.store_statement_timeout, "limits.store_statement_timeout")

    def rate_budgets(self) -> list[Budget]:
        return [
            Budget("request", self.request_rate, self.request_burst),
            Budget("submit", self.submit_rate, self.submit_burst),
        ]


class ServiceConfig(_Model):
    host: str = "127.0.0.1"
    port: Annotated[Int, Field(ge=0, le=65535)] = DEFAULT_PORT
    data_dir: str | None = None
    database: str | None = None
    policy: str | dict[str, Any] = "default"
    cycle_interval: Any = "5s"
    # Waiting jobs' estimated starts are worked out by at most one cycle in this long (0: by
    # every cycle); the cycles between keep the last ones.
    eta_interval: Any = "5s"
    max_backoff: Any = "5m"
    # An elastic job with tasks missing is grown into idle capacity after running this long.
    elastic_grow_after: Any = "60s"
    # A waiting job that fits only with nodes that left the cluster waits this long for them.
    lost_node_grace: Any = "10m"
    memory_limit: MemoryLimit = "auto"
    # Jobs that name an image run through this engine (auto: podman, else docker; none: such
    # jobs fail with the reason), with this OCI runtime (auto: the first the probe accepts).
    container_runtime: Literal["auto", "podman", "docker", "none"] = "auto"
    oci_runtime: Annotated[str, Field(pattern=r"^(auto|[A-Za-z0-9][A-Za-z0-9._-]*)$")] = "auto"
    # When an image is fetched: missing (pulled if not present), never, always.
    image_pull: Literal["missing", "never", "always"] = "missing"
    # Processes (and threads) one container may hold.
    container_pids_limit: Annotated[Int, Field(ge=16, le=4_194_304)] = 4096
    # Processes (and threads) one host task may hold (its pids cgroup), so that no task can
    # take every PID of the machine.
    task_pids_limit: Annotated[Int, Field(ge=16, le=4_194_304)] = 4096
    # Processes (and threads) all host tasks of one user may hold together (where cgroup v1
    # has a pids hierarchy), so that one user's many tasks cannot take the others' PIDs.
    user_pids_limit: Annotated[Int, Field(ge=16, le=4_194_304)] = 16384
    # A task above the GPU memory it declared (gpu_mem): report it in the log, or stop it.
    # Needs NVML (nvidia-ml-py and a driver); without it the watchdog is off and says why.
    gpu_memory_over: Literal["report", "stop"] = "report"
    # A Ray cluster to run on (`HOST:PORT` of its head, or `auto`); None: this machine only.
    ray: Annotated[str, Field(min_length=1)] | None = None
    # How long Ray may take to start a task on its node before its gang is rolled back.
    ray_start_timeout: Any = "60s"
    # Serve other users' jobs (as root) on a Ray cluster that takes requests without a token:
    # any local user reaching it could then run commands as root there (docs/ray.md).
    ray_allow_unauthenticated: bool = False
    # Learn runtimes from finished jobs (median and upper bound for qssf, backfill and ETAs).
    predict_runtimes: bool = True
    # Services: how often the autoscaler probes replicas and decides, and how old a load figure
    # (pushed or scraped) may be before it no longer counts.
    autoscaler_interval: Any = "1s"
    metric_max_age: Any = "10s"
    defaults: DefaultsModel = DefaultsModel()
    limits: LimitsModel = LimitsModel()
    priority_classes: dict[Name, Priority] = Field(
        default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES)
    )
    node: NodeModel = NodeModel()
    admins: AdminsModel = AdminsModel()
    # The local Unix socket (identity from the kernel); None: the default for the user the
    # service runs as (`service.defaults.default_socket`). "" turns it off.
    socket: str | None = None
    # TLS for the TCP port, served by uvicorn; required off loopback unless `insecure`.
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False
    queues: list[QueueModel] = Field(default_factory=lambda: [QueueModel(name=DEFAULT_QUEUE)])
    # High availability (a shared PostgreSQL database, docs/ha.md): the leader renews its
    # lease every lease_renew; a standby takes over once lease_ttl has passed without a
    # renewal, looking every lease_poll.
    # The API address standbys name to clients (default: the address listened on, which is no
    # use to them from 0.0.0.0).
    advertise: str | None = None
    lease_ttl: Any = "8s"
    lease_renew: Any = "2s"
    lease_poll: Any = "1s"

    @field_validator("advertise")
    @classmethod
    def _advertise(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s,/]+(/[^\s,]*)?", v):
            raise ValueError(
                f"{v[:80]!r} is not an address clients can reach: give http(s)://HOST:PORT"
            )
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        # The socket layer writes a name that is not ASCII in IDNA, and a name IDNA cannot
        # write (a label over 63 characters) failed the bind with a bare TypeError: a
        # traceback from `aisched up`, not a line naming the host.
        if not v.isascii():
            try:
                v.encode("idna")
            except UnicodeError as e:
                raise ValueError(f"{v[:80]!r} is not a host name or address ({e})") from None
        return v

    @field_validator("database")
    @classmethod
    def _database(cls, v: str | None) -> str | None:
        # An in-memory SQLite database is one per connection: the service opened it, made its
        # tables in one, and every step of the loop then failed ("no such table: jobs").
        if v is None:
            return v
        try:
            url = make_url(v)
        except ArgumentError:
            return v  # the store says what is wrong with it, as it opens it
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            raise ValueError(
                f"{v!r} is an in-memory SQLite database, which holds nothing the service "
                "could find again: give a file (sqlite:////path/state.db), or leave it out"
            )
        return v

    @field_validator("lease_ttl", "lease_renew", "lease_poll")
    @classmethod
    def _lease(cls, v: Any) -> Any:
        if _duration(v) <= 0:
            raise ValueError("must be a duration above 0, such as 2s")
        return v

    @model_validator(mode="after")
    def _lease_outlives_renewals(self) -> ServiceConfig:
        if _duration(self.lease_ttl, "lease_ttl") < 2 * _duration(self.lease_renew, "lease_renew"):
            raise ValueError(
                "lease_ttl must be at least twice lease_renew (a leader would lose its lease "
                "between two renewals)"
            )
        return self

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_kind(cls, v: Any) -> Any:
        # One line, not pydantic's two about `policy.str` and `policy.dict[str,any]`.
        if not isinstance(v, str | dict):
            raise ValueError(
                f"expected a preset's name, a policy file or a policy mapping, got {describe(v)}"
            )
        return v

    @field_validator("queues")
    @classmethod
    def _some_queue(cls, v: list[QueueModel]) -> list[QueueModel]:
        if not v:  # every submission would be refused, for ever
            raise ValueError(
                "no queue: no job could be submitted; leave it out for one named default"
            )
        return v

    @field_validator("cycle_interval")
    @classmethod
    def _not_a_busy_loop(cls, v: Any) -> Any:
        # While jobs wait, a cycle runs at least this often: 0 ran them back to back.
        if _duration(v) < MIN_CYCLE_INTERVAL_S:
            raise ValueError(
                f"{v!r} is below {MIN_CYCLE_INTERVAL_S:g}s: cycles would run back to back "
                "while jobs wait"
            )
        return v

    @field_validator(
        "eta_interval",
        "max_backoff",
        "ray_start_timeout",
        "elastic_grow_after",
        "lost_node_grace",
    )
    @classmethod
    def _dur(cls, v: Any) -> Any:
        _duration(v)
        return v

    @field_validator("autoscaler_interval", "metric_max_age")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if _duration(v) <= 0:
            raise ValueError("must be a duration above 0, such as 1s")
        return v

    # Where the `node` keys came from, set by `load_config`: the file read (None: none), and
    # the keys `aisched up`'s flags gave (None: the overrides were not flags).
    _file: str | None = PrivateAttr(None)
    _node_flags: frozenset[str] | None = PrivateAttr(None)

    def node_key_named(self, key: str) -> tuple[str, str]:
        """How an error names `node.key`, as the user gave it (or would give it, for a key
        not given): `("", "--gpus")` for a flag, `("FILE: ", "node.gpus")` for the file's key;
        the first part leads the line, the second is the name in a sentence."""
        flags = self._node_flags
        if flags is not None and (key in flags or self._file is None) and key in _NODE_FLAGS:
            return "", _flag(key)
        return (f"{self._file}: " if self._file else ""), f"node.{key}"

    # --- conversions to what the service uses ---------------------------------------------

    def home(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else default_home()

    def database_url(self) -> str:
        return self.database or f"sqlite:///{self.home() / 'state.db'}"

    def queue_tree(self, source: str = "config") -> QueueTree:
        try:
            return QueueTree(
                tuple(
                    Queue(
                        name=q.name,
                        parent=q.parent,
                        weight=q.weight,
                        guarantee=q.guarantee.to_resources(),
                        limit=None if q.limit is None else q.limit.to_resources(),
                        borrowing=q.borrowing,
                        user_limit=None if q.user_limit is None else q.user_limit.to_resources(),
                        limit_named=None if q.limit is None else q.limit.named(),
                        user_limit_named=None if q.user_limit is None else q.user_limit.named(),
                    )
                    for q in self.queues
                )
            )
        except ValueError as e:
            raise SpecError(f"{source}: queues: {e}") from None

    def build_policy(self, source: str = "config", from_flag: bool = False) -> Policy:
        """The policy named or given; a SpecError says where it was named (`source`'s
        `policy`, or `--policy` when the flag named it)."""
        if isinstance(self.policy, str):
            try:
                return load_policy(self.policy)
            except SpecError as e:
                where = "--policy" if from_flag else f"{source}: policy"
                raise SpecError(f"{where}: {e}") from None
        try:
            return build_policy(self.policy, name=str(self.policy.get("name") or "config"))
        except PolicyError as e:
            raise SpecError(f"{source}: {e}") from None

    def job_defaults(self, user: str) -> JobDefaults:
        return JobDefaults(
            user=user,
            priority_classes=dict(self.priority_classes),
            grace_period_s=_duration(self.defaults.grace_period, "defaults.grace_period"),
            max_retries=self.defaults.max_retries,
            backoff_s=_duration(self.defaults.backoff, "defaults.backoff"),
        )

    def queue_acl(self, name: str) -> tuple[frozenset[str], frozenset[str]] | None:
        """The users and groups that may submit to queue `name`, or None if anyone may."""
        for q in self.queues:
            if q.name == name and (q.users or q.groups):
                return frozenset(q.users), frozenset(q.groups)
        return None

    def max_priority(self, path: tuple[str, ...]) -> int:
        """The highest priority a user who is no admin may ask for in the queue at the end of
        `path` (from the top level down): the nearest `max_priority` set on it, else 0."""
        caps = {q.name: q.max_priority for q in self.queues if q.max_priority is not None}
        return next((caps[name] for name in reversed(path) if name in caps), 0)

    def socket_path(self) -> Path | None:
        if self.socket == "":
            return None
        return Path(self.socket).expanduser() if self.socket else default_socket()

    def lease_times(self) -> LeaseTimes:
        from aisched.service.leader import LeaseTimes  # only `up` needs the service's modules

        return LeaseTimes(
            ttl_s=_duration(self.lease_ttl, "lease_ttl"),
            renew_s=_duration(self.lease_renew, "lease_renew"),
            poll_s=_duration(self.lease_poll, "lease_poll"),
        )

    def cycle_interval_s(self) -> float:
        return _duration(self.cycle_interval, "cycle_interval")

    def eta_interval_s(self) -> float:
        return _duration(self.eta_interval, "eta_interval")

    def max_backoff_s(self) -> float:
        return _duration(self.max_backoff, "max_backoff")

    def lost_node_grace_s(self) -> float:
        return _duration(self.lost_node_grace, "lost_node_grace")

    def elastic_grow_after_s(self) -> float:
        return _duration(self.elastic_grow_after, "elastic_grow_after")

    def ray_start_timeout_s(self) -> float:
        return _duration(self.ray_start_timeout, "ray_start_timeout")

    def autoscaler_interval_s(self) -> float:
        return _duration(self.autoscaler_interval, "autoscaler_interval")

    def metric_max_age_s(self) -> float:
        return _duration(self.metric_max_age, "metric_max_age")


def load_config(
    path: str | Path | None, overrides: dict[str, Any] | None = None, *, flags: bool = False
) -> ServiceConfig:
    """The embedded defaults, updated by the file at `path` (if any), then by `overrides`
    (None values are ignored; `node` overrides merge key by key). `flags`: the overrides are
    `aisched up`'s flags, and a problem with one is named by its flag."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        parsed = parse_yaml(read_text_file(path, "config file"), source)
        if parsed is None:
            parsed = {}
        if not isinstance(parsed, dict):
            raise SpecError(f"{source}: a config file must be a mapping")
        data = parsed
    named: dict[tuple[str, ...], str] = {}  # where a flag's value went: the flag
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "node" and isinstance(value, dict):
            given = {k: v for k, v in value.items() if v is not None}
            in_file = data.get("node")
            if given and (in_file is None or isinstance(in_file, dict)):
                data["node"] = {**(in_file or {}), **given}
                named.update({("node", k): _flag(k) for k in given})
            # (A file's `node: x` is no mapping, and is refused as one below: `dict("x")`
            # was a traceback.)
        else:
            data[key] = value
            named[(key,)] = _flag(key)
    try:
        cfg = ServiceConfig.model_validate(data)
    except ValidationError as e:
        raise SpecError(_blamed(e, source, named if flags else {})) from None
    cfg.queue_tree(source)
    cfg.build_policy(source, from_flag=(overrides or {}).get("policy") is not None)
    cfg._file = None if path is None else source
    if flags:
        cfg._node_flags = frozenset(k for (part, *rest) in named if part == "node" for k in rest)
    return cfg


# The `node` keys `aisched up` has a flag for.
_NODE_FLAGS = frozenset({"gpus", "gpu_model", "cpus", "mem"})


def _flag(key: str) -> str:
    """The flag of `aisched up` that sets `key` (`data_dir`: `--data-dir`)."""
    return "--" + key.replace("_", "-")


def _blamed(err: ValidationError, source: str, flags: dict[tuple[str, ...], str]) -> list[str]:
    """The problems of `err` as `validation_problems` says them, except that a value a flag
    gave is named by the flag (`--port: ...`), not by a file that never held it."""
    out = []
    for e, line in zip(
        err.errors(include_url=False), validation_problems(err, source), strict=True
    ):
        loc = tuple(str(part) for part in e["loc"])
        flag = next((f for at, f in flags.items() if loc[: len(at)] == at), None)
        if flag is None:
            out.append(line)
        else:  # `SOURCE: node.gpus: MESSAGE` -> `--gpus: MESSAGE`
            out.append(f"{flag}: {line.removeprefix(f'{source}: ' + '.'.join(loc) + ': ')}")
    return out


def _share(value: str | int) -> float | None:
    """A share written as a percentage ("25%") as a fraction, else None; one outside
    (0, 100] is refused."""
    if not isinstance(value, str) or not value.strip().endswith("%"):
        return None
    try:
        percent = float(value.strip()[:-1])
    except ValueError:
        raise ValueError(f"{value!r} is not a percentage such as 25%") from None
    if not 0 < percent <= 100:
        raise ValueError(f"{value!r}: a share must be above 0 % and at most 100 %")
    return percent / 100

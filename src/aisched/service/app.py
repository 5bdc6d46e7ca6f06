"""The embedded service: configuration → data directory, store, executor, loop, metrics.

`Service.open(config)` takes the data directory's lock (two schedulers on one data directory
would each start the same tasks), opens the store, discovers this machine, and builds the
loop; `start()` takes part in the leader election (`service.leader`) and, once this instance
leads, recovers live state (adopting tasks still running) before the first cycle; `close()`
stops the loop but leaves tasks running, to be adopted by the next start or by a standby.

With SQLite the lock is exclusive and the instance leads at once. With PostgreSQL several
instances may share one data directory (its task directories, where the supervisors record
what runs) and one database: the lock is shared among them (an SQLite instance, exclusive,
still keeps them out), and the lease decides which one schedules.

Every reason not to start (a data directory that is missing, foreign, read-only or full; a
damaged, foreign or newer database) is a `ServiceError` or `StoreError` of one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sqlalchemy.exc import SQLAlchemyError

from aisched.core.policy import Policy
from aisched.executors.base import Executor, unavailable
from aisched.predict.runtime import RuntimePredictor
from aisched.service import datadir
from aisched.service.autoscaler import Autoscaler
from aisched.service.config import ServiceConfig
from aisched.service.defaults import default_home
from aisched.service.health import Health, HealthCollector
from aisched.service.identity import Admins
from aisched.service.leader import LeaderCollector, Leadership
from aisched.service.loop import LoopConfig, Scheduler
from aisched.service.metrics import Metrics
from aisched.spec.units import parse_mem_mib
from aisched.store.db import Store, open_failure, shown
from aisched.store.lease import read_lease

log = logging.getLogger("aisched.service")


class ServiceError(RuntimeError):
    """The service cannot start (data directory in use, database unusable, bad node...)."""


@dataclass
class Service:
    config: ServiceConfig
    home: Path
    store: Store
    executor: Executor
    scheduler: Scheduler
    policy: Policy
    metrics: Metrics
    node_notes: list[str]
    lock_file: IO[str]
    database_lock: IO[Any] | None = None  # instances of one shared database (`datadir`)
    started_at: float = field(default_factory=time.time)
    recovery_notes: list[str] = field(default_factory=list)
    autoscaler: Autoscaler | None = None  # started with the loop
    admins: Admins = field(default_factory=Admins)
    health: Health = field(init=False)  # readiness: disk pressure, failing steps
    leadership: Leadership = field(init=False)
    # Called once when this instance is deposed (another leads now): `aisched up` stops.
    on_deposed: Callable[[str], None] = lambda _why: None
    announced: str | None = None

    def __post_init__(self) -> None:
        self.leadership = Leadership(
            self.store,
            on_elected=self._lead,
            on_deposed=self._deposed,
            on_given_back=self.scheduler.forget_recovery,
            times=self.config.lease_times(),
        )
        self.scheduler.on_deposed = self.leadership.deposed_by_write
        self.metrics.registry.register(LeaderCollector(self.leadership))
        self.health = Health(
            (("data", self.home), ("logs", self.home / "logs")),
            self.config.limits.disk_min_free_bytes(),
            self.scheduler.step_errors,
            lambda: self.scheduler.thread is not None and self.scheduler.thread.is_alive(),
            (lambda: unavailable(self.executor), self.leadership.problem),
            min_free_inodes=self.config.limits.disk_min_free_inodes,
        )
        self.metrics.registry.register(HealthCollector(self.health))
        self.scheduler.launch_hold = self.health.launch_hold

    @classmethod
    def open(cls, config: ServiceConfig, executor: Executor | None = None) -> Service:
        home = config.home()
        try:
            datadir.prepare(home)
            lock_file = _lock(home, shared=not config.database_url().startswith("sqlite"))
        except datadir.DataDirError as e:
            raise ServiceError(str(e)) from None
        try:
            datadir.check_space(
                home, config.limits.disk_min_free_bytes(), config.limits.disk_min_free_inodes
            )
            _private(home)
            (home / "logs").mkdir(exist_ok=True)
            _private_database(config.database_url())
            sqlite_lock = _lock_sqlite_file(config.database_url())
        except ServiceError:
            lock_file.close()
            raise
        except datadir.DataDirError as e:
            lock_file.close()
            raise ServiceError(str(e)) from None
        except OSError as e:
            lock_file.close()
            if e.filename is not None and not Path(os.fsdecode(e.filename)).is_relative_to(home):
                # The SQLite file of `database`, elsewhere: this said the data directory was
                # not writable ("No such file or directory"), of a directory that was.
                raise ServiceError(
                    f"cannot create the state database {os.fsdecode(e.filename)}: "
                    f"{e.strerror or e}; give a database file (--database, or database: in the "
                    "config file) in a directory that exists and this service may write"
                ) from None
            raise ServiceError(str(datadir.not_writable(home, e))) from None
        try:
            store = Store(
                config.database_url(),
                busy_timeout_s=config.limits.store_busy_timeout_s(),
                statement_timeout_s=config.limits.store_statement_timeout_s(),
                idle_tx_timeout_s=config.lease_times().ttl_s,
            )
            if store.migration_note:
                log.info("%s", store.migration_note)
                if store.shared:
                    _warn_older_instances(store)
            database_lock = (
                datadir.claim_for_database(home, store.instance_id())
                if store.shared
                else sqlite_lock
            )
            notes: list[str] = []
            if executor is None and config.ray is not None:
                executor, notes = _ray_executor(config, config.ray, home)
            elif executor is None:
                executor, notes = _local_executor(config, home)
            policy = config.build_policy()
            metrics = Metrics()
            scheduler = Scheduler(
                store,
                executor,
                policy,
                config.queue_tree(),
                LoopConfig(
                    data_dir=home,
                    cycle_interval_s=config.cycle_interval_s(),
                    eta_interval_s=config.eta_interval_s(),
                    max_backoff_s=config.max_backoff_s(),
                    elastic_grow_after_s=config.elastic_grow_after_s(),
                    lost_node_grace_s=config.lost_node_grace_s(),
                    base_env=base_env(),
                    instance=store.instance_id(),
                    user_max_jobs=config.limits.user_max_jobs,
                    user_max_job_bytes=config.limits.user_max_job_bytes_(),
                    keep_ended_s=config.limits.keep_ended_s(),
                    keep_audit_s=config.limits.keep_audit_s(),
                    user_max_ended_bytes=config.limits.user_max_ended_bytes_(),
                    user_max_running_log_bytes=config.limits.user_max_running_log_bytes_(home),
                    keep_attempts=config.limits.keep_attempts,
                ),
                on_cycle=metrics.observe_cycle,
                predictor=RuntimePredictor(background=True) if config.predict_runtimes else None,
            )
            metrics.watch(scheduler)
        except datadir.DataDirError as e:
            _close_all(lock_file, sqlite_lock)
            raise ServiceError(str(e)) from None
        except OSError as e:
            _close_all(lock_file, sqlite_lock)
            if e.filename is not None and Path(os.fsdecode(e.filename)).is_relative_to(home):
                raise ServiceError(str(datadir.not_writable(home, e))) from None
            raise
        except Exception:
            _close_all(lock_file, sqlite_lock)
            raise
        svc = cls(config, home, store, executor, scheduler, policy, metrics, notes, lock_file)
        svc.database_lock = database_lock
        svc.admins = Admins(frozenset(config.admins.users), frozenset(config.admins.groups))
        return svc

    def start(self, address: str = "") -> None:
        """Take part in the election; lead now if this instance may (always on SQLite), else
        stand by, serving reads, until the lease is free (see `service.leader`). `address` is
        this instance's API, as the others name it to clients."""
        try:
            self.leadership.start(address or str(self.home))
        except SQLAlchemyError as e:  # the lease's write, recovery's: a full disk, a lock
            raise ServiceError(open_failure(shown(self.config.database_url()), e)) from None

    def _lead(self) -> None:
        """Elected: recover (adopting what the last leader left running), then schedule."""
        self.recovery_notes = self.scheduler.recover()
        for note in self.recovery_notes:
            log.info("recovery: %s", note)
        self.scheduler.start()
        self.autoscaler = Autoscaler(
            self.scheduler,
            interval_s=self.config.autoscaler_interval_s(),
            metric_max_age_s=self.config.metric_max_age_s(),
        )
        self.autoscaler.start()
        if self.announced is not None:
            self.announce(self.announced)

    def _deposed(self, why: str) -> None:
        """Another instance leads now: stop scheduling at once (tasks go on; the leader
        adopts them), then let the owner stop this process."""
        self.scheduler.stopping.set()
        self.scheduler.wake.set()
        self.on_deposed(why)

    def announce(self, url: str) -> None:
        """Tell local clients where the API is (`aisched` reads it when no --server is given);
        on a shared data directory only the leader does, once it leads."""
        self.announced = url
        if not self.leadership.leading:
            return
        for path in self.announcements():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}), encoding="utf-8")
            tmp.replace(path)

    def announcements(self) -> list[Path]:
        """Where to say where the API is: the data directory, and the CLI's own home
        (`$AISCHED_HOME`, where it looks) when the service was given another `--data-dir`,
        if that directory is this user's alone (nothing is written through another's)."""
        paths = [self.home / "server.json"]
        home = default_home()
        if home.resolve() != self.home.resolve() and home.is_dir() and _ours_alone(home):
            paths.append(home / "server.json")
        return paths

    def close(self) -> None:
        if self.autoscaler is not None:
            self.autoscaler.close()
        self.scheduler.shutdown()
        self.leadership.stop()
        self.store.close()
        try:
            for path in self.announcements():
                forget_announcement(path)
        finally:
            self.lock_file.close()
            if self.database_lock is not None:
                self.database_lock.close()


# What a task inherits from the service's own environment when its job says nothing else.
_BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR")


def base_env() -> tuple[tuple[str, str], ...]:
    return tuple((k, os.environ[k]) for k in _BASE_ENV if k in os.environ)


def _warn_older_instances(store: Store) -> None:
    """After a migration of a shared database: the other instances of it run an older aisched,
    which cannot read what this one writes. A standby of them stops at its next look at the
    lease (`service.leader`); the leader goes on until it stops (docs/ha.md, Upgrading)."""
    with store.lease_tx() as conn:
        lease = read_lease(conn)
    holder = f"; the leader at {lease.address or lease.holder} among them" if lease.live else ""
    log.warning(
        "every other instance of this database must now run this aisched or a newer one%s: "
        "an older standby stops, and an older leader should be stopped once this instance "
        "stands by, so that it takes over (docs/ha.md, Upgrading)",
        holder,
    )


def _private(home: Path) -> None:
    """The data directory holds every job's command and environment: its owner's alone."""
    st = home.stat()
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o700:
        home.chmod(0o700)


def _private_database(url: str) -> None:
    """Create (or narrow) an SQLite file as 0600 before SQLite opens it: SQLite gives its WAL
    and shared-memory files the database file's mode, so all three stay private."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url == prefix + ":memory:":
        return
    path = url[len(prefix) :]
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except PermissionError as e:  # the file, not its directory (that is checked, and named)
        raise datadir.unwritable_file(Path(path), e, "the state database") from None
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    # SQLite writes both beside the database: one it may not write failed the start as "the
    # state database cannot be opened for writing", of a database that could be.
    for extra, what in ((path + "-wal", "write-ahead log"), (path + "-shm", "shared memory")):
        try:
            os.close(os.open(extra, os.O_RDWR))
        except FileNotFoundError:
            continue  # SQLite makes it, with the database's mode
        except PermissionError as e:
            raise datadir.unwritable_file(
                Path(extra), e, f"the state database's {what} file"
            ) from None
        with contextlib.suppress(OSError):
            os.chmod(extra, 0o600)


def _close_all(*files: IO[Any] | None) -> None:
    for f in files:
        if f is not None:
            f.close()


def _lock_sqlite_file(url: str) -> IO[str] | None:
    """Hold `FILE.lock` beside an SQLite database, exclusive, for the service's life: the data
    directory's lock keeps a second instance off the directory, but one given another
    --data-dir and this file as --database would schedule on it too (adopting the first one's
    tasks, recording their ends twice). Not a lock on the file itself: SQLite's own locks are
    POSIX locks, which a process loses when it closes any descriptor of the file."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url == prefix + ":memory:":
        return None
    path = url[len(prefix) :] + ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # private, as the database's files
    f = os.fdopen(fd, "a+", encoding="utf-8", errors="replace")  # held for its life
    if (holder := _held_by_another(f)) is not None:
        raise ServiceError(
            f"the state database {url[len(prefix) :]} is in use by another aisched "
            f"(pid {holder or 'unknown'}) with another data directory: an SQLite database "
            "has one service; stop that one, or give this one another --database"
        )
    try:
        _write_pid(f)
    except OSError:
        f.close()
        raise
    return f


def _ours_alone(path: Path) -> bool:
    try:
        mine = path.stat().st_uid == os.geteuid()
    except OSError:
        return False
    return mine and datadir.exposed_place(path) is None


def forget_announcement(path: Path) -> None:
    """Remove server.json if it is this process's (a standby beside us may have taken over)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(doc, dict) and doc.get("pid") == os.getpid():
        # A data directory turned read-only keeps it, naming a pid that is gone: a client
        # then finds no server there, as after a kill -9; the stop itself goes on.
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _lock(home: Path, *, shared: bool = False) -> IO[str]:
    """The data directory's lock: exclusive for an SQLite instance; shared among instances of
    one PostgreSQL database (the lease, not this lock, keeps them from scheduling at once)."""
    try:
        f = open(home / "lock", "a+", encoding="utf-8")  # noqa: SIM115 - held for its life
    except OSError as e:
        raise datadir.not_writable(home, e) from None
    if (holder := _held_by_another(f, shared=shared)) is not None:
        who = (
            f"a running aisched (pid {holder}); stop it"
            if holder
            else "running aisched instances of a shared database (they write no pid); stop them"
        )
        raise ServiceError(
            f"the data directory {home} is in use by {who}, or give another --data-dir"
        )
    if shared:
        return f  # several holders: no single pid to write
    try:
        _write_pid(f)
    except OSError as e:
        f.close()
        raise datadir.not_writable(home, e) from None
    return f


def _held_by_another(f: IO[str], *, shared: bool = False) -> str | None:
    """Lock the lock file `f` (exclusive, or shared), without waiting. When another process
    holds it: `f` closed, and the pid its holder wrote there ("" where none did); else None."""
    try:
        fcntl.flock(f.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        return holder
    return None


def _write_pid(f: IO[Any]) -> None:
    """This process's pid as a lock file's whole content, unbuffered: a buffered write that
    failed (a full disk) failed again when the file was closed, a traceback."""
    os.ftruncate(f.fileno(), 0)
    os.pwrite(f.fileno(), str(os.getpid()).encode(), 0)


def _local_executor(config: ServiceConfig, home: Path) -> tuple[Executor, list[str]]:
    from aisched.executors.cgroups import MemoryControlError
    from aisched.executors.discovery import DiscoveryError, discover_node
    from aisched.executors.gpu_walls import GpuWallError
    from aisched.executors.gpu_watchdog import GpuMemoryWatchdog, OverAction
    from aisched.executors.instance import InstanceTagError
    from aisched.executors.local import LocalExecutor

    n = config.node
    # discover_node's arguments, by the `node` keys that give them.
    keys = {
        "name": "name",
        "gpus": "gpus",
        "gpu_model": "gpu_model",
        "gpu_mem_mib": "gpu_mem",
        "cpus": "cpus",
        "mem_mib": "mem",
    }
    try:
        node, notes = discover_node(
            n.name,
            gpus=n.gpus,
            gpu_model=n.gpu_model,
            gpu_mem_mib=None if n.gpu_mem is None else parse_mem_mib(n.gpu_mem, "node.gpu_mem"),
            cpus=n.cpus,
            mem_mib=None if n.mem is None else parse_mem_mib(n.mem, "node.mem"),
            names={arg: config.node_key_named(key)[1] for arg, key in keys.items()},
        )
    except DiscoveryError as e:
        # Led by where the key was given: `--gpu-model: ...`, `FILE: node.gpu_model: ...`.
        raise ServiceError(config.node_key_named(keys[e.key])[0] + str(e)) from None
    watchdog = GpuMemoryWatchdog.with_nvml(OverAction(config.gpu_memory_over))
    try:
        executor = LocalExecutor(
            home / "tasks",
            node,
            mem_mechanism=config.memory_limit,
            gpu_watchdog=watchdog,
            container_runtime=config.container_runtime,
            oci_runtime=config.oci_runtime,
            image_pull=config.image_pull,
            container_pids_limit=config.container_pids_limit,
            task_pids_limit=config.task_pids_limit,
            user_pids_limit=config.user_pids_limit,
            log_max_bytes=config.limits.log_max_bytes(),
            log_max_files=config.limits.log_max_files,
            shm_max_mib=config.limits.shm_max_mib(),
            gpu_device_files=n.gpu_device_files,
        )
    except (GpuWallError, InstanceTagError) as e:
        raise ServiceError(str(e)) from None
    except MemoryControlError as e:  # a mechanism named that this machine does not have
        raise ServiceError(f"memory_limit: {e}") from None
    notes += [n for n in (executor.gpu_note, executor.shm_note) if n is not None]
    if config.container_runtime == "none":
        return executor, [*notes, "container tasks: off (container_runtime: none)"]
    # Probed now, so the start-up lines say what container tasks will run with.
    engine = executor.detect_containers()
    found = engine.notes if engine is not None else executor.info().notes[-1:]
    return executor, [*notes, *found]


def _ray_auth(address: str, allow_open: bool) -> str:
    """The start-up line on Ray's token authentication; a ServiceError when the cluster takes
    requests without a token and this service runs other users' jobs (as root), unless the
    operator said to allow that (`ray_allow_unauthenticated`)."""
    from aisched.executors.ray_auth import RayAuthUnknown, open_to_anyone

    try:
        is_open = open_to_anyone(address)
    except RayAuthUnknown as e:
        is_open, why = True, f"could not tell whether it asks for a token ({e})"
    else:
        why = "takes requests without a token"
    if not is_open:
        return "Ray: the cluster asks for its token (RAY_AUTH_MODE=token)"
    risk = (
        f"the Ray cluster at {address} {why}: any local user of its machines who reaches it "
        "could run commands as root there, or as another user (docs/ray.md, Security)"
    )
    if os.geteuid() == 0 and not allow_open:
        raise ServiceError(
            f"{risk}. Start Ray with RAY_AUTH_MODE=token on every node and aisched up with "
            "its token (RAY_AUTH_TOKEN, or ~/.ray/auth_token), or set "
            "ray_allow_unauthenticated: true to accept that"
        )
    return f"Ray: {risk}"


def _ray_executor(config: ServiceConfig, address: str, home: Path) -> tuple[Executor, list[str]]:
    from aisched.executors.gpu_watchdog import GpuMemoryWatchdog, OverAction

    # Imported only here: without --ray nothing imports Ray (it is an optional extra).
    try:
        from aisched.executors import ray_executor
    except ImportError as e:
        raise ServiceError(
            f"--ray needs Ray, which is not installed ({e}); "
            "install it with: pip install 'aisched[ray]'"
        ) from None
    try:
        ray_executor.connect(address)
    except ray_executor.RayConnectError as e:
        raise ServiceError(str(e)) from None
    auth_note = _ray_auth(address, config.ray_allow_unauthenticated)
    executor = ray_executor.RayExecutor(
        ray_executor.namespace_for(str(home.resolve())),
        start_timeout_s=config.ray_start_timeout_s(),
        log_max_bytes=config.limits.log_max_bytes(),
        log_max_files=config.limits.log_max_files,
        memory_limit=config.memory_limit,
        task_pids_limit=config.task_pids_limit,
        user_pids_limit=config.user_pids_limit,
        shm_max_mib=config.limits.shm_max_mib(),
        # Made on each task's node, where NVML sees the task's processes.
        gpu_watchdog=functools.partial(
            GpuMemoryWatchdog.with_nvml, OverAction(config.gpu_memory_over)
        ),
    )
    if not executor.nodes():
        raise ServiceError(
            f"the Ray cluster at {address} has no node with CPUs or GPUs to schedule on"
        )
    temp_note = [executor.temp_note] if executor.temp_note else []
    return executor, [f"Ray cluster at {address}", auth_note, *temp_note]

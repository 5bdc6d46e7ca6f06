"""The service autoscaler: watches replicas, gathers their load, asks the loop to scale.

A thread of its own, because it waits on the network (readiness probes, metric scrapes) and
the loop must not. It never changes live state: it reads the loop's jobs (as the API's
readers do) and sends `Scheduler.scale` commands, which the loop applies in its own thread and
writes before acting. The rule itself is the pure `core.autoscale.decide`.

Every `interval_s`, for each running service:

1. Probe each running replica: GET `readiness_path` on its port (2xx: ready); without a path
   a running replica is ready. Scrape `metrics_path` of each ready replica when the service
   names one: JSON such as `{"rps": 12.5}`, or Prometheus text with an `rps` or `latency_ms`
   gauge.
2. The load: a figure pushed for the whole service (`POST /v1/jobs/{id}/metrics`), if fresh;
   else the ready replicas' scraped or pushed figures (rps summed, latency averaged). For rps
   the rule sees the total spread over the live replicas.
3. `decide`.
4. If the answer differs from the live count, `scale`; publish the service's status. A
   scale-down does not wait for replicas that are starting: the loop takes pending ones first,
   then running ones found not ready this round, then the newest ready ones. (It once waited
   until every replica was ready, so a replica that never got room, or never answered its
   probe, held the service at its largest count for good.)

Figures older than `metric_max_age_s` are ignored; with none fresh the count is held.

Each user's services are gone through in a round of that user's own, on a worker thread, and a
user whose last round is still going gets no new one: a user's replicas that take their whole
timeout to answer, hundreds of them, delay that user's scaling only, never another user's.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from aisched.core.autoscale import Recommendation, decide
from aisched.lifecycle.services import CRASH_RESET_S
from aisched.model.job import JobKind
from aisched.model.service import ScaleMetric, ServiceSpec
from aisched.model.states import JobState
from aisched.service.listeners import accepting_uid, is_loopback, peer_uid, uid_of
from aisched.service.live import LiveJob, TaskPhase
from aisched.service.loop import Scheduler
from aisched.service.replicas import replica_port
from aisched.service.scheduler_state import clock

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

log = logging.getLogger("aisched.autoscaler")

METRIC_NAMES = frozenset(m.value for m in ScaleMetric)
# GET url, from a server owned by one of the uids when they are given → (status, body); a
# connection failure, or a server of another owner, is status 0.
Fetch = Callable[[str, float, frozenset[int] | None], tuple[int, bytes]]
# Users whose rounds run at once; the others' wait for a worker (one user never holds two).
MAX_ROUNDS = 32


def http_get(url: str, timeout_s: float, owners: frozenset[int] | None = None) -> tuple[int, bytes]:
    """One GET, straight to the replica (no proxy from the environment, no redirect), over
    within `timeout_s` in all: a replica that drips its answer a byte at a time, each before
    a read's own timeout, must not hold the autoscaler (one thread for every user's services)
    for hours. With `owners`, the answer counts only if the process that accepted the
    connection belongs to one of them (`listeners.peer_uid`): checked on the connection
    itself, so a process of another user that took the port in between is never heard."""
    parts = urllib.parse.urlsplit(url)
    conn = _DeadlineConnection(parts.hostname or "", parts.port, time.monotonic() + timeout_s)
    try:
        conn.connect()
        if owners is not None and conn.sock is not None:
            uid = peer_uid(conn.sock)
            if uid is not None and uid not in owners:
                return 0, b""
        query = f"?{parts.query}" if parts.query else ""  # `/metrics?format=json` asks with it
        conn.request("GET", (parts.path or "/") + query)
        r = conn.getresponse()
        return int(r.status), r.read(1 << 16)
    except (OSError, ValueError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


class _DeadlineSocket(socket.socket):
    """A socket whose every read waits only for what is left of one deadline (a plain
    socket's timeout bounds each read, not the answer)."""

    deadline: float

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer took longer than its timeout")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


class _DeadlineConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, deadline: float) -> None:
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.0))
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        plain = self.sock
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.deadline = self.deadline
        self.sock = sock


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    replicas: int  # live replicas, not being scaled away
    ready: int
    desired: int
    load: float | None
    reason: str
    endpoints: tuple[str, ...]  # host:port of the ready replicas


class MetricError(ValueError):
    """A pushed metric document that is not `{name: number}` with known names."""


class Autoscaler:
    def __init__(
        self,
        scheduler: Scheduler,
        *,
        interval_s: float = 1.0,
        metric_max_age_s: float = 10.0,
        probe_timeout_s: float = 0.5,
        clock: Callable[[], float] = time.time,
        fetch: Fetch = http_get,
    ) -> None:
        self.scheduler = scheduler
        self.interval_s = interval_s
        self.metric_max_age_s = metric_max_age_s
        self.probe_timeout_s = probe_timeout_s
        self.clock = clock
        self.fetch = fetch
        self.lock = threading.Lock()  # guards samples and statuses (API threads push and read)
        # (service id, replica id or "" for the service as a whole) → (time, {metric: value})
        self.samples: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}
        self.statuses: dict[str, ServiceStatus] = {}
        self.history: dict[str, list[Recommendation]] = {}
        self.squatters: set[tuple[str, int]] = set()  # (replica, uid) already logged
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.workers = ThreadPoolExecutor(MAX_ROUNDS, thread_name_prefix="aisched-autoscaler")
        self.rounds: dict[str, Future[None]] = {}  # user → their round, running or queued

    # --- any thread -------------------------------------------------------------------------

    def push(self, job_id: str, values: Mapping[str, object]) -> str:
        """Record load figures reported for a service or one of its replicas; returns the
        service's id. KeyError if `job_id` is neither a running service nor a live replica;
        MetricError naming the field if `values` is not a metric document."""
        figures = parse_metrics(values)
        lj = self.scheduler.jobs.get(job_id)
        if lj is None:
            raise KeyError(job_id)
        if lj.job.kind == JobKind.SERVICE:
            key = (job_id, "")
        elif lj.job.replica_of is not None:
            key = (lj.job.replica_of, job_id)
        else:
            raise KeyError(job_id)
        with self.lock:
            self.samples[key] = (self.clock(), figures)
        return key[0]

    def status(self, service_id: str) -> ServiceStatus | None:
        with self.lock:
            return self.statuses.get(service_id)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="aisched-autoscaler", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(5.0)
        self.workers.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.tick(wait_s=self.interval_s)
            except Exception:  # a bug must not stop scaling for good; it is logged loudly
                log.exception("autoscaler round failed")

    # --- the autoscaler's thread ------------------------------------------------------------

    def tick(self, wait_s: float | None = None) -> None:
        """One round over every running service (steps 1-4 of the module docstring), a round
        per user; waits up to `wait_s` (None: until they are over) for the rounds it started."""
        services = [
            lj
            for lj in list(self.scheduler.jobs.values())
            if lj.job.kind == JobKind.SERVICE
            and lj.state == JobState.RUNNING
            and lj.stopping is None  # not being cancelled
            and lj.job.service is not None
        ]
        by_user: dict[str, list[LiveJob]] = {}
        for svc in services:
            by_user.setdefault(svc.job.user, []).append(svc)
        self.rounds = {u: f for u, f in self.rounds.items() if not f.done()}
        started: list[Future[None]] = []
        for user, theirs in by_user.items():
            if user not in self.rounds:  # else it is still at its last round
                self.rounds[user] = self.workers.submit(self._round, theirs)
                started.append(self.rounds[user])
        wait(started, timeout=wait_s)
        alive = {s.id for s in services}
        with self.lock:
            for key in [k for k in self.samples if k[0] not in alive]:
                del self.samples[key]
            for sid in [s for s in self.statuses if s not in alive]:
                del self.statuses[sid]
        # Snapshots: rounds still going add to both meanwhile.
        for sid in [s for s in list(self.history) if s not in alive]:
            self.history.pop(sid, None)
        self.squatters = {(r, u) for r, u in list(self.squatters) if r in self.scheduler.jobs}

    def _round(self, services: list[LiveJob]) -> None:
        """One user's services, one after another; given up when the autoscaler closes (its
        workers are waited for at exit, and a round may take a while)."""
        for svc in services:
            if self.stopping.is_set():
                return
            try:
                self._one(svc)
            except Exception:  # one service's bug or figures must not stop the others' scaling
                log.exception("autoscaler: service %s failed this round", svc.id)

    def _one(self, svc: LiveJob) -> None:
        spec = svc.job.service
        assert spec is not None
        replicas = self.scheduler.replicas_of(svc.id)
        ready: list[tuple[str, str]] = []  # (replica id, host:port)
        scraped: dict[str, dict[str, float]] = {}
        for r in replicas:
            if self.stopping.is_set():
                return
            port = replica_port(r.job)
            if port is None or not _running(r):
                continue
            # Its node's address: loopback here, the node's own on a cluster of machines.
            host = self.scheduler.node_address(r.tasks[0].binding.node)
            where = f"{host}:{port}"
            # On this machine the kernel says whose a port is (else: another machine's).
            owners: frozenset[int] | None = None
            if is_loopback(host):
                owners = frozenset({0, uid_of(r.job.user, os.geteuid())})
            ready_now = self._ready(spec, where, owners)
            # A probe that answered was checked on its own connection; without one (no
            # readiness path), or when it failed, ask whose process takes the port (and say so).
            probed = ready_now and spec.readiness_path is not None
            if owners is not None and not probed and self._held_by_another(r, host, port, owners):
                # The replica cannot listen there: one on another port takes its place.
                why = f"replica {r.id}'s port {port} is held by another user"
                self.scheduler.scale(svc.id, len(replicas), why, replace=r.id)
                continue
            if not ready_now:
                continue
            ready.append((r.id, where))
            if spec.metrics_path is not None:
                figures = self._scrape(spec.metrics_path, where, owners)
                if figures:
                    scraped[r.id] = figures
        now = self.clock()
        load = self._load(svc.id, spec, [rid for rid, _ in ready], scraped, now, len(replicas))
        decision, self.history[svc.id] = decide(
            spec, len(replicas), load, self.history.get(svc.id, []), now
        )
        desired, reason = decision.desired, decision.reason
        if desired != len(replicas):
            # A scale-down goes ahead while replicas start: they are the ones that go first.
            self.scheduler.scale(svc.id, desired, reason, ready=frozenset(r for r, _ in ready))
        run = svc.crash_loop
        if run is not None and now < run.until + CRASH_RESET_S:  # the run is not over
            reason = f"{reason}; {run.waiting_note(clock) if now < run.until else run.note()}"
        endpoints = tuple(where for _, where in ready)
        with self.lock:
            self.statuses[svc.id] = ServiceStatus(
                len(replicas), len(ready), desired, load, reason, endpoints
            )

    def _held_by_another(
        self, replica: LiveJob, host: str, port: int, owners: frozenset[int]
    ) -> bool:
        """Whether a process of another user than the replica's (`owners`: its user, and
        root, whose engine holds a container's published port) accepts connections to its
        port. Such a replica is not ready: neither probed, scraped nor listed as an endpoint,
        and is replaced by one on another port. (One that takes the port after this look is
        caught by `http_get` on the connection.)"""
        uid = accepting_uid(host, port, self.probe_timeout_s)
        others = set() if uid is None or uid in owners else {uid}
        for uid in sorted(others):
            if (replica.id, uid) in self.squatters:
                continue
            self.squatters.add((replica.id, uid))
            log.warning(
                "replica %s of service %s: its port %d is held by uid %d, not by its user "
                "%s: not taken as ready, replaced by one on another port",
                replica.id,
                replica.job.replica_of,
                port,
                uid,
                replica.job.user,
            )
        return bool(others)

    def _ready(self, spec: ServiceSpec, where: str, owners: frozenset[int] | None) -> bool:
        if spec.readiness_path is None:
            return True
        url = f"http://{where}{spec.readiness_path}"
        status, _ = self.fetch(url, self.probe_timeout_s, owners)
        return 200 <= status < 300

    def _scrape(
        self, path: str, where: str, owners: frozenset[int] | None
    ) -> dict[str, float] | None:
        status, body = self.fetch(f"http://{where}{path}", self.probe_timeout_s, owners)
        if not 200 <= status < 300:
            return None
        try:
            return parse_scrape(body)
        except (ValueError, TypeError, RecursionError):  # a replica's page is untrusted too
            return None

    def _load(
        self,
        service_id: str,
        spec: ServiceSpec,
        ready: list[str],
        scraped: dict[str, dict[str, float]],
        now: float,
        live: int,
    ) -> float | None:
        """Step 2: per-replica rps (the total when no replica is live), or latency."""
        name = spec.metric.value
        with self.lock:
            pushed = {
                rid: figs
                for (sid, rid), (t, figs) in self.samples.items()
                if sid == service_id and now - t <= self.metric_max_age_s and name in figs
            }
        whole = pushed.get("", {}).get(name)
        if whole is None:
            values = [(scraped.get(rid) or pushed.get(rid) or {}).get(name) for rid in ready]
            known = [v for v in values if v is not None]
            if not known:
                return None
            whole = sum(known) if spec.metric == ScaleMetric.RPS else sum(known) / len(known)
        if spec.metric == ScaleMetric.RPS and live > 0:
            return whole / live
        return whole


def parse_metrics(values: object) -> dict[str, float]:
    """`{"rps": 12.5}` or `{"latency_ms": 80}` (either or both) as floats; MetricError names
    the field that is wrong."""
    if not isinstance(values, Mapping) or not values:
        raise MetricError(
            f'expected an object such as {{"rps": 12.5}}; names: {", ".join(sorted(METRIC_NAMES))}'
        )
    out: dict[str, float] = {}
    for k, v in values.items():
        if k not in METRIC_NAMES:
            raise MetricError(f"{k}: unknown metric; one of {', '.join(sorted(METRIC_NAMES))}")
        bad = MetricError(f"{k}: expected a number of at least 0, got {_cut(repr(v))}")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise bad
        try:
            number = float(v)  # an int past a float's range overflows
        except OverflowError:
            raise bad from None
        if not math.isfinite(number) or number < 0:
            raise bad
        out[str(k)] = number
    return out


def _cut(text: str, most: int = 40) -> str:
    return text if len(text) <= most else text[:most] + "..."


def parse_scrape(body: bytes) -> dict[str, float]:
    """A replica's metrics page: the JSON document of `parse_metrics`, or the Prometheus text
    format (what most model servers expose) with gauges named `rps` and/or `latency_ms`;
    samples of one name under several label sets are summed for rps and averaged for latency.
    Other metrics on the page are ignored. MetricError when neither format gives a figure."""
    text = body.decode("utf-8").strip()
    if text.startswith("{"):
        return parse_metrics(json.loads(text))
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in METRIC_NAMES:
                found.setdefault(sample.name, []).append(float(sample.value))
    if not found:
        raise MetricError(
            f"no JSON object and no Prometheus sample named {' or '.join(sorted(METRIC_NAMES))}"
        )
    return parse_metrics(
        {
            name: sum(vs) if name == ScaleMetric.RPS.value else sum(vs) / len(vs)
            for name, vs in found.items()
        }
    )


def _running(r: LiveJob) -> bool:
    return (
        r.state == JobState.RUNNING
        and r.stopping is None
        and bool(r.tasks)
        and all(t.phase == TaskPhase.RUNNING for t in r.tasks)
    )

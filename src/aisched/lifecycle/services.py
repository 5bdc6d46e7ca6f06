"""A service's replicas: how one is made from its service, the same in both drivers.

A service job never runs a task itself; its work is its replicas, ordinary jobs (kind `infer`,
restart policy `always`) that are placed, preempted and restarted like any other. A service
starts (RUNNING, holding nothing) at its submission, or once its dependencies are met, with
`min_replicas` replicas. A replica learns its port through `AISCHED_SERVICE_PORT`, chosen when
it is made (the live service picks a free one; the simulator has none to pick, and uses 0).

Scaling: a count asked for is held within the service's `[min_replicas, max_replicas]`
(`replicas_within`); new replicas are made for a larger count, and for a smaller one the
surplus goes pending replicas first (they hold nothing), then running ones that do not yet
answer their readiness probe, then the newest running ones (`surplus`). Who asks is the live
service's autoscaler (`service.autoscaler`, its rule the pure `core.autoscale.decide`), from
load it measures on the running replicas (readiness probes, scraped or pushed rps and
latency). The simulator does not model it, and says so: no trace it
reads carries a service's load over time, and a load model made up for it would decide the
result; so in the simulator a service keeps its minimum of replicas.

A replica has no runtime to predict: it serves until its service scales down or is cancelled
(`Job.serves_until_scaled_down`). Neither driver asks its predictor about one, so it runs with
no expected end, as a job of unknown length does; and no reservation waits for one to end
(`core.reservation`).

Crash loops (Kubernetes' CrashLoopBackOff is the model): a replica that fails for good (its
own retries used up) is replaced (by the live service's autoscaler, which keeps at least the
minimum; by the simulator at the failure), but the replacement waits, and the wait doubles with each
replica of the service that failed in a row: `backoff × 2^(n−1)` after the *n*-th, from the
service's restart backoff (at least `MIN_REPLACEMENT_WAIT_S`, so `backoff: 0` cannot spin),
capped by the driver's `max_backoff_s`. The run is over once a failure comes more than
`CRASH_RESET_S` after the last replacement could start: that replica served a while. The run
is worked out from the failed replicas' ends alone (`replica_failed`, folded over them), so a
restarted driver derives it again from what it stored. The service itself never fails of it:
like a Deployment in a crash loop it keeps asking, at most once per `max_backoff_s`.
This wait is for replicas that *failed for good*; a replica whose task exits cleanly is
restarted as any job under `always` is (`attempts.restart_wait_s`: its own quick exits
double its own wait), so no end is waited for twice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from aisched.lifecycle.attempts import LONG_RUN_S, MIN_RESTART_WAIT_S, retry_wait_s
from aisched.model.job import Job, JobKind, RestartPolicy
from aisched.model.service import ServiceSpec

PORT_ENV = "AISCHED_SERVICE_PORT"
SERVICE_ENV = "AISCHED_SERVICE_ID"
# A replica that fails this long after its replacement wait was over starts a new run of
# failures (Kubernetes resets a container's backoff after it ran 10 minutes); the same span
# ends a job's run of quick exits under `always` (`attempts`).
CRASH_RESET_S = LONG_RUN_S
# The least a replacement waits after a failed replica, whatever the service's backoff.
MIN_REPLACEMENT_WAIT_S = MIN_RESTART_WAIT_S


@dataclass(frozen=True, slots=True)
class CrashLoop:
    """A service's replicas that failed one after another, and when a new one may start."""

    failed: int  # replicas of the service that failed in a row, the last one included
    last_id: str  # the last one to fail
    last_why: str  # and why (its end's message)
    last_at: float  # and when
    until: float  # no new replica of the service starts before this

    def note(self) -> str:
        """The run in words, for the service's status and events."""
        row = "" if self.failed == 1 else f" ({self.failed} replicas failed in a row)"
        return f"replica {self.last_id} failed: {self.last_why}{row}"

    def waiting_note(self, clock: Callable[[float], str]) -> str:
        """The run and the wait it imposes, in the same words wherever they are shown (the
        service's event, status and scaling, a held replica's reason); `clock` words a time
        (the driver's: this module reads no clock and no time zone)."""
        return f"{self.note()}: a new replica starts not before {clock(self.until)}"


def replica_job(service: Job, name: str, port: int) -> Job:
    """A replica of `service` (id and submit time are the driver's to set)."""
    extra = ((PORT_ENV, str(port)), (SERVICE_ENV, service.id))
    return replace(
        service,
        id="",
        name=name,
        kind=JobKind.INFER,
        service=None,
        replica_of=service.id,
        restart_policy=RestartPolicy.ALWAYS,
        depends_on=(),
        groups=tuple(replace(g, env=(*g.env, *extra)) for g in service.groups),
    )


def replacement_wait_s(service: Job, failed: int, max_backoff_s: float) -> float:
    """How long a new replica waits after the `failed`-th replica of `service` in a row
    failed: the restart backoff doubled per failure, at least `MIN_REPLACEMENT_WAIT_S`,
    capped by `max_backoff_s`."""
    base = replace(service, backoff_s=max(service.backoff_s, MIN_REPLACEMENT_WAIT_S))
    return retry_wait_s(base, failed, max_backoff_s)


def replica_failed(
    was: CrashLoop | None,
    service: Job,
    replica_id: str,
    why: str,
    at: float,
    max_backoff_s: float,
) -> CrashLoop:
    """The run after replica `replica_id` of `service` failed at `at` for `why`; `was` is the
    run before it (None: no replica had failed). A failure more than `CRASH_RESET_S` after
    the last run's wait was over starts a new run."""
    failed = 1
    if was is not None and at - was.until < CRASH_RESET_S:
        failed = was.failed + 1
    until = at + replacement_wait_s(service, failed, max_backoff_s)
    return CrashLoop(failed, replica_id, why, at, until)


def crash_loop_of(
    service: Job, ends: Sequence[tuple[str, float, str]], max_backoff_s: float
) -> CrashLoop | None:
    """The run that the failed replicas of `service`, (id, end time, why) oldest end first,
    leave: what a driver derives again after a restart."""
    run: CrashLoop | None = None
    for replica_id, at, why in ends:
        run = replica_failed(run, service, replica_id, why, at, max_backoff_s)
    return run


def replica_name(service: Job, job_id: str) -> str:
    """The name a replica with id `job_id` gets."""
    return f"{service.name}-r{job_id}"


def replicas_within(spec: ServiceSpec, asked: int) -> int:
    """The replica count kept when `asked` is asked for: held within the service's bounds."""
    return min(max(asked, spec.min_replicas), spec.max_replicas)


def surplus(
    live: Sequence[tuple[str, bool]], keep: int, ready: Collection[str] | None = None
) -> list[str]:
    """Which of the `live` replicas (id, running), numeric ids, go when only `keep` stay:
    pending ones first, then running ones not `ready` (those that answer their readiness
    probe; None: every running one), then the newest running ones."""
    order = sorted(live, key=lambda r: (r[1], ready is None or r[0] in ready, -int(r[0])))
    return [job_id for job_id, _ in order[: max(len(live) - keep, 0)]]

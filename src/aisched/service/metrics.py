"""Prometheus metrics, named after the Prometheus conventions: an `aisched_` prefix, the unit in
the name in base units (`_seconds`, `_bytes`, `_ratio`; GPUs and CPU cores are counted things),
`_total` on counters, labels for the dimensions (never one metric per queue or node).

Most figures are read from the scheduler when scraped (a custom collector), so they are always
current and cost nothing between scrapes; the cycle duration, the preemptions and the queueing
delay are fed by the loop after each cycle. Each service has its own registry, so several
services in one process (tests) do not clash. docs/service.md lists every metric, and
docs/grafana/aisched.json is a dashboard over them: rename one, and update both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aisched import __version__
from aisched.core.cycle import CycleResult
from aisched.core.session import usage_vector
from aisched.model.resources import Dim
from aisched.service.loop import Scheduler
from aisched.service.user_limits import (
    OTHERS,
    USERS_SHOWN,
    governed,
    in_unit,
    user_holdings,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LIVE_STATES = ("pending", "running")
FINAL_STATES = ("succeeded", "failed", "cancelled")
# Seconds; from a job that starts at once to one that waited a day.
DELAY_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        # A job moving from live to finished between two reads could make the sum dip; a
        # counter must never go down, so the highest value reported is kept.
        self._submitted_high = 0

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        info = GaugeMetricFamily(
            "aisched_build_info", "Version and policy of the service.", labels=["version", "policy"]
        )
        info.add_metric([__version__, s.policy.name], 1)
        yield info
        finished_counts = dict(s.terminal_counts)
        live, per_queue = s.live_summary()
        jobs = GaugeMetricFamily("aisched_jobs", "Live jobs by state.", labels=["state"])
        for state in LIVE_STATES:
            jobs.add_metric([state], live.get(state, 0))
        yield jobs
        finished = CounterMetricFamily(
            "aisched_jobs_finished", "Jobs that ended, by final state.", labels=["state"]
        )
        for state in FINAL_STATES:
            finished.add_metric([state], finished_counts.get(state, 0))
        yield finished
        submitted = sum(live.values()) + sum(finished_counts.values())
        self._submitted_high = max(self._submitted_high, submitted)
        yield CounterMetricFamily(
            "aisched_jobs_submitted", "Jobs accepted by the service.", value=self._submitted_high
        )
        yield CounterMetricFamily(
            "aisched_jobs_held_for_cycle_errors",
            "Times a job was held back because the scheduling cycle failed on it alone (a bug; "
            "the other jobs were scheduled without it).",
            value=s.stats.held_for_cycle_errors,
        )
        yield CounterMetricFamily(
            "aisched_jobs_held_for_step_errors",
            "Times a job was left alone for a while because handling its task exit, its timers "
            "(time limit, backoff, victims) or its dependencies raised (a bug; the other jobs "
            "went on).",
            value=s.stats.held_for_step_errors,
        )
        forgotten = CounterMetricFamily(
            "aisched_jobs_forgotten",
            "Ended jobs forgotten since the start (rows and files), by why: limits.keep_ended, "
            "or their user's ended jobs past limits.user_max_ended_bytes.",
            labels=["why"],
        )
        forgotten.add_metric(["keep_ended"], s.retention.forgotten_by_age)
        forgotten.add_metric(["user_max_ended_bytes"], s.retention.forgotten_by_bytes)
        yield forgotten
        yield CounterMetricFamily(
            "aisched_jobs_stopped_for_logs",
            "Running jobs stopped (failed, not retried) because their user's running jobs' logs "
            "took more than limits.user_max_running_log_bytes.",
            value=s.running_logs.stopped,
        )
        yield from self._queues(per_queue)
        yield from self._allocation()
        yield self._gpus()
        yield from self._predictor()

    def _predictor(self) -> Iterator[Metric]:
        """The runtime predictor's running score over recent finished jobs (issue 19): the share
        whose runtime was at or under the upper bound they were given, and the point estimate's
        median error ratio max(pred/true, true/pred). Nothing without a predictor."""
        p = self.scheduler.predictor
        if p is None:
            return
        score = p.score
        yield GaugeMetricFamily(
            "aisched_predictor_scored_jobs",
            "Finished jobs whose runtime prediction was scored.",
            value=score.scored,
        )
        if score.coverage is not None:
            yield GaugeMetricFamily(
                "aisched_predictor_coverage_ratio",
                "Share of recent finished jobs whose runtime was at or under the predicted "
                "upper bound (nominally the predictor's upper quantile).",
                value=score.coverage,
            )
        if score.median_error_ratio is not None:
            yield GaugeMetricFamily(
                "aisched_predictor_median_error_ratio",
                "Median of max(predicted/true, true/predicted) runtime over recent finished jobs.",
                value=score.median_error_ratio,
            )

    def _queues(self, per_queue: dict[str, tuple[int, int]]) -> Iterator[Metric]:
        s = self.scheduler
        pending = GaugeMetricFamily(
            "aisched_queue_pending_jobs", "Jobs waiting in each queue.", labels=["queue"]
        )
        running = GaugeMetricFamily(
            "aisched_queue_running_jobs", "Jobs running from each queue.", labels=["queue"]
        )
        names = sorted({q.name for q in s.queues.queues} | set(per_queue))
        for name in names:
            p, r = per_queue.get(name, (0, 0))
            pending.add_metric([name], p)
            running.add_metric([name], r)
        yield pending
        yield running
        used: dict[str, float] = {}
        for (qname, _user), usage in list(s.usage.items()):
            path = s.queues.path(qname) if s.queues.has(qname) else (qname,)
            for name in path:  # a queue's usage includes its descendants'
                used[name] = used.get(name, 0.0) + usage[2] / 1000
        allocated = GaugeMetricFamily(
            "aisched_queue_allocated_gpus",
            "GPUs allocated to each queue's running jobs (its descendants' included).",
            labels=["queue"],
        )
        guaranteed = GaugeMetricFamily(
            "aisched_queue_guaranteed_gpus", "GPUs guaranteed to each queue.", labels=["queue"]
        )
        limit = GaugeMetricFamily(
            "aisched_queue_limit_gpus", "Most GPUs each limited queue may use.", labels=["queue"]
        )
        for q in s.queues.queues:
            allocated.add_metric([q.name], used.get(q.name, 0.0))
            guaranteed.add_metric([q.name], q.guarantee.gpu + q.guarantee.gpu_milli / 1000)
            if q.limit is not None and Dim.GPU in q.limit_caps():  # 0: it may use no GPU
                limit.add_metric([q.name], q.limit.gpu + q.limit.gpu_milli / 1000)
        yield allocated
        yield guaranteed
        yield limit
        yield from self._user_limits()

    def _user_limits(self) -> Iterator[Metric]:
        """Each queue's `user_limit` and what each user's running jobs hold against it, per
        resource it governs; the unit is in the resource's name (`gpus`, `cpu_cores`,
        `memory_bytes`), so the two divide per (queue, resource). The users are bounded per
        queue (`user_limits.USERS_SHOWN`, the rest as one `OTHERS` series), and a user with
        nothing running there has no series."""
        s = self.scheduler
        limit = GaugeMetricFamily(
            "aisched_queue_user_limit",
            "Most that one user's running jobs may hold in each queue with a per-user limit "
            "(its descendants included), per resource it caps.",
            labels=["queue", "resource"],
        )
        held = GaugeMetricFamily(
            "aisched_queue_user_allocated",
            "What each user's running jobs hold against their queue's per-user limit, per "
            f"resource it caps (at most {USERS_SHOWN} users a queue, those holding the most; "
            f"the rest summed as user {OTHERS}).",
            labels=["queue", "user", "resource"],
        )
        holdings = user_holdings(s.queues, dict(list(s.usage.items())))
        for q in s.queues.queues:
            if q.user_limit is None:
                continue
            resources = governed(q.user_limit_caps())
            cap = usage_vector(q.user_limit)
            for name, _, i in resources:
                limit.add_metric([q.name, name], in_unit(cap[i], i, metric=True))
            for h in holdings.get(q.name, []):
                for name, _, i in resources:
                    held.add_metric([q.name, h.user, name], in_unit(h.usage[i], i, metric=True))
        yield limit
        yield held

    def _allocation(self) -> Iterator[Metric]:
        units = {"cpu": "cpu_cores", "memory_bytes": "memory_bytes", "gpu": "gpus"}
        for resource, (used, total) in self.scheduler.allocation().items():
            unit = units[resource]
            yield GaugeMetricFamily(
                f"aisched_allocated_{unit}", f"Allocated {unit.replace('_', ' ')}.", value=used
            )
            yield GaugeMetricFamily(
                f"aisched_capacity_{unit}", f"Schedulable {unit.replace('_', ' ')}.", value=total
            )

    def _gpus(self) -> Metric:
        s = self.scheduler
        per_gpu = GaugeMetricFamily(
            "aisched_gpu_allocated_ratio",
            "Share of each GPU allocated to running tasks (0 free, 1 whole).",
            labels=["node", "rack", "gpu"],
        )
        a, f = s.arrays, s.free
        for i, node in enumerate(a.nodes):
            for g in node.gpus:
                free = float(f.gpu_milli[i, g.index]) / 1000
                per_gpu.add_metric([node.name, node.rack, str(g.index)], 1.0 - free)
        return per_gpu


class Metrics:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.registry = CollectorRegistry()
        self.scheduler: Scheduler | None = None
        self.cycle_seconds = Histogram(
            "aisched_scheduling_cycle_duration_seconds",
            "Time spent in one scheduling cycle of the core.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.preemptions = Counter(
            "aisched_preemptions",
            "Running jobs the scheduler decided to preempt.",
            registry=self.registry,
        )
        self.shrinks = Counter(
            "aisched_shrinks",
            "Running elastic jobs the scheduler decided to shrink (instead of evicting anyone).",
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "aisched_requests_rate_limited",
            "Requests refused with 429 because their caller's rate budget was spent.",
            labelnames=["limit"],
            registry=self.registry,
        )
        self.queueing_delay = Histogram(
            "aisched_job_queueing_delay_seconds",
            "From submission to a job's first start.",
            labelnames=["queue"],
            buckets=DELAY_BUCKETS,
            registry=self.registry,
        )

    def watch(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.registry.register(_SchedulerCollector(scheduler))

    def observe_cycle(self, seconds: float, result: CycleResult) -> None:
        """Called by the loop thread after each cycle, before its decisions are applied."""
        self.cycle_seconds.observe(seconds)
        self.preemptions.inc(len(result.preempts))
        self.shrinks.inc(len(result.shrinks))
        if self.scheduler is None:
            return
        now = self.clock()
        for bind in result.binds:
            lj = self.scheduler.jobs.get(bind.job_id)
            # A bind that waits for victims starts nothing yet; a restart is not a first start.
            if lj is None or bind.after or lj.started_at is not None:
                continue
            self.queueing_delay.labels(lj.job.queue).observe(max(now - lj.submitted_at, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""Prometheus metrics, named after the Prometheus conventions (base units, `_total` counters).

Most figures are read from the scheduler when scraped (a custom collector), so they are always
current and cost nothing between scrapes; the cycle duration is a histogram the loop feeds.
Each service has its own registry, so several services in one process (tests) do not clash.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from aisched.core.cycle import CycleResult
from aisched.service.loop import Scheduler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("pending", "running", "succeeded", "failed", "cancelled")


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.scheduler
        live, per_queue = s.live_summary()
        jobs = GaugeMetricFamily("aisched_jobs", "Jobs by state.", labels=["state"])
        for state in STATES:
            n = live.get(state, 0) + s.terminal_counts.get(state, 0)
            jobs.add_metric([state], n)
        yield jobs
        pending = GaugeMetricFamily(
            "aisched_queue_pending_jobs", "Jobs waiting in each queue.", labels=["queue"]
        )
        running = GaugeMetricFamily(
            "aisched_queue_running_jobs", "Jobs running from each queue.", labels=["queue"]
        )
        names = sorted({q.name for q in s.queues.queues} | set(per_queue))
        for q in names:
            p, r = per_queue.get(q, (0, 0))
            pending.add_metric([q], p)
            running.add_metric([q], r)
        yield pending
        yield running
        units = {"cpu": "cpu_cores", "memory_bytes": "memory_bytes", "gpu": "gpus"}
        for resource, (used, total) in s.allocation().items():
            unit = units[resource]
            yield GaugeMetricFamily(
                f"aisched_allocated_{unit}", f"Allocated {unit.replace('_', ' ')}.", value=used
            )
            yield GaugeMetricFamily(
                f"aisched_capacity_{unit}", f"Schedulable {unit.replace('_', ' ')}.", value=total
            )


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "aisched_scheduling_cycle_duration_seconds",
            "Time spent in one scheduling cycle of the core.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )

    def watch(self, scheduler: Scheduler) -> None:
        self.registry.register(_SchedulerCollector(scheduler))

    def observe_cycle(self, seconds: float, _result: CycleResult) -> None:
        self.cycle_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

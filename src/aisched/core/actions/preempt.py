"""preempt and reclaim: stop running work so that a blocked job can start.

preempt works inside a queue (or the whole cluster, `scope: cluster`): victims must rank
strictly below the blocked job, by priority (`by: priority`) or by the policy's first job-order
key (`by: order`, e.g. Tiresias' LAS queue). reclaim works across queues: a queue within its
guarantee takes back capacity that other queues borrowed beyond theirs, whatever the priorities.
Only preemptible jobs are victims, never one placed in this cycle. Victims are ordered by the
policy's victim selectors (lowest priority, least work lost since checkpoint, newest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.eviction import find_victims
from aisched.core.framework import victim_key
from aisched.core.queues import borrowed, queue_blocks, within_guarantee
from aisched.core.session import bindings_vector
from aisched.core.snapshot import PendingJob, RunningJob
from aisched.core.status import StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session

Eligible = Callable[[PendingJob, RunningJob], bool]


def _run(session: Session, eligible_for: Callable[[PendingJob], Eligible | None], why: str) -> None:
    for pj in list(session.blocked):
        status = session.statuses.get(pj.id)
        if status is None or status.code != StatusCode.WAIT_RESOURCES:
            continue
        if queue_blocks(session, pj.job) is not None:
            continue
        eligible = eligible_for(pj)
        if eligible is None:
            continue
        cands = [
            r
            for r in session.running.values()
            if r.job.preemptible and r.id not in session.bound_now and eligible(pj, r)
        ]
        if not cands:
            continue
        cands.sort(key=lambda r: victim_key(session.policy.victims, r, session.now))
        found = find_victims(session, pj.job, cands)
        if found is None:
            continue
        victims, tasks = found
        for v in victims:
            session.preempt(v, pj.id, f"{why} for {pj.id}")
        session.blocked.remove(pj)
        session.bind(pj, tasks, after=tuple(v.id for v in victims))


@dataclass(frozen=True, slots=True)
class Preempt:
    by: str = "priority"
    scope: str = "queue"
    name: str = "preempt"

    def __post_init__(self) -> None:
        if self.by not in ("priority", "order"):
            raise ValueError(f"by must be 'priority' or 'order', not {self.by!r}")
        if self.scope not in ("queue", "cluster"):
            raise ValueError(f"scope must be 'queue' or 'cluster', not {self.scope!r}")

    def execute(self, session: Session) -> None:
        first = session.policy.order[0] if session.policy.order else None

        def eligible_for(pj: PendingJob) -> Eligible:
            mine = first.key(pj.job, pj.attained_gpu_s, pj.estimate_s) if first is not None else 0.0

            def eligible(p: PendingJob, r: RunningJob) -> bool:
                if self.scope == "queue" and r.job.queue != p.job.queue:
                    return False
                if self.by == "priority" or first is None:
                    return r.job.priority < p.job.priority
                return first.key(r.job, r.attained_gpu_s, None) > mine

            return eligible

        _run(session, eligible_for, "preempted")


@dataclass(frozen=True, slots=True)
class Reclaim:
    name: str = "reclaim"

    def execute(self, session: Session) -> None:
        def eligible_for(pj: PendingJob) -> Eligible | None:
            if not within_guarantee(session, pj.job):
                return None

            def eligible(p: PendingJob, r: RunningJob) -> bool:
                return r.job.queue != p.job.queue and borrowed(
                    session, r.job.queue, bindings_vector(r.tasks)
                )

            return eligible

        _run(session, eligible_for, "reclaimed")

"""enqueue: decide which pending jobs take part in this cycle, and in what order.

Refuses jobs that can never run (unknown queue, larger than any node or rack they require,
above their queue's limit on their own) with NEVER_FITS, orders the rest by the policy's job
order, and cuts the list at `queue_depth` when one is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.framework import order_key
from aisched.core.placement import never_fits
from aisched.core.queues import exceeds_limit_alone
from aisched.core.status import StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session


@dataclass(frozen=True, slots=True)
class Enqueue:
    name: str = "enqueue"

    def execute(self, session: Session) -> None:
        admitted = []
        orders = session.policy.order
        for pj in session.pending:
            job = pj.job
            if not session.queues.has(job.queue):
                session.set_status(job.id, StatusCode.NEVER_FITS, f"unknown queue {job.queue!r}")
                continue
            reason = exceeds_limit_alone(session, job) or never_fits(session, job)
            if reason is not None:
                session.set_status(job.id, StatusCode.NEVER_FITS, reason)
                continue
            admitted.append((order_key(orders, job, pj.attained_gpu_s, pj.estimate_s), pj))
        admitted.sort(key=lambda kv: kv[0])
        depth = session.policy.queue_depth
        for i, (_, pj) in enumerate(admitted):
            if depth is not None and i >= depth:
                session.set_status(
                    pj.id, StatusCode.NOT_CONSIDERED, f"beyond the queue depth of {depth}"
                )
            else:
                session.candidates.append(pj)

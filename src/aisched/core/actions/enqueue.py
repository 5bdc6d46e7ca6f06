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
from aisched.core.snapshot import PendingJob
from aisched.core.status import StatusCode
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session

MEMO_LIMIT = 500_000


@dataclass(frozen=True, slots=True)
class Enqueue:
    name: str = "enqueue"

    def execute(self, session: Session) -> None:
        admitted: list[tuple[tuple[float | str, ...], PendingJob]] = []
        order = session.policy.order
        # A pending job's order key and admission depend only on it, the policy and the queue
        # tree, so they are memoised by the (immutable) PendingJob object across cycles.
        # The memo holds the objects whose ids it is keyed by, so no id can be reused meanwhile.
        slot_key = ("enqueue", id(order), id(session.queues))
        slot = session.arrays.memo.get(slot_key)
        if slot is None or len(slot[2]) > MEMO_LIMIT:  # type: ignore[index]
            slot = session.arrays.memo[slot_key] = (order, session.queues, {})
        memo: dict[int, tuple[PendingJob, tuple[float | str, ...], str | None]] = slot[2]  # type: ignore[index]
        for pj in session.pending:
            hit = memo.get(id(pj))
            if hit is not None and hit[0] is pj:
                _, key, reason = hit
            else:
                job = pj.job
                reason = admission_refusal(session, job)
                key = order_key(order, job, pj.attained_gpu_s, pj.estimate_s)
                memo[id(pj)] = (pj, key, reason)
            if reason is not None:
                session.set_status_cached(pj.id, StatusCode.NEVER_FITS, reason)
            else:
                admitted.append((key, pj))
        admitted.sort(key=lambda kv: kv[0])
        depth = session.policy.queue_depth
        if depth is not None and len(admitted) > depth:
            for _, pj in admitted[depth:]:
                session.set_status(
                    pj.id, StatusCode.NOT_CONSIDERED, f"beyond the queue depth of {depth}"
                )
            del admitted[depth:]
        session.candidates.extend(pj for _, pj in admitted)


def admission_refusal(session: Session, job: Job) -> str | None:
    """Why `job` can never run here (memoised: it depends only on the queue tree, the job's
    queue and shape, and the cluster)."""
    memo = session.arrays.memo
    key = ("admit", id(session.queues), job.queue, job.shape_id, session.policy.locality)
    hit = memo.get(key)
    if hit is not None and hit[0] is session.queues:  # type: ignore[index]
        return hit[1]  # type: ignore[index, no-any-return]
    if not session.queues.has(job.queue):
        reason: str | None = f"unknown queue {job.queue!r}"
    else:
        reason = exceeds_limit_alone(session, job) or never_fits(session, job)
    memo[key] = (session.queues, reason)
    return reason

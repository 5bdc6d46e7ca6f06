"""enqueue: decide which pending jobs take part in this cycle, and in what order.

Refuses jobs that can never run (unknown queue, larger than any node or rack they require,
above their queue's limit on their own) with NEVER_FITS, orders the rest by the policy's job
order, and cuts the list at `queue_depth` when one is set.

Starving large jobs: with `starving_after_s` set, a job of at least `starving_min_gpus` GPUs
that has waited that long since submission goes to the front, oldest first, whatever the job
order says. Allocate tries those first, and with backfill in the policy the first of them that
does not fit holds the reservation, so a large gang waits at most that long plus the time for
the running work in its way to end, however many short jobs keep arriving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.framework import order_key
from aisched.core.placement import never_fits, placement_shape
from aisched.core.queues import exceeds_limit_alone
from aisched.core.snapshot import PendingJob
from aisched.core.status import StatusCode
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session

MEMO_LIMIT = 500_000


@dataclass(frozen=True, slots=True)
class Enqueue:
    starving_after_s: float = 0.0
    starving_min_gpus: float = 16.0
    name: str = "enqueue"

    def __post_init__(self) -> None:
        if self.starving_after_s < 0:
            raise ValueError("starving_after_s must be 0 (off) or more")

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
        if self.starving_after_s > 0 and admitted:
            admitted = self._promote_starving(session, admitted)
        depth = session.policy.queue_depth
        if depth is not None and len(admitted) > depth:
            for _, pj in admitted[depth:]:
                session.set_status(
                    pj.id, StatusCode.NOT_CONSIDERED, f"beyond the queue depth of {depth}"
                )
            del admitted[depth:]
        session.candidates.extend(pj for _, pj in admitted)

    def _promote_starving(
        self, session: Session, admitted: list[tuple[tuple[float | str, ...], PendingJob]]
    ) -> list[tuple[tuple[float | str, ...], PendingJob]]:
        cutoff = session.now - self.starving_after_s
        least = self.starving_min_gpus
        starving = [
            kv
            for kv in admitted
            if kv[1].job.submit_time_s <= cutoff and kv[1].job.num_gpus >= least
        ]
        if not starving:
            return admitted
        starving.sort(key=lambda kv: kv[1].job.tie_break)
        moved = {id(kv[1]) for kv in starving}
        session.promoted = len(starving)
        return starving + [kv for kv in admitted if id(kv[1]) not in moved]


def admission_refusal(session: Session, job: Job) -> str | None:
    """Why `job` can never run here (memoised: it depends only on the queue tree, the job's
    queue and shape, and the cluster)."""
    memo = session.arrays.memo
    shape = placement_shape(session, job)
    key = ("admit", id(session.queues), job.queue, shape, session.policy.locality)
    hit = memo.get(key)
    if hit is not None and hit[0] is session.queues:  # type: ignore[index]
        return hit[1]  # type: ignore[index, no-any-return]
    if not session.queues.has(job.queue):
        reason: str | None = f"unknown queue {job.queue!r}"
    else:
        reason = exceeds_limit_alone(session, job) or never_fits(session, job)
    memo[key] = (session.queues, reason)
    return reason

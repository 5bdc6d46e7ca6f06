"""enqueue: decide which pending jobs take part in this cycle, and in what order.

Refuses jobs that can never run (unknown queue, larger than any node or rack they require,
above their queue's limit on their own) with NEVER_FITS, orders the rest by the policy's job
order, and cuts the list at `queue_depth` when one is set.

Starving large jobs: with `starving_after_s` set, a job of at least `starving_min_gpus` GPUs
that has waited that long since submission goes to the front, oldest first, whatever the job
order says. Allocate tries those first, and with backfill in the policy the first of them that
does not fit holds the reservation, so a large gang waits at most that long plus the time for
the running work in its way to end, however many short jobs keep arriving.
`starving_after_backlog` (k) gives that bar a scale taken from the load instead of (or beside:
the lower holds) a fixed one: such a job starves once it has waited k times the backlog's drain
time (below). Why: an overdue job goes first but holds nothing back, so a wide one can keep
failing to fit while narrow ones take each GPU that frees around it; a fixed starving bar is
either too low for a lightly loaded cluster or too high for a loaded one.

Overdue jobs: with `due_after_median_waits` set (k), a job of any size that has waited more
than k times the median wait of the admitted jobs goes to the front, oldest first, after the
starving gangs, with no reservation (a job that does not fit does not hold back the rest). The
bar follows the load with no parameter of its own: the waits of the jobs waiting now say how
long waiting lasts. Under fifo with steady arrivals the waiting jobs' ages spread about evenly
from 0 to the oldest's, so the oldest has waited about twice the median: at k = 2 a job goes
first once it has waited longer than fifo's oldest would have, and is then served in fifo
order. That bounds the tail of a shortest-first order against fifo's, whatever the predictor
says (it needs no estimate).

That bar has no scale of its own, though: under a shortest-first order the jobs left waiting
are mostly old long ones, their ages spread from 0 to the bar, and twice their median is the
bar again, however high it has drifted. `due_after_backlog` (k) gives the overdue rule a scale
taken from the load: a job is overdue once it has waited more than k times the backlog's drain
time, the GPU-time still to do (the running jobs' time left to their expected end, and the
admitted jobs' estimates, else their runtime bounds, times their GPUs) over the cluster's
healthy GPUs. The backlog is the same under any order that keeps the GPUs busy (arrivals and
capacity alone set it), and under fifo a job arriving now waits about that long for the work
ahead of it: at k = 1 a job is overdue once it has waited past fifo's wait for a job arriving
now, and is then served in fifo order. With both bars set, the lower one holds. Jobs with
neither an estimate nor a bound add nothing.

`backlog_bound` says which bound a running job's time left is taken from in that drain time:
`started`, the one it started with (its `expected_end_s`, as preemption and backfill read), or
`waited`, the one it waited with (`waited_end_s`). They differ only where the caller calibrates
a job's bound again as it starts (`PredictorConfig.calib_refresh`): the wider refreshed
bounds of a burst's later jobs would raise the drain time, and the bar with it, above the scale
it was chosen on, while the bounds the waiting jobs are compared with stay as they waited.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal

from aisched.core.admitted import AdmittedOrder, Member
from aisched.core.framework import JobOrder, order_key
from aisched.core.placement import never_fits, placement_shape
from aisched.core.plugins.victims import time_left_s
from aisched.core.queues import exceeds_limit_alone
from aisched.core.snapshot import PendingJob
from aisched.core.status import StatusCode, named_for
from aisched.model.job import Job
from aisched.model.resources import GPU_MILLI_WHOLE

if TYPE_CHECKING:
    from aisched.core.session import Session


@dataclass(frozen=True, slots=True)
class Enqueue:
    starving_after_s: float = 0.0
    starving_min_gpus: float = 16.0
    starving_after_backlog: float = 0.0
    due_after_median_waits: float = 0.0
    due_after_backlog: float = 0.0
    backlog_bound: Literal["started", "waited"] = "started"  # see the module's description
    name: str = "enqueue"

    def __post_init__(self) -> None:
        # `not x >= 0`, not `x < 0`: NaN compares as nothing, and would turn the rule off
        # without a word.
        if not self.starving_after_s >= 0:
            raise ValueError("starving_after_s must be 0 (off) or more")
        if not self.starving_min_gpus >= 0:
            raise ValueError("starving_min_gpus must be 0 or more")
        if not 0.0 <= self.starving_after_backlog < float("inf"):
            raise ValueError("starving_after_backlog must be 0 (off) or more")
        if not 0.0 <= self.due_after_median_waits < float("inf"):
            raise ValueError("due_after_median_waits must be 0 (off) or more")
        if not 0.0 <= self.due_after_backlog < float("inf"):
            raise ValueError("due_after_backlog must be 0 (off) or more")
        if self.backlog_bound not in ("started", "waited"):
            raise ValueError(
                f"backlog_bound must be 'started' or 'waited', not {self.backlog_bound!r}"
            )

    def execute(self, session: Session) -> None:
        order = session.policy.order
        kept = _kept_order(session)
        kept.update(session.pending, partial(_judge, session, order), session.pending_queue)
        for m in kept.refused.values():
            assert m.refusal is not None
            session.set_status_cached(m.pj.id, StatusCode.NEVER_FITS, m.refusal)
        kept.lend_members(session.statuses)
        admitted = list(kept.jobs)
        shapes: list[Hashable] | None = list(kept.shapes)
        if self.promotes and admitted:
            admitted = self._promote_starving(session, admitted)
            if session.promoted:
                shapes = None  # reordered: allocate takes the shapes from the jobs
        due = self.due_after_median_waits > 0 or self.due_after_backlog > 0
        if due and len(admitted) > 1:
            overdue = self._overdue_first(session, admitted)
            if overdue is not admitted:
                admitted, shapes = overdue, None  # reordered: allocate takes shapes from jobs
        depth = session.policy.queue_depth
        if depth is not None and len(admitted) > depth:
            for pj in admitted[depth:]:
                session.set_status(
                    pj.id, StatusCode.NOT_CONSIDERED, f"beyond the queue depth of {depth}"
                )
            del admitted[depth:]
            if shapes is not None:
                del shapes[depth:]
        session.candidates.extend(admitted)
        session.candidate_shapes = shapes
        if shapes is not None and len(admitted) == len(kept.jobs):  # neither reordered nor cut
            session.kept_order = kept

    def _overdue_first(self, session: Session, admitted: list[PendingJob]) -> list[PendingJob]:
        """`admitted` with its overdue jobs (see the module's description) moved to the front,
        oldest first, behind the starving ones; `admitted` itself when none is overdue."""
        now = session.now
        oldest = min(pj.job.submit_time_s for pj in admitted)
        bar = float("inf")
        if self.due_after_median_waits > 0:
            waits = sorted(now - pj.job.submit_time_s for pj in admitted)
            bar = self.due_after_median_waits * waits[len(waits) // 2]
        if self.due_after_backlog > 0:
            bar = min(bar, self._backlog_bar(session, admitted, self.due_after_backlog, oldest))
        cutoff = now - bar
        if oldest >= cutoff:  # not even the oldest is overdue
            return admitted
        head = session.promoted  # starving gangs stay first
        overdue = [pj for pj in admitted[head:] if pj.job.submit_time_s < cutoff]
        if not overdue:
            return admitted
        overdue.sort(key=lambda pj: pj.job.tie_break)
        moved = {id(pj) for pj in overdue}
        rest = [pj for pj in admitted[head:] if id(pj) not in moved]
        return admitted[:head] + overdue + rest

    def _backlog_bar(
        self, session: Session, admitted: list[PendingJob], k: float, oldest: float
    ) -> float:
        """k times the backlog's drain time, read from the bound `backlog_bound` names; summed
        no further than a bar past the wait of the job submitted at `oldest` needs."""
        waited = self.backlog_bound == "waited"
        return k * backlog_drain_s(session, admitted, (session.now - oldest) / k, waited)

    @property
    def promotes(self) -> bool:
        """Whether some job may be promoted for starving (and so hold a reservation)."""
        return self.starving_after_s > 0 or self.starving_after_backlog > 0

    def _promote_starving(self, session: Session, admitted: list[PendingJob]) -> list[PendingJob]:
        now, least = session.now, self.starving_min_gpus
        wide = [pj for pj in admitted if pj.job.num_gpus >= least]
        if not wide:
            return admitted
        bar = self.starving_after_s if self.starving_after_s > 0 else float("inf")
        if self.starving_after_backlog > 0:
            oldest = min(pj.job.submit_time_s for pj in wide)
            k = self.starving_after_backlog
            bar = min(bar, self._backlog_bar(session, admitted, k, oldest))
        cutoff = now - bar
        starving = [pj for pj in wide if pj.job.submit_time_s <= cutoff]
        if not starving:
            return admitted
        starving.sort(key=lambda pj: pj.job.tie_break)
        moved = {id(pj) for pj in starving}
        session.promoted = len(starving)
        return starving + [pj for pj in admitted if id(pj) not in moved]


def backlog_drain_s(
    session: Session,
    admitted: list[PendingJob],
    enough_s: float = float("inf"),
    waited: bool = False,
) -> float:
    """Seconds the cluster's healthy GPUs need to do the GPU-time still to do: what running
    jobs have left to their expected end (`time_left_s`; with `waited`, to the end the bound
    they waited with gives) and the admitted jobs' estimates (else their runtime bounds). The
    sum stops once it reaches `enough_s` (a bar past the oldest job's wait says the same as any
    higher one), so the answer is then only at least that."""
    arrays = session.arrays
    gpus = float(arrays.num_gpus[arrays.healthy].sum())
    if gpus <= 0:
        return 0.0
    now = session.now
    enough = enough_s * gpus
    work = 0.0
    for r in session.running.values():
        left = time_left_s(r, now, waited)
        if left is not None:
            work += left * r.usage[2] / GPU_MILLI_WHOLE
    for pj in admitted:
        # The point estimate: the upper bound of a job of widely spread runtimes is many times
        # its median, and a backlog of bounds would be many times the work it holds.
        left = pj.estimate_s if pj.estimate_s is not None else pj.runtime_bound_s
        if left is not None:
            work += left * pj.job.num_gpus
            if work >= enough:
                break
    return work / gpus


def _kept_order(session: Session) -> AdmittedOrder:
    """The admitted order kept for this policy and queue tree on this cluster."""
    policy, queues = session.policy, session.queues
    slot_key = ("admitted-order", id(policy), id(queues))
    kept = session.arrays.memo.get(slot_key)
    if (
        not isinstance(kept, AdmittedOrder)
        or kept.owner[0] is not policy
        or kept.owner[1] is not queues
    ):
        kept = AdmittedOrder((policy, queues))
        session.arrays.memo[slot_key] = kept
    return kept


def _judge(session: Session, order: tuple[JobOrder, ...], pj: PendingJob) -> Member:
    job = pj.job
    return Member(
        pj,
        order_key(order, job, pj.attained_gpu_s, pj.estimate_s),
        admission_refusal(session, job),
        placement_shape(session, job),
    )


def admission_refusal(session: Session, job: Job) -> str | None:
    """Why `job` can never run here (memoised: it depends only on the queue tree, the job's
    queue and shape, and the cluster; the memo names task groups by place, for any job of
    the shape, and the answer by `job`'s names)."""
    memo = session.arrays.memo
    shape = placement_shape(session, job)
    key = ("admit", id(session.queues), job.queue, shape, session.policy.locality)
    hit = memo.get(key)
    if hit is not None and hit[0] is session.queues:  # type: ignore[index]
        said: str | None = hit[1]  # type: ignore[index]
        return None if said is None else named_for(said, job)
    if not session.queues.has(job.queue):
        reason: str | None = f"unknown queue {job.queue!r}"
    else:
        reason = exceeds_limit_alone(session, job) or never_fits(session, job)
    memo[key] = (session.queues, reason)
    return None if reason is None else named_for(reason, job)

"""backfill: start later jobs in idle holes without delaying reserved jobs.

Jobs left by allocate are visited in order. A job that fits now starts; if its runtime bound
(upper estimate, estimate or time limit) does not end before a reservation starts (or it has no
bound), it may use only what that reservation leaves over: the reserved job's GPUs, CPU and
memory stay free for it (`place_beside`), the rest of its nodes may be used. A job that does not fit
gets a reservation while fewer than `reservations` are held (the first is the blocked head
job, so a large gang cannot be starved by a stream of small ones); later ones wait.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.placement import placement_shape
from aisched.core.queues import as_taken, queue_takes
from aisched.core.reservation import HELD, place_beside, reserve_for, runs_into
from aisched.core.snapshot import PendingJob
from aisched.core.status import JobStatus, StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session

# `StatusCode.is_placed`, as a set: asked once per waiting job.
_PLACED = frozenset((StatusCode.PLACED, StatusCode.PREEMPTING))


@dataclass(frozen=True, slots=True)
class Backfill:
    reservations: int = 1
    name: str = "backfill"

    def __post_init__(self) -> None:
        if self.reservations < 0:
            raise ValueError("reservations must be 0 or more")

    def execute(self, session: Session) -> None:
        # Failures by (shape, reservations run into), once every reservation is held: nothing
        # is given back in backfill, so a job of the same shape that runs into the same
        # reservations fails for the same reason, and is answered without a placement (a
        # long queue is then a dictionary lookup per job, not a search). The memo keeps the
        # status the first such job got, which every later one shares.
        failed: dict[tuple[Hashable, tuple[str, ...]], JobStatus] = {}
        # The reservations a runtime bound runs into, while the reservations stay as they are
        # (`runs_into` depends on nothing else): most of a long queue shares a few bounds.
        into_by_bound: dict[float | None, tuple[str, ...]] = {}
        held = len(session.reservations)
        statuses = session.statuses
        for pj in list(session.blocked):
            status = statuses.stated(pj.id)
            if status is not None and status.code in _PLACED:
                continue
            taken = queue_takes(session, pj.job)
            if isinstance(taken, str):
                session.set_status(pj.id, StatusCode.WAIT_QUEUE, taken)
                continue
            tried = as_taken(pj, taken)
            key = None
            if len(session.reservations) >= self.reservations:
                if len(session.reservations) != held:
                    into_by_bound.clear()
                    held = len(session.reservations)
                bound = pj.runtime_bound_s
                into = into_by_bound.get(bound)
                if into is None:
                    into = tuple(r.job_id for r in runs_into(session, pj))
                    into_by_bound[bound] = into
                key = (placement_shape(session, taken), into)
                hit = failed.get(key)
                if hit is not None:
                    statuses[pj.id] = hit
                    continue
            res, beside = place_beside(session, tried)
            if not isinstance(res, str):
                session.bind(pj, res)
                if beside:
                    session.set_status(pj.id, StatusCode.PLACED, "backfilled")
                continue
            if len(session.reservations) < self.reservations and reserve_for(session, tried):
                continue
            self._wait(session, pj, res, beside)
            if key is not None:
                failed[key] = statuses.own[pj.id]  # as stated (groups named by place)

    @staticmethod
    def _wait(session: Session, pj: PendingJob, res: str, beside: bool) -> None:
        code = StatusCode.WAIT_RESERVATION if beside else StatusCode.WAIT_RESOURCES
        session.set_status_cached(pj.id, code, f"{res}{HELD}" if beside else res)

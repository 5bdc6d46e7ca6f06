"""backfill: start later jobs in idle holes without delaying reserved jobs.

Jobs left by allocate are visited in order. A job that fits now starts, but on a node held by
a reservation only if its runtime bound (upper estimate, estimate or time limit) ends before
that reservation starts; a job with no bound stays off reserved nodes. A job that does not fit
gets a reservation while fewer than `reservations` are held (the first is the blocked head
job, so a large gang cannot be starved by a stream of small ones); later ones wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.placement import place_job
from aisched.core.queues import queue_blocks
from aisched.core.reservation import allowed_nodes, reserve_for
from aisched.core.statement import Statement
from aisched.core.status import StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session


@dataclass(frozen=True, slots=True)
class Backfill:
    reservations: int = 1
    name: str = "backfill"

    def __post_init__(self) -> None:
        if self.reservations < 0:
            raise ValueError("reservations must be 0 or more")

    def execute(self, session: Session) -> None:
        for pj in list(session.blocked):
            status = session.statuses.get(pj.id)
            if status is not None and status.code.is_placed:
                continue
            reason = queue_blocks(session, pj.job)
            if reason is not None:
                session.set_status(pj.id, StatusCode.WAIT_QUEUE, reason)
                continue
            allowed, key = allowed_nodes(session, pj)
            st = Statement(session)
            res = place_job(session, st, pj.job, allowed, mask_key=key)
            if not isinstance(res, str):
                st.commit()
                session.bind(pj, res)
                if key:
                    session.set_status(pj.id, StatusCode.PLACED, "backfilled")
                continue
            st.discard()
            if len(session.reservations) < self.reservations and reserve_for(session, pj):
                continue
            code = StatusCode.WAIT_RESERVATION if key else StatusCode.WAIT_RESOURCES
            session.set_status(pj.id, code, res if not key else f"{res}; reserved nodes held")

"""allocate: place whole gangs in scheduling order, queues and users interleaved fairly.

The next job comes from the queue (and, with drf, the user) with the lowest weighted dominant
share, so placements are shared out as they happen rather than by a share fixed at cycle start.
With backfill configured (strict order) allocation stops at the first job that does not fit;
the rest go to the later actions in order, so the blocked job's reservation can be honoured.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aisched.core.placement import place_job
from aisched.core.queues import fair_key, queue_blocks
from aisched.core.snapshot import PendingJob
from aisched.core.statement import Statement
from aisched.core.status import StatusCode

if TYPE_CHECKING:
    from aisched.core.session import Session


@dataclass(frozen=True, slots=True)
class Allocate:
    name: str = "allocate"

    def execute(self, session: Session) -> None:
        buckets: dict[tuple[str, str], deque[tuple[int, PendingJob]]] = {}
        per_user = session.policy.fair_users
        for pos, pj in enumerate(session.candidates):
            key = (pj.job.queue, pj.job.user if per_user else "")
            buckets.setdefault(key, deque()).append((pos, pj))
        strict = session.policy.strict_order
        while buckets:
            key = self._next_bucket(session, buckets)
            _, pj = buckets[key].popleft()
            if not buckets[key]:
                del buckets[key]
            reason = queue_blocks(session, pj.job)
            if reason is not None:
                session.set_status(pj.id, StatusCode.WAIT_QUEUE, reason)
                continue
            st = Statement(session)
            res = place_job(session, st, pj.job)
            if isinstance(res, str):
                st.discard()
                session.set_status(pj.id, StatusCode.WAIT_RESOURCES, res)
                session.blocked.append(pj)
                if strict:
                    self._defer_rest(session, buckets)
                    return
                continue
            st.commit()
            session.bind(pj, res)

    @staticmethod
    def _next_bucket(
        session: Session, buckets: dict[tuple[str, str], deque[tuple[int, PendingJob]]]
    ) -> tuple[str, str]:
        if len(buckets) == 1:
            return next(iter(buckets))
        best_key: tuple[str, str] | None = None
        best: tuple[object, ...] = ()
        for key, items in buckets.items():
            pos, pj = items[0]
            rank = (*fair_key(session, pj.job), pos)
            if best_key is None or rank < best:
                best_key, best = key, rank
        assert best_key is not None
        return best_key

    @staticmethod
    def _defer_rest(
        session: Session, buckets: dict[tuple[str, str], deque[tuple[int, PendingJob]]]
    ) -> None:
        rest = sorted((item for items in buckets.values() for item in items), key=lambda x: x[0])
        for _, pj in rest:
            session.set_status(pj.id, StatusCode.NOT_CONSIDERED, "behind a blocked job")
            session.blocked.append(pj)

"""Queue arithmetic for one cycle: limits, guarantees, borrowing and fair-share keys.

A zero in a queue's `limit` or `guarantee` means that resource is not governed there, so a
queue can cap GPUs without also naming CPUs and memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from aisched.core.session import usage_vector
from aisched.core.snapshot import ZERO, Usage, add_usage
from aisched.model.job import Job
from aisched.model.queue import QueueTree
from aisched.model.resources import Resources

if TYPE_CHECKING:
    from aisched.core.session import Session

DIM_NAMES = ("CPU", "memory", "GPU")


def _over(usage: Usage, cap: Resources) -> int | None:
    """The first governed dimension where `usage` exceeds `cap`, or None."""
    capv = usage_vector(cap)
    for i in range(3):
        if capv[i] > 0 and usage[i] > capv[i]:
            return i
    return None


def exceeds_limit_alone(session: Session, job: Job) -> str | None:
    """Why the job could never run in its queue: it alone is above a limit on its path."""
    req = usage_vector(job.total_request)
    for qname in session.queue_path(job.queue):
        q = session.queues.get(qname)
        if q.limit is not None and (dim := _over(req, q.limit)) is not None:
            return f"needs more {DIM_NAMES[dim]} than queue {qname}'s limit"
        if not q.borrowing and (dim := _over(req, q.guarantee)) is not None:
            return f"needs more {DIM_NAMES[dim]} than queue {qname}'s guarantee (no borrowing)"
    return None


def queue_blocks(session: Session, job: Job) -> str | None:
    """Why the job's queue does not let it start now (limit reached, may not borrow)."""
    if job.queue in session.queues.ungoverned:
        return None
    req = usage_vector(job.total_request)
    for qname in session.queue_path(job.queue):
        q = session.queues.get(qname)
        after = add_usage(session.usage_of(qname), req)
        if q.limit is not None and (dim := _over(after, q.limit)) is not None:
            return f"queue {qname} would exceed its {DIM_NAMES[dim]} limit"
        if not q.borrowing and (dim := _over(after, q.guarantee)) is not None:
            return f"queue {qname} would exceed its {DIM_NAMES[dim]} guarantee and may not borrow"
    return None


def room_to_regrow(
    queues: QueueTree, usage: Mapping[tuple[str, str], Usage], job: Job, held: Usage
) -> bool:
    """Whether `job`, which holds `held` now, would be let start whole by its queue once it has
    given that back (`queue_blocks`' rules, on the usage per (queue, user) outside a cycle):
    growing an elastic job requeues it, and a requeued job its queue will not take back would
    lose the tasks it ran for nothing."""
    if job.queue in queues.ungoverned or not queues.has(job.queue):
        return True
    req = usage_vector(job.total_request)
    for qname in queues.path(job.queue):
        used = ZERO
        for (leaf, _user), u in usage.items():
            if queues.has(leaf) and qname in queues.path(leaf):
                used = add_usage(used, u)
        after = add_usage(add_usage(used, held, -1.0), req)
        q = queues.get(qname)
        if q.limit is not None and _over(after, q.limit) is not None:
            return False
        if not q.borrowing and _over(after, q.guarantee) is not None:
            return False
    return True


def within_guarantee(session: Session, job: Job) -> bool:
    """True when the job's leaf queue stays within its guarantee with the job added, on every
    governed dimension, and the guarantee governs something."""
    q = session.queues.get(job.queue)
    g = usage_vector(q.guarantee)
    if not any(x > 0 for x in g):
        return False
    after = add_usage(session.usage_of(job.queue), usage_vector(job.total_request))
    return all(gi == 0 or ai <= gi for gi, ai in zip(g, after, strict=True))


def borrowed(session: Session, queue: str, minus: Usage) -> bool:
    """True when `queue` would still be at or above its guarantee after giving up `minus`
    and is above it now on some governed dimension: its work there is borrowed."""
    if not session.queues.has(queue):
        return False
    g = usage_vector(session.queues.get(queue).guarantee)
    usage = session.usage_of(queue)
    if not any(u > gi for u, gi in zip(usage, g, strict=True)):
        return False
    left = add_usage(usage, minus, -1.0)
    return all(gi == 0 or lf >= gi for gi, lf in zip(g, left, strict=True))


def fair_key(session: Session, job: Job) -> tuple[float, ...]:
    """Hierarchical weighted dominant share along the job's queue path (lower goes first),
    then its user's share when drf is on."""
    queues, usage, share = session.queues, session.queue_usage, session.dominant_share
    key = [share(usage.get(q, ZERO)) / queues.weight_of(q) for q in session.queue_path(job.queue)]
    if session.policy.fair_users:
        u = session.user_usage.get((job.queue, job.user))
        key.append(session.dominant_share(u) if u is not None else 0.0)
    return tuple(key)

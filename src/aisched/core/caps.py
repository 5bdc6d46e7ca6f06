"""Per-node caps on the instances of one app (`Node.max_per_node`, `Job.app`).

A node with `max_per_node: N` takes at most N tasks of one app: of the replicas of one service,
or of one job. `room` says, per node, how many more tasks of a job's app each node may take,
from the tasks of that app running now (the session's running set, as preemption changes it);
placement takes the least of that and what fits (`placement._place_groups`).

Invariants: with no capped node in the cluster, `room` is None and nothing is counted (one memo
lookup). Placement outcomes then depend on the app as well as the shape, so
`placement.placement_shape` keys its caches by both while caps exist. What-ifs that imagine the
empty cluster (`placement.never_fits`) count no running task (`Session.imagine_empty`).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aisched.core.snapshot import ClusterArrays, IntArray
from aisched.model.job import Job

if TYPE_CHECKING:
    from aisched.core.session import Session

_MEMO = "max-per-node"
UNCAPPED = 1 << 40


def node_caps(arrays: ClusterArrays) -> IntArray | None:
    """Each node's cap (UNCAPPED where none), or None when no node has one; memoised."""
    memo = arrays.memo
    if _MEMO not in memo:
        caps = [n.max_per_node for n in arrays.nodes]
        memo[_MEMO] = (
            None
            if all(c is None for c in caps)
            else np.array([UNCAPPED if c is None else c for c in caps], dtype=np.int64)
        )
    return memo[_MEMO]  # type: ignore[return-value]


def room(session: Session, job: Job) -> IntArray | None:
    """How many more tasks of `job`'s app each node may take, or None when nothing is capped.
    A fresh array: the caller may lower it as it places tasks."""
    caps = node_caps(session.arrays)
    if caps is None:
        return None
    left = caps.copy()
    if session.imagine_empty:
        return left
    app, index = job.app, session.arrays.index
    for r in session.running.values():
        if r.job.app == app:
            for t in r.tasks:
                left[index[t.node]] -= 1
    np.maximum(left, 0, out=left)
    return left

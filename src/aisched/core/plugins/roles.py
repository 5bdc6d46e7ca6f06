"""The `node-role` filter: CPU-only work stays off nodes whose role is GPU work.

A cluster file may give nodes a role (`model.cluster.Node.role`): `cpu` for CPU-only nodes,
`gpu` for the nodes that serve work asking for GPUs. A task that asks for no GPU may then use
only nodes that are not `gpu` nodes, so a GPU node's CPUs and memory stay for the GPU tasks
they go with (a disaggregated inference cluster: front ends and pre/post-processing on CPU
nodes, model replicas on GPU nodes). A task that asks for a GPU already fits only nodes with
GPUs. Nodes without a role take anything, and a cluster without roles is not restricted at all
(the filter answers None, at the cost of one memo lookup).

On in every policy unless its `filters` list leaves it out (`core.policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aisched.core.snapshot import BoolArray
from aisched.model.job import Job
from aisched.model.resources import Resources

if TYPE_CHECKING:
    from aisched.core.session import Session

_MEMO = "node-role:cpu-work"


@dataclass(frozen=True, slots=True)
class NodeRole:
    name: str = "node-role"

    def mask(self, session: Session, job: Job, request: Resources) -> BoolArray | None:
        if request.gpu or request.gpu_milli:
            return None
        memo = session.arrays.memo
        if _MEMO not in memo:
            roles = [n.role for n in session.arrays.nodes]
            memo[_MEMO] = (
                np.array([r != "gpu" for r in roles], dtype=np.bool_) if "gpu" in roles else None
            )
        return memo[_MEMO]  # type: ignore[return-value]

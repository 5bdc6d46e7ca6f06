"""Which nodes the loop schedules on when a cluster executor gains and loses nodes.

The executor offers the nodes that are alive now. A node that left while tasks are still bound
to it stays in the loop's list, marked unhealthy, until those tasks' exits have given its
resources back: the free state must be able to take and give every binding it holds, and the
core never places anything on an unhealthy node. A node that is bound but was never seen (the
scheduler restarted after it left) gets an unhealthy placeholder just big enough for what is
bound to it.

Pure: no I/O; the loop calls it with what it knows and rebuilds its arrays when the answer
differs from the nodes it has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from aisched.core.decisions import TaskBinding
from aisched.model.cluster import GPU, Node


def merge_nodes(
    offered: Sequence[Node],
    previous: Sequence[Node],
    bound: Mapping[str, Sequence[TaskBinding]],
) -> tuple[Node, ...]:
    """The offered nodes, plus every node that still has bindings, unhealthy if not offered."""
    out = {n.name: n for n in offered}
    before = {n.name: n for n in previous}
    for name, bindings in sorted(bound.items()):
        if name in out or not bindings:
            continue
        old = before.get(name)
        out[name] = replace(old, healthy=False) if old is not None else _placeholder(name, bindings)
    return tuple(sorted(out.values(), key=lambda n: n.name))


def bindings_by_node(bindings: Iterable[TaskBinding]) -> dict[str, list[TaskBinding]]:
    out: dict[str, list[TaskBinding]] = {}
    for b in bindings:
        out.setdefault(b.node, []).append(b)
    return out


def _placeholder(name: str, bindings: Sequence[TaskBinding]) -> Node:
    top_gpu = max((g for b in bindings for g in b.gpus), default=-1)
    return Node(
        name=name,
        milli_cpu=sum(b.milli_cpu for b in bindings),
        mem_mib=sum(b.mem_mib for b in bindings),
        gpus=tuple(GPU(index=i) for i in range(top_gpu + 1)),
        healthy=False,
    )

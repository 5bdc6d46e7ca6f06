"""Nodes joining and leaving: a gone node stays, unhealthy, while work is bound to it."""

from __future__ import annotations

from aisched.core.decisions import TaskBinding
from aisched.model.cluster import GPU, Node
from aisched.service.membership import bindings_by_node, merge_nodes

A = Node("a", 4000, 8192, (GPU(0), GPU(1)))
B = Node("b", 4000, 8192, (GPU(0), GPU(1)), rack="r2")
C = Node("c", 2000, 4096)


def bound(node: str, gpus: tuple[int, ...] = (1,)) -> TaskBinding:
    return TaskBinding("w", 0, node, gpus, 1000, 500, 256, 0)


def test_joined_nodes_appear_and_unbound_gone_nodes_disappear() -> None:
    assert merge_nodes([A, C], [A, B], {}) == (A, C)


def test_a_gone_node_with_bound_work_stays_unhealthy() -> None:
    got = merge_nodes([A], [A, B], bindings_by_node([bound("b")]))
    assert got == (A, Node("b", 4000, 8192, (GPU(0), GPU(1)), rack="r2", healthy=False))


def test_a_never_seen_bound_node_gets_a_placeholder_big_enough_for_its_work() -> None:
    got = merge_nodes([A], [], bindings_by_node([bound("x", (0, 2)), bound("x", ())]))
    assert got == (A, Node("x", 1000, 512, (GPU(0), GPU(1), GPU(2)), healthy=False))

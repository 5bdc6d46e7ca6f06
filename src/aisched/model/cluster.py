"""Nodes, GPUs and the topology tree (zone / rack / node).

A node's GPUs are listed with their index on the node, so a placement can name concrete devices.
The topology tree carries bandwidth and latency per level, so a gang's placement can be judged
by how much of its traffic crosses slower links.

A cluster may also have autoscaling node pools (`NodePool`): a node template and the bounds an
autoscaler keeps the pool's node count within. `Cluster.nodes` holds the nodes present at the
start, each pool's `min_nodes` included; nodes added later are the pool's `node(i)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum

from aisched.model.numerals import is_decimal
from aisched.model.resources import Resources

NODE_ROLES = ("cpu", "gpu")


class TopologyLevel(IntEnum):
    """Levels of the topology tree, innermost first; the order is used for comparisons."""

    NODE = 0
    RACK = 1
    ZONE = 2
    CLUSTER = 3


@dataclass(frozen=True, slots=True)
class GPU:
    index: int
    model: str = "generic"
    mem_mib: int = 0
    nvlink_group: int = 0


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    milli_cpu: int
    mem_mib: int
    gpus: tuple[GPU, ...] = ()
    zone: str = "zone-0"
    rack: str = "rack-0"
    labels: tuple[tuple[str, str], ...] = ()
    healthy: bool = True
    # What the node is for: "cpu" (CPU-only work), "gpu" (work that asks for GPUs), or None
    # (any). The `node-role` filter keeps CPU-only tasks off "gpu" nodes, so their CPUs and
    # memory stay for the GPU work they serve (disaggregated inference: CPU front ends and
    # pre/post-processing on CPU nodes, model replicas on GPU nodes).
    role: str | None = None
    # At most this many tasks of one app on this node (`Job.app`: the replicas of one service,
    # else the tasks of one job); None: no cap. Spreads the instances of a model service over
    # nodes, as disaggregated inference clusters do (one decode instance per node, say).
    max_per_node: int | None = None
    # RDMA devices (InfiniBand / RoCE adapters) tasks may ask for (`Resources.rdma`).
    rdma: int = 0

    def __post_init__(self) -> None:
        if self.rdma < 0:
            raise ValueError(f"node {self.name}: rdma must be 0 or more")
        if self.max_per_node is not None and self.max_per_node < 1:
            raise ValueError(f"node {self.name}: max_per_node must be at least 1")
        if self.role is None:
            return
        if self.role not in NODE_ROLES:
            raise ValueError(f"node {self.name}: role {self.role!r}; expected cpu or gpu")
        if (self.role == "gpu") != bool(self.gpus):
            has = f"{len(self.gpus)} GPUs" if self.gpus else "no GPUs"
            raise ValueError(f"node {self.name}: role {self.role} but it has {has}")

    @property
    def gpu_model(self) -> str | None:
        """The node's GPU model; nodes hold one model (mixed nodes are rare and unsupported)."""
        return self.gpus[0].model if self.gpus else None

    @property
    def capacity(self) -> Resources:
        return Resources(
            milli_cpu=self.milli_cpu,
            mem_mib=self.mem_mib,
            gpu=len(self.gpus),
            gpu_mem_mib=sum(g.mem_mib for g in self.gpus),
            rdma=self.rdma,
        )

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


def capacity_of(nodes: Iterable[Node]) -> Resources:
    """What `nodes` have together: CPUs, memory and whole GPUs."""
    total = Resources()
    for n in nodes:
        total = total.plus(Resources(milli_cpu=n.milli_cpu, mem_mib=n.mem_mib, gpu=len(n.gpus)))
    return total


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """Bandwidth and latency of traffic that crosses one level of the tree."""

    bandwidth_gbps: float
    latency_us: float


DEFAULT_LINKS: tuple[tuple[TopologyLevel, LinkSpec], ...] = (
    (TopologyLevel.NODE, LinkSpec(bandwidth_gbps=600.0, latency_us=2.0)),
    (TopologyLevel.RACK, LinkSpec(bandwidth_gbps=100.0, latency_us=5.0)),
    (TopologyLevel.ZONE, LinkSpec(bandwidth_gbps=25.0, latency_us=50.0)),
    (TopologyLevel.CLUSTER, LinkSpec(bandwidth_gbps=10.0, latency_us=500.0)),
)


@dataclass(frozen=True, slots=True)
class NodePool:
    """Identical nodes that an autoscaler adds and removes, keeping `min_nodes..max_nodes`.

    `template` gives every field of a pool node but its name: node `i` of the pool is named
    `{name}-{i:04d}`. A node asked for at time t joins at t + `provisioning_delay_s`; a node with
    nothing running on it for `scale_down_idle_s` is removed unless the pool is at its minimum.
    `cost_per_node_hour` (any currency) is what a node costs from the moment it is asked for
    until it is removed; None when the pool does not say.
    """

    name: str
    template: Node
    max_nodes: int
    min_nodes: int = 0
    provisioning_delay_s: float = 0.0
    scale_down_idle_s: float = 600.0
    cost_per_node_hour: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise ValueError(
                f"node pool {self.name}: need 0 <= min_nodes <= max_nodes, "
                f"got {self.min_nodes} and {self.max_nodes}"
            )
        for what, v in (
            ("provisioning_delay_s", self.provisioning_delay_s),
            ("scale_down_idle_s", self.scale_down_idle_s),
        ):
            if not 0 <= v < math.inf:
                raise ValueError(f"node pool {self.name}: {what} must be finite and >= 0")
        cost = self.cost_per_node_hour
        if cost is not None and not 0 <= cost < math.inf:
            raise ValueError(f"node pool {self.name}: cost_per_node_hour must be finite and >= 0")

    def node(self, i: int) -> Node:
        """The pool's node number `i`, made from the template."""
        return replace(self.template, name=f"{self.name}-{i:04d}", healthy=True)

    def owns(self, node_name: str) -> bool:
        """True when `node_name` is one this pool makes."""
        head, _, tail = node_name.rpartition("-")
        return head == self.name and is_decimal(tail)


@dataclass(frozen=True, slots=True)
class Cluster:
    """A set of nodes and the link speeds of its topology tree. Node names are unique.

    `node_pools` are the autoscaling pools; their first `min_nodes` nodes are in `nodes`.
    """

    nodes: tuple[Node, ...]
    links: tuple[tuple[TopologyLevel, LinkSpec], ...] = field(default=DEFAULT_LINKS)
    node_pools: tuple[NodePool, ...] = ()

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate node names: {', '.join(dup[:5])}")
        pools = [p.name for p in self.node_pools]
        if len(set(pools)) != len(pools):
            dup = sorted({n for n in pools if pools.count(n) > 1})
            raise ValueError(f"duplicate node pool names: {', '.join(dup[:5])}")

    def pool_of(self, node_name: str) -> NodePool | None:
        """The autoscaling pool that made `node_name`, if any."""
        for p in self.node_pools:
            if p.owns(node_name):
                return p
        return None

    def at_max(self) -> Cluster:
        """The same cluster with every node pool fixed at its maximum (min = max): what an
        autoscaled cluster is compared against."""
        nodes = [n for n in self.nodes if self.pool_of(n.name) is None]
        pools = []
        for p in self.node_pools:
            nodes.extend(p.node(i) for i in range(p.max_nodes))
            pools.append(replace(p, min_nodes=p.max_nodes))
        return Cluster(tuple(nodes), self.links, tuple(pools))

    def link(self, level: TopologyLevel) -> LinkSpec:
        for lv, spec in self.links:
            if lv == level:
                return spec
        raise KeyError(level)

    @property
    def total_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

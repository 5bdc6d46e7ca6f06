"""Nodes, GPUs and the topology tree (zone / rack / node).

A node's GPUs are listed with their index on the node, so a placement can name concrete devices.
The topology tree carries bandwidth and latency per level, so a gang's placement can be judged
by how much of its traffic crosses slower links.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from aisched.model.resources import Resources


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
        )

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


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
class Cluster:
    """A set of nodes and the link speeds of its topology tree. Node names are unique."""

    nodes: tuple[Node, ...]
    links: tuple[tuple[TopologyLevel, LinkSpec], ...] = field(default=DEFAULT_LINKS)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate node names: {', '.join(dup[:5])}")

    def link(self, level: TopologyLevel) -> LinkSpec:
        for lv, spec in self.links:
            if lv == level:
                return spec
        raise KeyError(level)

    @property
    def total_gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

"""Ray's nodes as the scheduling core sees them: capacity, GPUs, rack, zone and GPU model.

`nodes_from_ray` turns the records of `ray.nodes()` into `Node`s. It is a pure function of those
records (no Ray import here), so it is tested on plain dicts and the executor can call it from
any thread.

Where the topology comes from, first found wins (how an operator sets it: docs/ray.md):

- node labels (`ray start --labels aisched/rack=r1,aisched/zone=z1,aisched/gpu-model=A100`);
- custom resources whose name says it (`ray start --resources '{"rack:r1": 1, "zone:z1": 1}'`);
- for the GPU model only: Ray's own `accelerator_type:A100` resource (set by Ray on GPU nodes);
- else `rack-0`, `zone-0`, GPU model `generic`.

A node's name is its `aisched/name` label, else `<hostname>-<first 8 hex of its node id>`, so
names stay unique when several Ray nodes share one host. Dead nodes and nodes with neither CPUs
nor GPUs (a head node started with `--num-cpus=0` to keep it for control) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aisched.model.cluster import GPU, Node

LABEL_PREFIX = "aisched/"
NAME_LABEL = "aisched/name"
RACK_LABEL = "aisched/rack"
ZONE_LABEL = "aisched/zone"
GPU_MODEL_LABEL = "aisched/gpu-model"
GPU_MEM_LABEL = "aisched/gpu-mem"
# Custom resources as a fallback for Ray versions or deployments without node labels.
RACK_RESOURCE = "rack:"
ZONE_RESOURCE = "zone:"
GPU_MODEL_RESOURCE = "gpu-model:"
RAY_ACCELERATOR_RESOURCE = "accelerator_type:"

_MEM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_MEM_MIB = {"": 1.0 / 2**20, "K": 1.0 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}


@dataclass(frozen=True, slots=True)
class RayNode:
    """One alive Ray node: the `Node` the core schedules on, and how Ray names it."""

    node: Node
    node_id: str  # Ray's hex node id, for NodeAffinitySchedulingStrategy
    address: str  # the node's IP: MASTER_ADDR when rank 0 runs there


def nodes_from_ray(records: Iterable[Mapping[str, Any]]) -> tuple[RayNode, ...]:
    """The alive, usable nodes of `ray.nodes()`, sorted by name."""
    out: dict[str, RayNode] = {}
    for rec in records:
        if not rec.get("Alive"):
            continue
        rn = _one(rec)
        if rn is None:
            continue
        if rn.node.name in out:  # a label named two nodes alike: keep both, told apart by id
            rn = _renamed(rn, f"{rn.node.name}-{rn.node_id[:8]}")
        out[rn.node.name] = rn
    return tuple(out[name] for name in sorted(out))


def _one(rec: Mapping[str, Any]) -> RayNode | None:
    resources: Mapping[str, float] = rec.get("Resources") or {}
    labels: Mapping[str, str] = rec.get("Labels") or {}
    node_id = str(rec["NodeID"])
    milli_cpu = int(round(float(resources.get("CPU", 0.0)) * 1000))
    num_gpus = int(float(resources.get("GPU", 0.0)))
    if milli_cpu <= 0 and num_gpus <= 0:
        return None
    mem_mib = int(float(resources.get("memory", 0.0)) // 2**20)
    host = str(rec.get("NodeManagerHostname") or "ray")
    name = labels.get(NAME_LABEL) or f"{host}-{node_id[:8]}"
    model = (
        labels.get(GPU_MODEL_LABEL)
        or _from_resource(resources, GPU_MODEL_RESOURCE)
        or _from_resource(resources, RAY_ACCELERATOR_RESOURCE)
        or "generic"
    )
    gpu_mem = parse_mem_label(labels.get(GPU_MEM_LABEL))
    node = Node(
        name=name,
        milli_cpu=max(milli_cpu, 0),
        mem_mib=mem_mib,
        gpus=tuple(GPU(index=i, model=model, mem_mib=gpu_mem) for i in range(num_gpus)),
        zone=labels.get(ZONE_LABEL) or _from_resource(resources, ZONE_RESOURCE) or "zone-0",
        rack=labels.get(RACK_LABEL) or _from_resource(resources, RACK_RESOURCE) or "rack-0",
        labels=tuple(sorted((k, str(v)) for k, v in labels.items() if k.startswith(LABEL_PREFIX))),
    )
    return RayNode(node, node_id, str(rec.get("NodeManagerAddress") or "127.0.0.1"))


def _from_resource(resources: Mapping[str, float], prefix: str) -> str | None:
    found = sorted(k[len(prefix) :] for k in resources if k.startswith(prefix) and k != prefix)
    return found[0] if found else None


def _renamed(rn: RayNode, name: str) -> RayNode:
    n = rn.node
    node = Node(name, n.milli_cpu, n.mem_mib, n.gpus, n.zone, n.rack, n.labels, n.healthy)
    return RayNode(node, rn.node_id, rn.address)


def parse_mem_label(value: str | None) -> int:
    """MiB from a label such as `80G`, `80Gi` or `81920M` (bare numbers are bytes); 0 when
    absent or unreadable (the GPU's memory is then unknown, as on a declared GPU)."""
    if not value:
        return 0
    m = _MEM.match(value)
    if m is None:
        return 0
    return int(float(m.group(1)) * _MEM_MIB[m.group(2).upper()])

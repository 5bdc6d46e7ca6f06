"""The cluster description file: YAML, validated with pydantic, converted to `model.Cluster`.

A file lists node *pools*, each expanded into `zones × racks_per_zone × nodes_per_rack`
identical nodes, and optional explicit *nodes*. Naming is fixed so that decisions and logs are
reproducible: pool `a100` gives nodes `a100-0000`, ... (filled rack by rack, zone by zone), racks
`a100-rack-00`, ... and zones `zone-0`, ...; zones are shared by index across pools, racks are
not. GPUs are numbered from 0 and split into NVLink groups of `nvlink_group_size` by index.
A pool, node or template may say what it is for, `role: cpu` (CPU-only work; no GPUs) or
`role: gpu` (work that asks for GPUs); the `node-role` filter then keeps CPU-only tasks off GPU
nodes. `max_per_node: N` caps the tasks of one app on each such node (`core.caps`), and
`rdma: N` gives each node N RDMA devices that tasks may ask for (`resources.rdma`).

`autoscaling_pools` are node pools an autoscaler grows and shrinks (the simulator does; see
`model.cluster.NodePool`): a node `template`, `min`/`max` nodes, an optional provisioning delay,
scale-down idle time and cost per node-hour. Their nodes are named `{pool}-0000`, ..., all in
rack `{pool}-rack` of the template's zone; the first `min` are there from the start.

Every mistake is reported as a `SpecError` naming the field path; unknown keys are rejected.
Pydantic types stay in this module: `cluster_from_dict` is the one place they become model
types. Built-in clusters are YAML files shipped in `aisched/data/`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from aisched.model.cluster import (
    DEFAULT_LINKS,
    GPU,
    Cluster,
    LinkSpec,
    Node,
    NodePool,
    TopologyLevel,
)
from aisched.spec.errors import Number, SpecError, parse_yaml, read_text_file
from aisched.spec.job_common import checked_name

# A typo such as `nodes_per_rack: 80000` should be an error, not an out-of-memory crash.
MAX_NODES = 100_000

MAX_NAME_LEN = 128


def _name(v: str) -> str:
    return checked_name(v, MAX_NAME_LEN)


Name = Annotated[StrictStr, AfterValidator(_name)]
# Strict and finite: YAML's `yes` is no count, and `.nan` or `.inf` no size.
Count = Annotated[StrictInt, Field(ge=1, le=MAX_NODES)]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
PositiveFloat = Annotated[Number, Field(gt=0)]
NonNegFloat = Annotated[Number, Field(ge=0)]
# What one node may have, as the service's `node` settings bound it: past these a file is a
# mistake, and a per-node array of that size would take the machine's memory.
NodeGpus = Annotated[StrictInt, Field(ge=0, le=1024)]
NodeCpus = Annotated[Number, Field(gt=0, le=100_000)]
NodeMemGib = Annotated[Number, Field(gt=0, le=1 << 20)]
GpuMemGib = Annotated[Number, Field(ge=0, le=1 << 14)]
NodeRdma = Annotated[StrictInt, Field(ge=0, le=1024)]
# What a node is for (`model.cluster.Node.role`): CPU-only work, or work that asks for GPUs.
Role = Literal["cpu", "gpu"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkModel(_Spec):
    bandwidth_gbps: PositiveFloat
    latency_us: NonNegFloat


class LinksModel(_Spec):
    """Link speed per topology level; a level left out keeps its default."""

    node: LinkModel | None = None
    rack: LinkModel | None = None
    zone: LinkModel | None = None
    cluster: LinkModel | None = None


class PoolModel(_Spec):
    name: Name
    zones: Count = 1
    racks_per_zone: Count = 1
    nodes_per_rack: Count
    gpus_per_node: NodeGpus = 0
    gpu_model: Name = "generic"
    gpu_mem_gib: GpuMemGib = 0.0
    nvlink_group_size: Count | None = None  # None: all GPUs of a node in one group
    cpus: NodeCpus
    mem_gib: NodeMemGib
    labels: dict[str, str] = Field(default_factory=dict)
    role: Role | None = None
    max_per_node: Count | None = None
    rdma: NodeRdma = 0

    @model_validator(mode="after")
    def _not_too_big(self) -> PoolModel:
        _check_role(self.role, self.gpus_per_node, "gpus_per_node")
        n = self.zones * self.racks_per_zone * self.nodes_per_rack
        if n > MAX_NODES:
            raise ValueError(f"pool expands to {n} nodes, more than the limit of {MAX_NODES}")
        return self


class TemplateModel(_Spec):
    """A node of an autoscaling pool: a node's fields, less its name, rack and health."""

    zone: Name = "zone-0"
    cpus: NodeCpus
    mem_gib: NodeMemGib
    gpus: NodeGpus = 0
    gpu_model: Name = "generic"
    gpu_mem_gib: GpuMemGib = 0.0
    nvlink_group_size: Count | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    role: Role | None = None
    max_per_node: Count | None = None
    rdma: NodeRdma = 0

    @model_validator(mode="after")
    def _role_fits(self) -> TemplateModel:
        _check_role(self.role, self.gpus, "gpus")
        return self


def _check_role(role: str | None, gpus: int, field: str) -> None:
    if role == "gpu" and not gpus:
        raise ValueError(f"role gpu needs GPUs ({field} is 0)")
    if role == "cpu" and gpus:
        raise ValueError(f"role cpu is for CPU-only nodes ({field} is {gpus})")


class NodeModel(TemplateModel):
    name: Name
    rack: Name = "rack-0"
    healthy: bool = True


class AutoscalingPoolModel(_Spec):
    name: Name
    template: TemplateModel
    min: NonNegInt = 0
    max: NonNegInt
    provisioning_delay_s: NonNegFloat = 0.0
    scale_down_idle_s: NonNegFloat = 600.0
    cost_per_node_hour: NonNegFloat | None = None

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingPoolModel:
        if self.max < 1:
            raise ValueError("max must be at least 1 (a pool that can hold no node is no pool)")
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is more than max ({self.max})")
        if self.max > MAX_NODES:
            raise ValueError(f"max {self.max} is more than the limit of {MAX_NODES} nodes")
        return self


class ClusterSpec(_Spec):
    links: LinksModel | None = None
    pools: list[PoolModel] = Field(default_factory=list)
    nodes: list[NodeModel] = Field(default_factory=list)
    autoscaling_pools: list[AutoscalingPoolModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> ClusterSpec:
        if not self.pools and not self.nodes and not self.autoscaling_pools:
            raise ValueError(
                "a cluster needs at least one entry in pools, nodes or autoscaling_pools"
            )
        return self


def cluster_from_dict(data: Any, source: str = "<dict>") -> Cluster:
    """Validate a parsed cluster document and build the `Cluster` it describes."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{source}: expected a mapping with pools and/or nodes, got {kind}")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError.from_validation_error(e, source) from None
    return _to_cluster(spec, source)


def load_cluster_file(path: str | Path) -> Cluster:
    """Read and convert one cluster YAML file; every problem is a SpecError."""
    source = str(path)
    return cluster_from_dict(parse_yaml(read_text_file(path), source), source)


def builtin_cluster_names() -> tuple[str, ...]:
    """Names of the clusters shipped with the package (`small`, `philly`, ...)."""
    data = resources.files("aisched") / "data"
    if not data.is_dir():
        return ()
    return tuple(
        sorted(f.name.removesuffix(".yaml") for f in data.iterdir() if f.name.endswith(".yaml"))
    )


def builtin_cluster(name: str) -> Cluster:
    """A cluster shipped with the package, by name."""
    names = builtin_cluster_names()
    if name not in names:
        raise SpecError(
            f"unknown built-in cluster {name!r}; built-ins: {', '.join(names) or '(none)'}"
        )
    text = (resources.files("aisched") / "data" / f"{name}.yaml").read_text(encoding="utf-8")
    source = f"builtin:{name}"
    return cluster_from_dict(parse_yaml(text, source), source)


def resolve_cluster(name_or_path: str) -> Cluster:
    """A cluster file when the argument is an existing path or ends in .yaml/.yml, else a
    built-in name."""
    p = Path(name_or_path)
    if p.exists() or p.suffix in (".yaml", ".yml"):
        return load_cluster_file(p)
    return builtin_cluster(name_or_path)


def _to_cluster(spec: ClusterSpec, source: str) -> Cluster:
    # 1. Expand pools, then autoscaling pools (step 2), then explicit nodes, remembering where
    #    each name came from so a clash can be reported at the entry that caused it.
    #    A rack must sit in one zone, or the topology tree would not be a tree.
    nodes: list[Node] = []
    origin: dict[str, str] = {}
    rack_zone: dict[str, tuple[str, str]] = {}
    problems: list[str] = []

    def add(node: Node, where: str) -> None:
        if node.name in origin:
            problems.append(
                f"{source}: {where}.name: duplicate node name {node.name!r} "
                f"(already made by {origin[node.name]})"
            )
            return
        zone, first = rack_zone.setdefault(node.rack, (node.zone, where))
        if zone != node.zone:
            problems.append(
                f"{source}: {where}.zone: rack {node.rack!r} is in zone {zone!r} "
                f"at {first}, not {node.zone!r}"
            )
            return
        origin[node.name] = where
        nodes.append(node)

    for p_i, pool in enumerate(spec.pools):
        gpus = _gpus(pool.gpus_per_node, pool.gpu_model, pool.gpu_mem_gib, pool.nvlink_group_size)
        labels = tuple(sorted(pool.labels.items()))
        i = 0
        for z in range(pool.zones):
            for r in range(pool.racks_per_zone):
                rack = f"{pool.name}-rack-{z * pool.racks_per_zone + r:02d}"
                for _ in range(pool.nodes_per_rack):
                    node = Node(
                        name=f"{pool.name}-{i:04d}",
                        milli_cpu=_milli(pool.cpus),
                        mem_mib=_mib(pool.mem_gib),
                        gpus=gpus,
                        zone=f"zone-{z}",
                        rack=rack,
                        labels=labels,
                        role=pool.role,
                        max_per_node=pool.max_per_node,
                        rdma=pool.rdma,
                    )
                    add(node, f"pools.{p_i}")
                    i += 1
    # 2. Autoscaling pools: names unique among all pools (a node name says which pool made it),
    #    a cost for every pool or for none (a pool without one could be neither cheaper nor
    #    dearer than the others), and the first `min` nodes present from the start.
    pool_names = {p.name: f"pools.{i}" for i, p in enumerate(spec.pools)}
    node_pools: list[NodePool] = []
    with_cost = [p.cost_per_node_hour is not None for p in spec.autoscaling_pools]
    for a_i, ap in enumerate(spec.autoscaling_pools):
        where = f"autoscaling_pools.{a_i}"
        if ap.name in pool_names:
            problems.append(
                f"{source}: {where}.name: pool name {ap.name!r} already used at "
                f"{pool_names[ap.name]}"
            )
            continue
        pool_names[ap.name] = where
        if any(with_cost) and not with_cost[a_i]:
            problems.append(
                f"{source}: {where}.cost_per_node_hour: missing; give a cost for every "
                "autoscaling pool or for none"
            )
        t = ap.template
        node_pool = NodePool(
            name=ap.name,
            template=_node(t, ap.name, f"{ap.name}-rack"),
            max_nodes=ap.max,
            min_nodes=ap.min,
            provisioning_delay_s=ap.provisioning_delay_s,
            scale_down_idle_s=ap.scale_down_idle_s,
            cost_per_node_hour=ap.cost_per_node_hour,
        )
        node_pools.append(node_pool)
        for i in range(ap.min):
            add(node_pool.node(i), where)
    for n_i, n in enumerate(spec.nodes):
        owner = next((p for p in node_pools if p.owns(n.name)), None)
        if owner is not None:
            problems.append(
                f"{source}: nodes.{n_i}.name: {n.name!r} is a name autoscaling pool "
                f"{owner.name!r} gives its nodes"
            )
            continue
        add(_node(n, n.name, n.rack, n.healthy), f"nodes.{n_i}")
    if problems:
        raise SpecError(problems)

    # 3. Links: defaults, overridden per level by the file.
    links = dict(DEFAULT_LINKS)
    if spec.links is not None:
        for level in TopologyLevel:
            given: LinkModel | None = getattr(spec.links, level.name.lower())
            if given is not None:
                links[level] = LinkSpec(
                    bandwidth_gbps=given.bandwidth_gbps, latency_us=given.latency_us
                )
    return Cluster(
        nodes=tuple(nodes), links=tuple(sorted(links.items())), node_pools=tuple(node_pools)
    )


def _node(t: TemplateModel, name: str, rack: str, healthy: bool = True) -> Node:
    """A node of the file (a `NodeModel`) or of a pool's template, named and placed."""
    return Node(
        name=name,
        milli_cpu=_milli(t.cpus),
        mem_mib=_mib(t.mem_gib),
        gpus=_gpus(t.gpus, t.gpu_model, t.gpu_mem_gib, t.nvlink_group_size),
        zone=t.zone,
        rack=rack,
        labels=tuple(sorted(t.labels.items())),
        healthy=healthy,
        role=t.role,
        max_per_node=t.max_per_node,
        rdma=t.rdma,
    )


def _gpus(count: int, model: str, mem_gib: float, group_size: int | None) -> tuple[GPU, ...]:
    size = group_size or max(count, 1)
    return tuple(
        GPU(index=i, model=model, mem_mib=_mib(mem_gib), nvlink_group=i // size)
        for i in range(count)
    )


def _milli(cpus: float) -> int:
    return round(cpus * 1000)


def _mib(gib: float) -> int:
    return round(gib * 1024)

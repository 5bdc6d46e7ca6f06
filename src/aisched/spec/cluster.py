"""The cluster description file: YAML, validated with pydantic, converted to `model.Cluster`.

A file lists node *pools*, each expanded into `zones × racks_per_zone × nodes_per_rack`
identical nodes, and optional explicit *nodes*. Naming is fixed so that decisions and logs are
reproducible: pool `a100` gives nodes `a100-0000`, ... (filled rack by rack, zone by zone), racks
`a100-rack-00`, ... and zones `zone-0`, ...; zones are shared by index across pools, racks are
not. GPUs are numbered from 0 and split into NVLink groups of `nvlink_group_size` by index.

Every mistake is reported as a `SpecError` naming the field path; unknown keys are rejected.
Pydantic types stay in this module: `cluster_from_dict` is the one place they become model
types. Built-in clusters are YAML files shipped in `aisched/data/`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aisched.model.cluster import DEFAULT_LINKS, GPU, Cluster, LinkSpec, Node, TopologyLevel
from aisched.spec.errors import SpecError, parse_yaml

# A typo such as `nodes_per_rack: 80000` should be an error, not an out-of-memory crash.
MAX_NODES = 100_000

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Count = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


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
    gpus_per_node: NonNegInt = 0
    gpu_model: Name = "generic"
    gpu_mem_gib: NonNegFloat = 0.0
    nvlink_group_size: Count | None = None  # None: all GPUs of a node in one group
    cpus: PositiveFloat
    mem_gib: PositiveFloat
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_too_big(self) -> PoolModel:
        n = self.zones * self.racks_per_zone * self.nodes_per_rack
        if n > MAX_NODES:
            raise ValueError(f"pool expands to {n} nodes, more than the limit of {MAX_NODES}")
        return self


class NodeModel(_Spec):
    name: Name
    rack: Name = "rack-0"
    zone: Name = "zone-0"
    cpus: PositiveFloat
    mem_gib: PositiveFloat
    gpus: NonNegInt = 0
    gpu_model: Name = "generic"
    gpu_mem_gib: NonNegFloat = 0.0
    nvlink_group_size: Count | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    healthy: bool = True


class ClusterSpec(_Spec):
    links: LinksModel | None = None
    pools: list[PoolModel] = Field(default_factory=list)
    nodes: list[NodeModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> ClusterSpec:
        if not self.pools and not self.nodes:
            raise ValueError("a cluster needs at least one entry in pools or nodes")
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
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{source}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{source}: not UTF-8 text: {e.reason}") from None
    return cluster_from_dict(parse_yaml(text, source), source)


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
    # 1. Expand pools and explicit nodes in file order, remembering where each name came from
    #    so a clash can be reported at the entry that caused it.
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
                    )
                    add(node, f"pools.{p_i}")
                    i += 1
    for n_i, n in enumerate(spec.nodes):
        node = Node(
            name=n.name,
            milli_cpu=_milli(n.cpus),
            mem_mib=_mib(n.mem_gib),
            gpus=_gpus(n.gpus, n.gpu_model, n.gpu_mem_gib, n.nvlink_group_size),
            zone=n.zone,
            rack=n.rack,
            labels=tuple(sorted(n.labels.items())),
            healthy=n.healthy,
        )
        add(node, f"nodes.{n_i}")
    if problems:
        raise SpecError(problems)

    # 2. Links: defaults, overridden per level by the file.
    links = dict(DEFAULT_LINKS)
    if spec.links is not None:
        for level in TopologyLevel:
            given: LinkModel | None = getattr(spec.links, level.name.lower())
            if given is not None:
                links[level] = LinkSpec(
                    bandwidth_gbps=given.bandwidth_gbps, latency_us=given.latency_us
                )
    return Cluster(nodes=tuple(nodes), links=tuple(sorted(links.items())))


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

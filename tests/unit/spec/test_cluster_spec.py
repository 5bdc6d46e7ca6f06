"""The cluster description file: what a valid file builds, and how each mistake is reported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from aisched.model.cluster import LinkSpec, TopologyLevel
from aisched.spec import (
    SpecError,
    builtin_cluster,
    builtin_cluster_names,
    cluster_from_dict,
    format_validation_error,
    load_cluster_file,
    resolve_cluster,
)

EXAMPLE = """\
# a cluster: node pools, each expanded into racks of nodes
links:
  node: {bandwidth_gbps: 600, latency_us: 2}
  rack: {bandwidth_gbps: 100, latency_us: 5}
  zone: {bandwidth_gbps: 25, latency_us: 50}
  cluster: {bandwidth_gbps: 10, latency_us: 500}
pools:
  - name: a100
    zones: 1
    racks_per_zone: 4
    nodes_per_rack: 8
    gpus_per_node: 8
    gpu_model: A100
    gpu_mem_gib: 80
    nvlink_group_size: 4
    cpus: 96
    mem_gib: 1024
    labels: {tier: prod}
nodes:
  - {name: box1, rack: r1, zone: z1, cpus: 32, mem_gib: 256,
     gpus: 4, gpu_model: V100, gpu_mem_gib: 32}
"""


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Relative file names, so error messages can be compared whole.
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_example_file(in_tmp: Path) -> None:
    (in_tmp / "cluster.yaml").write_text(EXAMPLE)
    c = load_cluster_file("cluster.yaml")
    assert len(c.nodes) == 4 * 8 + 1
    assert c.total_gpus == 32 * 8 + 4
    assert len({n.rack for n in c.nodes}) == 5
    assert {n.zone for n in c.nodes} == {"zone-0", "z1"}

    first, ninth, box = c.nodes[0], c.nodes[8], c.nodes[-1]
    assert (first.name, first.rack, first.zone) == ("a100-0000", "a100-rack-00", "zone-0")
    assert (ninth.name, ninth.rack) == ("a100-0008", "a100-rack-01")
    assert (first.milli_cpu, first.mem_mib) == (96_000, 1024 * 1024)
    assert first.labels == (("tier", "prod"),)
    assert first.label("tier") == "prod"
    assert [g.nvlink_group for g in first.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {(g.model, g.mem_mib) for g in first.gpus} == {("A100", 80 * 1024)}
    assert (box.name, box.rack, box.zone, box.gpu_model) == ("box1", "r1", "z1", "V100")
    assert box.capacity.gpu_mem_mib == 4 * 32 * 1024
    assert [g.nvlink_group for g in box.gpus] == [0, 0, 0, 0]  # no group size: one group
    assert c.link(TopologyLevel.ZONE) == LinkSpec(bandwidth_gbps=25.0, latency_us=50.0)


def test_links_default_per_level() -> None:
    c = cluster_from_dict(
        {
            "links": {"rack": {"bandwidth_gbps": 200, "latency_us": 3}},
            "nodes": [{"name": "n1", "cpus": 0.5, "mem_gib": 0.5}],
        }
    )
    assert c.link(TopologyLevel.RACK) == LinkSpec(200.0, 3.0)
    assert c.link(TopologyLevel.CLUSTER) == LinkSpec(10.0, 500.0)
    assert [lv for lv, _ in c.links] == list(TopologyLevel)
    assert (c.nodes[0].milli_cpu, c.nodes[0].mem_mib, c.nodes[0].gpus) == (500, 512, ())


def _pool(**over: Any) -> dict[str, Any]:
    return {"name": "p", "nodes_per_rack": 2, "cpus": 8, "mem_gib": 64, **over}


@dataclass(frozen=True)
class Case:
    name: str
    data: Any
    want: list[str]


ERROR_CASES = [
    Case(
        "negative gpus",
        {"pools": [_pool(gpus_per_node=-1)]},
        ["c.yaml: pools.0.gpus_per_node: must be at least 0, got -1"],
    ),
    Case(
        "unknown key in a pool",
        {"pools": [_pool(gpu_modle="A100")]},
        ["c.yaml: pools.0.gpu_modle: unknown key"],
    ),
    Case("unknown top-level key", {"pool": [_pool()]}, ["c.yaml: pool: unknown key"]),
    Case(
        "two problems at once",
        {"pools": [_pool(), _pool(name="q", nodes_per_rack=0, cpus="many")]},
        [
            "c.yaml: pools.1.nodes_per_rack: must be at least 1, got 0",
            "c.yaml: pools.1.cpus: expected a number, got 'many' (a string)",
        ],
    ),
    Case(
        "missing field",
        {"nodes": [{"name": "n", "cpus": 4}]},
        ["c.yaml: nodes.0.mem_gib: Field required"],
    ),
    Case(
        "bad link",
        {"links": {"zone": {"bandwidth_gbps": 0, "latency_us": 1}}, "pools": [_pool()]},
        ["c.yaml: links.zone.bandwidth_gbps: must be more than 0, got 0"],
    ),
    Case(
        "nothing in it",
        {},
        ["c.yaml: a cluster needs at least one entry in pools, nodes or autoscaling_pools"],
    ),
    Case("empty document", None, ["c.yaml: expected a mapping with pools and/or nodes, got empty"]),
    Case("a list", [1], ["c.yaml: expected a mapping with pools and/or nodes, got a list"]),
    Case(
        "too big",
        {"pools": [_pool(zones=10, racks_per_zone=100, nodes_per_rack=1000)]},
        ["c.yaml: pools.0: pool expands to 1000000 nodes, more than the limit of 100000"],
    ),
    Case(
        "duplicate node name",
        {"pools": [_pool()], "nodes": [{"name": "p-0001", "cpus": 1, "mem_gib": 1}]},
        ["c.yaml: nodes.0.name: duplicate node name 'p-0001' (already made by pools.0)"],
    ),
    Case(
        "a gpu role without GPUs",
        {"pools": [_pool(role="gpu")]},
        ["c.yaml: pools.0: role gpu needs GPUs (gpus_per_node is 0)"],
    ),
    Case(
        "a cpu role with GPUs",
        {"nodes": [{"name": "n", "cpus": 4, "mem_gib": 8, "gpus": 2, "role": "cpu"}]},
        ["c.yaml: nodes.0: role cpu is for CPU-only nodes (gpus is 2)"],
    ),
    Case(
        "a zero cap",
        {"pools": [_pool(max_per_node=0)]},
        ["c.yaml: pools.0.max_per_node: must be at least 1, got 0"],
    ),
    Case(
        "an unknown role",
        {"pools": [_pool(role="storage")]},
        ["c.yaml: pools.0.role: expected 'cpu' or 'gpu', got 'storage' (a string)"],
    ),
    Case(
        "a node's fields of the wrong types",
        {
            "nodes": [
                {
                    "name": "-n",
                    "cpus": 4,
                    "mem_gib": 8,
                    "gpus": 1,
                    "gpu_model": 7,
                    "rack": 5,
                    "labels": {"a": 1},
                    "healthy": "maybe",
                    "role": "x",
                },
            ]
        },
        [
            "c.yaml: nodes.0.gpu_model: expected a string, got 7 (an integer)",
            "c.yaml: nodes.0.labels.a: expected a string, got 1 (an integer)",
            "c.yaml: nodes.0.role: expected 'cpu' or 'gpu', got 'x' (a string)",
            "c.yaml: nodes.0.name: '-n' is not a valid name: 1 to 128 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit",
            "c.yaml: nodes.0.rack: expected a string, got 5 (an integer)",
            "c.yaml: nodes.0.healthy: expected true or false, got 'maybe' (a string)",
        ],
    ),  # fmt: skip
    Case(
        "more than a node holds",  # 1e8 GPUs a node took gigabytes before it failed
        {
            "pools": [_pool(gpus_per_node=100_000_000, rdma=10**23)],
            "nodes": [{"name": "n", "cpus": 4, "mem_gib": 8, "gpus": 1, "gpu_mem_gib": 1e300}],
        },
        [
            "c.yaml: pools.0.gpus_per_node: must be at most 1,024, got 100000000",
            "c.yaml: pools.0.rdma: must be at most 1,024, got 100000000000000000000000",
            "c.yaml: nodes.0.gpu_mem_gib: must be at most 16,384, got 1e+300",
        ],
    ),  # fmt: skip
    Case(  # YAML reads `yes` as true, `.nan` and `.inf` as floats: none is a count or a size
        "a boolean, NaN or infinity",
        {
            "links": {"rack": {"bandwidth_gbps": float("inf"), "latency_us": float("nan")}},
            "pools": [_pool(gpus_per_node=True, cpus=float("nan"), nodes_per_rack=2.0)],
            "nodes": [{"name": "n", "cpus": 4, "mem_gib": float("inf"), "gpu_mem_gib": False}],
        },
        [
            "c.yaml: links.rack.bandwidth_gbps: inf is not a finite number",
            "c.yaml: links.rack.latency_us: nan is not a finite number",
            "c.yaml: pools.0.nodes_per_rack: expected an integer, got 2.0 (a number)",
            "c.yaml: pools.0.gpus_per_node: expected an integer, got true (a boolean)",
            "c.yaml: pools.0.cpus: nan is not a finite number",
            "c.yaml: nodes.0.mem_gib: inf is not a finite number",
            "c.yaml: nodes.0.gpu_mem_gib: expected a number, got false (a boolean)",
        ],
    ),
    Case(
        "rack in two zones",
        {
            "nodes": [
                {"name": "a", "rack": "r", "zone": "z1", "cpus": 1, "mem_gib": 1},
                {"name": "b", "rack": "r", "zone": "z2", "cpus": 1, "mem_gib": 1},
            ]
        },
        ["c.yaml: nodes.1.zone: rack 'r' is in zone 'z1' at nodes.0, not 'z2'"],
    ),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.name)
def test_errors_name_the_field(case: Case) -> None:
    with pytest.raises(SpecError) as info:
        cluster_from_dict(case.data, "c.yaml")
    assert list(info.value.problems) == case.want
    assert str(info.value) == "\n".join(case.want)


def test_node_roles_reach_the_nodes() -> None:
    c = cluster_from_dict(
        {
            "pools": [
                _pool(name="front", role="cpu"),
                _pool(name="model", gpus_per_node=8, role="gpu"),
                _pool(name="any", gpus_per_node=1),
            ],
            "autoscaling_pools": [
                {"name": "burst", "max": 2, "template": {"cpus": 4, "mem_gib": 8, "role": "cpu"}}
            ],
        }
    )
    assert [(n.name, n.role) for n in c.nodes] == [
        ("front-0000", "cpu"),
        ("front-0001", "cpu"),
        ("model-0000", "gpu"),
        ("model-0001", "gpu"),
        ("any-0000", None),
        ("any-0001", None),
    ]
    assert c.node_pools[0].template.role == "cpu"


def test_max_per_node_and_rdma_reach_the_nodes() -> None:
    c = cluster_from_dict(
        {
            "pools": [_pool(name="decode", gpus_per_node=8, role="gpu", max_per_node=1)],
            "nodes": [{"name": "spare", "cpus": 4, "mem_gib": 8, "max_per_node": 3, "rdma": 2}],
        }
    )
    assert [(n.name, n.max_per_node, n.rdma) for n in c.nodes] == [
        ("decode-0000", 1, 0),
        ("decode-0001", 1, 0),
        ("spare", 3, 2),
    ]
    assert c.nodes[2].capacity.rdma == 2


def test_negative_gpus_in_a_file(in_tmp: Path) -> None:
    (in_tmp / "cluster.yaml").write_text(EXAMPLE.replace("gpus_per_node: 8", "gpus_per_node: -2"))
    with pytest.raises(SpecError) as info:
        load_cluster_file(Path("cluster.yaml"))
    assert str(info.value) == ("cluster.yaml: pools.0.gpus_per_node: must be at least 0, got -2")


def test_unknown_key_in_a_file(in_tmp: Path) -> None:
    (in_tmp / "cluster.yaml").write_text(EXAMPLE.replace("labels:", "lables:"))
    with pytest.raises(SpecError, match=r"^cluster\.yaml: pools\.0\.lables: unknown key$"):
        load_cluster_file("cluster.yaml")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("pools:\n  - name: [a\n    cpus: 4\n", "cluster.yaml:3:9: YAML syntax error: "),
        ("pools: []\nnodes: []\npools: []\n", "cluster.yaml:3:1: YAML syntax error: key 'pools' "),
        ("\tpools: []\n", "cluster.yaml:1:1: YAML syntax error: "),
    ],
)
def test_bad_yaml_gives_line_and_column(in_tmp: Path, text: str, want: str) -> None:
    (in_tmp / "cluster.yaml").write_text(text)
    with pytest.raises(SpecError) as info:
        load_cluster_file("cluster.yaml")
    assert str(info.value).startswith(want)


def test_unreadable_file(in_tmp: Path) -> None:
    with pytest.raises(SpecError, match=r"^nope\.yaml: cannot read: "):
        load_cluster_file("nope.yaml")


def test_builtins() -> None:
    assert set(builtin_cluster_names()) >= {"philly", "small"}
    philly = builtin_cluster("philly")
    assert (len(philly.nodes), philly.total_gpus) == (96, 768)
    assert len({n.rack for n in philly.nodes}) == 12
    assert {(n.gpu_model, n.gpus[0].mem_mib) for n in philly.nodes} == {("P100", 24 * 1024)}
    small = builtin_cluster("small")
    assert (len(small.nodes), small.total_gpus, len({n.rack for n in small.nodes})) == (8, 64, 2)


def test_resolve_cluster(in_tmp: Path) -> None:
    assert resolve_cluster("small") == builtin_cluster("small")
    (in_tmp / "mine.yml").write_text(EXAMPLE)
    assert len(resolve_cluster("mine.yml").nodes) == 33
    (in_tmp / "noext").write_text("nodes: [{name: x, cpus: 1, mem_gib: 1}]\n")
    assert [n.name for n in resolve_cluster("noext").nodes] == ["x"]
    with pytest.raises(SpecError, match="cannot read"):
        resolve_cluster("missing.yaml")
    with pytest.raises(SpecError) as info:
        resolve_cluster("openb-ish")
    assert "unknown built-in cluster 'openb-ish'" in str(info.value)
    assert "philly" in str(info.value) and "small" in str(info.value)


def test_format_validation_error() -> None:
    class M(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int

    with pytest.raises(ValidationError) as info:
        M.model_validate({"a": "x", "b": 1})
    assert format_validation_error(info.value, "f.yaml") == (
        "f.yaml: a: expected an integer, got 'x' (a string)\nf.yaml: b: unknown key"
    )


# --- autoscaling pools -------------------------------------------------------------------------


def _auto(**over: Any) -> dict[str, Any]:
    return {
        "name": "gpu",
        "max": 4,
        "template": {"cpus": 32, "mem_gib": 256, "gpus": 8, "gpu_model": "A100"},
        **over,
    }


def test_autoscaling_pool_builds_its_min_nodes() -> None:
    c = cluster_from_dict(
        {
            "autoscaling_pools": [
                _auto(
                    min=2, provisioning_delay_s=120, scale_down_idle_s=300, cost_per_node_hour=4.5
                ),
            ]
        }
    )
    (pool,) = c.node_pools
    assert (pool.name, pool.min_nodes, pool.max_nodes) == ("gpu", 2, 4)
    assert (pool.provisioning_delay_s, pool.scale_down_idle_s) == (120.0, 300.0)
    assert pool.cost_per_node_hour == 4.5
    assert [n.name for n in c.nodes] == ["gpu-0000", "gpu-0001"]
    assert {n.rack for n in c.nodes} == {"gpu-rack"}
    assert pool.template.milli_cpu == 32_000 and len(pool.template.gpus) == 8
    assert pool.node(7).name == "gpu-0007" and pool.owns("gpu-0007")
    assert c.pool_of("gpu-0001") is pool
    fixed = c.at_max()
    assert [n.name for n in fixed.nodes] == ["gpu-0000", "gpu-0001", "gpu-0002", "gpu-0003"]
    assert fixed.node_pools[0].min_nodes == 4


def test_autoscaling_pool_at_min_zero_alone_is_a_cluster() -> None:
    c = cluster_from_dict({"autoscaling_pools": [_auto()]})
    assert c.nodes == () and c.node_pools[0].min_nodes == 0


AUTOSCALE_ERROR_CASES = [
    Case(
        "min above max",
        {"autoscaling_pools": [_auto(min=5)]},
        ["c.yaml: autoscaling_pools.0: min (5) is more than max (4)"],
    ),
    Case(
        "max zero",
        {"autoscaling_pools": [_auto(max=0)]},
        [
            "c.yaml: autoscaling_pools.0: max must be at least 1 (a pool that can hold no node "
            "is no pool)"
        ],
    ),
    Case(
        "max missing",
        {"autoscaling_pools": [{"name": "gpu", "template": {"cpus": 1, "mem_gib": 1}}]},
        ["c.yaml: autoscaling_pools.0.max: Field required"],
    ),
    Case(
        "negative delay",
        {"autoscaling_pools": [_auto(provisioning_delay_s=-1)]},
        ["c.yaml: autoscaling_pools.0.provisioning_delay_s: must be at least 0, got -1"],
    ),
    Case(
        "bad template field",
        {"autoscaling_pools": [_auto(template={"cpus": 0, "mem_gib": 1, "gpu": 8})]},
        [
            "c.yaml: autoscaling_pools.0.template.cpus: must be more than 0, got 0",
            "c.yaml: autoscaling_pools.0.template.gpu: unknown key",
        ],
    ),
    Case(
        "an endless delay",
        {"autoscaling_pools": [_auto(provisioning_delay_s=float("inf"))]},
        ["c.yaml: autoscaling_pools.0.provisioning_delay_s: inf is not a finite number"],
    ),
    Case(
        "name of a fixed pool",
        {"pools": [_pool(name="gpu")], "autoscaling_pools": [_auto()]},
        ["c.yaml: autoscaling_pools.0.name: pool name 'gpu' already used at pools.0"],
    ),
    Case(
        "cost on some pools only",
        {"autoscaling_pools": [_auto(cost_per_node_hour=3), _auto(name="cpu")]},
        [
            "c.yaml: autoscaling_pools.1.cost_per_node_hour: missing; give a cost for every "
            "autoscaling pool or for none"
        ],
    ),
    Case(
        "node named like a pool node",
        {"autoscaling_pools": [_auto()], "nodes": [{"name": "gpu-0003", "cpus": 1, "mem_gib": 1}]},
        ["c.yaml: nodes.0.name: 'gpu-0003' is a name autoscaling pool 'gpu' gives its nodes"],
    ),
]


@pytest.mark.parametrize("case", AUTOSCALE_ERROR_CASES, ids=lambda c: c.name)
def test_autoscaling_pool_errors_name_the_field(case: Case) -> None:
    with pytest.raises(SpecError) as info:
        cluster_from_dict(case.data, "c.yaml")
    assert list(info.value.problems) == case.want


def test_the_autoscaling_example_file_loads() -> None:
    path = Path(__file__).parents[3] / "examples" / "cluster-autoscaling.yaml"
    c = load_cluster_file(path)
    (pool,) = c.node_pools
    assert (pool.min_nodes, pool.max_nodes, len(pool.template.gpus)) == (0, 96, 8)
    assert c.nodes == ()

"""Ray's node records as the core's nodes: capacity, GPUs, rack, zone, model and names."""

from __future__ import annotations

from typing import Any

import pytest

from aisched.executors.ray_nodes import RayNode, nodes_from_ray, parse_mem_label
from aisched.model.cluster import GPU, Node

GIB = 1 << 30


def record(node_id: str, **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.7",
        "NodeManagerHostname": "gpu7",
        "Resources": {"CPU": 8.0, "GPU": 2.0, "memory": 64.0 * GIB, "node:10.0.0.7": 1.0},
        "Labels": {},
    }
    rec.update(over)
    return rec


def test_labels_give_name_rack_zone_and_gpu_model_and_size() -> None:
    labels = {
        "aisched/name": "gpu7",
        "aisched/rack": "r1",
        "aisched/zone": "z1",
        "aisched/gpu-model": "A100",
        "aisched/gpu-mem": "80G",
        "ray.io/node-id": "ab" * 28,
    }
    got = nodes_from_ray([record("ab" * 28, Labels=labels)])
    assert got == (
        RayNode(
            Node(
                name="gpu7",
                milli_cpu=8000,
                mem_mib=64 * 1024,
                gpus=(GPU(0, "A100", 80 * 1024), GPU(1, "A100", 80 * 1024)),
                zone="z1",
                rack="r1",
                labels=tuple(sorted((k, v) for k, v in labels.items() if k.startswith("aisched/"))),
            ),
            "ab" * 28,
            "10.0.0.7",
        ),
    )


def test_custom_resources_stand_in_for_labels_and_ray_names_the_accelerator() -> None:
    res = {"CPU": 4.0, "GPU": 1.0, "memory": 8.0 * GIB, "rack:r9": 1.0, "zone:z2": 1.0}
    res["accelerator_type:H100"] = 1.0
    (got,) = nodes_from_ray([record("cd" * 28, Resources=res)])
    assert (got.node.name, got.node.rack, got.node.zone, got.node.gpu_model) == (
        "gpu7-cdcdcdcd",
        "r9",
        "z2",
        "H100",
    )


def test_dead_and_empty_nodes_are_left_out_and_defaults_fill_the_rest() -> None:
    head = record("00" * 28, Resources={"memory": 8.0 * GIB, "node:__internal_head__": 1.0})
    dead = record("11" * 28, Alive=False)
    cpu_only = record("22" * 28, Resources={"CPU": 2.5, "memory": 1.0 * GIB})
    (got,) = nodes_from_ray([head, dead, cpu_only])
    assert got.node == Node("gpu7-22222222", milli_cpu=2500, mem_mib=1024)


def test_two_nodes_labelled_alike_stay_apart() -> None:
    labels = {"aisched/name": "twin"}
    got = nodes_from_ray([record("aa" * 28, Labels=labels), record("bb" * 28, Labels=labels)])
    assert sorted(rn.node.name for rn in got) == ["twin", "twin-bbbbbbbb"]


@pytest.mark.parametrize(
    ("label", "mib"),
    [("80G", 81920), ("80Gi", 81920), ("24576M", 24576), ("1T", 1 << 20), ("", 0), ("lots", 0)],
)
def test_gpu_memory_labels(label: str, mib: int) -> None:
    assert parse_mem_label(label) == mib

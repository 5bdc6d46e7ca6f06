"""Generated bad input shared by the property tests of the edges (API, job files, CLI, config):
valid documents to mutate, bad values, and the settings every such test runs with."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# AISCHED_FUZZ_EXAMPLES=N: a longer search by hand, N random examples (new ones each run).
_SEARCH = os.environ.get("AISCHED_FUZZ_EXAMPLES")
SETTINGS = settings(
    max_examples=int(_SEARCH or 60),
    deadline=None,
    derandomize=_SEARCH is None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Valid documents the mutations start from: the shorthand and the tasks form.
SHORTHAND: dict[str, Any] = {
    "name": "fz",
    "command": ["echo", "hi"],
    "replicas": 1,
    "resources": {"cpus": 1, "mem": "512Mi", "gpus": 1},
    "env": {"A": "b"},
    "priority": 5,
    "time_limit": "1h",
    "restart": {"policy": "on-failure", "max_retries": 2, "backoff": "5s"},
}
TASKS: dict[str, Any] = {
    "name": "fz2",
    "queue": "default",
    "min_available": 2,
    "grace_period": "10s",
    "tasks": [
        {"name": "a", "command": "echo a", "replicas": 1, "resources": {"cpus": "500m"}},
        {"name": "b", "command": ["echo", "b"], "resources": {"mem": "1Gi", "gpus": 0.5}},
    ],
}


CONTAINER: dict[str, Any] = {
    "name": "fz3",
    "image": "python:3.11",
    "network": "bridge",
    "bandwidth": "10Mbit",
    "shm_size": "64Mi",
    "volumes": [{"host_path": "/tmp", "path": "/data", "read_only": True}],
    "gpu_models": {"required": ["fake"], "preferred": ["fake"]},
    "topology": {"pack": "node", "mode": "preferred"},
    "estimate": "10m",
    "checkpoint_interval": "5m",
    "command": ["python", "-c", "pass"],
    "resources": {"gpus": 1, "gpu_mem": "1Gi", "rdma": 0},
}
SERVICE: dict[str, Any] = {
    "name": "fz4",
    "kind": "service",
    "command": ["serve"],
    "service": {
        "min_replicas": 1,
        "max_replicas": 2,
        "metric": "rps",
        "target": 5.0,
        "readiness_path": "/ready",
        "scale_down_window": "1m",
        "tolerance": 0.2,
    },
}
PIPELINE: dict[str, Any] = {
    "jobs": [
        {"name": "prep", "command": "echo prep", "priority_class": "high"},
        {"name": "train", "command": "echo t", "depends_on": [{"job": "prep"}], "elastic": False},
    ]
}
VOLCANO: dict[str, Any] = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "vc"},
    "spec": {
        "minAvailable": 1,
        "queue": "default",
        "priorityClassName": "high",
        "tasks": [
            {
                "name": "worker",
                "replicas": 1,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "pytorch/pytorch",
                                "command": ["python", "train.py"],
                                "env": [{"name": "A", "value": "b"}],
                                "resources": {
                                    "limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "4Gi"}
                                },
                            }
                        ]
                    }
                },
            }
        ],
    },
}
DOCUMENTS = [SHORTHAND, TASKS, CONTAINER, SERVICE, PIPELINE, VOLCANO]


# --- generated values ---------------------------------------------------------------------

_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 10**12, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 1e-320]),
    st.text(max_size=20),
    st.sampled_from(
        [
            "",
            " ",
            "12Q",
            "-1",
            "1e400",
            "nan",
            "inf",
            "-5Gi",
            "0.0001m",
            "1.5.5",
            "\x00",
            "a\x00b",
            "\ud7ff\U0010ffff",
            "é" * 70,
            "x" * 5000,
            "99999999999999999999999Ti",
            "1h30",
            "P1D",
            "on",
        ]
    ),
)
BAD_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into `doc` (mappings and lists)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*prefix, i)
            yield from paths(v, (*prefix, i))


def _copy(doc: Any) -> Any:
    return json.loads(json.dumps(doc))


def set_at(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        doc = doc[p]
    doc[path[-1]] = value


# Stands for a deeply nested list until the document is written (the writers recurse).
DEEP = "\x01deep\x01"


@dataclass(frozen=True)
class Mutation:
    """A job document with one mistake. `depth`: how deep the list DEEP stands for is nested
    (0: no DEEP in it); `names`: what its refusal must mention (one of them, "|" between);
    `invalid`: no valid job is left (a repeated name, an unknown key, an empty command, deep
    nesting), so it must be refused; a wrong value may happen to be a valid one."""

    doc: Any
    depth: int
    names: str
    invalid: bool
    # The name of the task the mistake is in, if any: a value that is valid but larger than
    # any node is refused as never fitting, naming the task and its request, not the field.
    task: str | None = None


@st.composite
def mutated(draw: st.DrawFn) -> Mutation:
    kind = draw(st.sampled_from(["value", "value", "value", "unknown", "deep", "dup", "empty"]))
    doc = _copy(draw(st.sampled_from([TASKS, PIPELINE] if kind == "dup" else DOCUMENTS)))
    # Volcano files carry Kubernetes fields aisched does not read: an odd one is no mistake.
    native = doc.get("apiVersion") is None
    if kind == "dup" and "jobs" in doc:
        doc["jobs"][1]["name"] = doc["jobs"][0]["name"]
        return Mutation(doc, 0, "name", True)
    if kind == "dup" and "tasks" in doc:
        doc["tasks"][1]["name"] = doc["tasks"][0]["name"]
        return Mutation(doc, 0, "tasks.1.name", True)
    if kind == "empty":
        key = "tasks" if "tasks" in doc else "command"
        doc[key] = []
        return Mutation(doc, 0, key, native)
    path = draw(st.sampled_from(list(paths(doc))))
    if kind == "unknown":
        target = doc
        for p in path[:-1]:
            target = target[p]
        if not isinstance(target, dict):
            target = doc
        key = draw(st.sampled_from(["bogus", "Name", "gpu", "cpu", "mem_mib", "\x00", "é" * 80]))
        target[key] = 1
        # A service's scaling block is a mapping of its own; env names are keys too.
        return Mutation(doc, 0, key, native and target is not doc.get("env"))
    if kind == "deep":
        set_at(doc, path, DEEP)
        # Past the API's depth bound the refusal names the depth, else the field.
        return Mutation(doc, draw(st.integers(50, 3000)), f"{path[-1]}|nested", native)
    set_at(doc, path, draw(BAD_VALUES))
    return Mutation(doc, 0, str(path[-1]), False, task_on(doc, path))


def task_on(doc: Any, path: tuple[Any, ...]) -> str | None:
    """The name of the task (an item of a `tasks` list) that `path` leads into, if any."""
    found = None
    for i in range(len(path) - 1):
        if path[i] == "tasks" and isinstance(path[i + 1], int):
            item = doc
            for p in path[: i + 2]:
                item = item[p]
            name = item.get("name") if isinstance(item, dict) else None
            found = name if isinstance(name, str) else found
    return found

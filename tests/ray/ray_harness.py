"""The local multi-node Ray cluster of these tests: nodes with declared GPUs and labels."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import Service, wait_for
from harness import cancel_all as cancel_every_job

MIB = 1 << 20
OBJECT_STORE_BYTES = 80 * MIB
# Keeps Ray from pre-starting idle Python workers on every node (2 cores are shared).
# As a shared cluster must run: clients without the token are refused (aisched up as root
# refuses a cluster that takes them; tests/ray/test_ray_auth.py).
RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
RAY_ENV = {
    **RAY_AUTH,
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    "RAY_enable_metrics_collection": "0",
    # A killed node is declared dead after ~3 s instead of Ray's default of about 30 s.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


@dataclass
class RayCluster:
    cluster: Any
    nodes: dict[str, Any] = field(default_factory=dict)  # aisched node name -> Ray node

    @property
    def address(self) -> str:
        return str(self.cluster.gcs_address)

    def add(
        self, name: str, rack: str, zone: str, *, gpus: int = 2, cpus: int = 2, model: str = "T4"
    ) -> Any:
        node = self.cluster.add_node(
            num_cpus=cpus,
            num_gpus=gpus,
            memory=2048 * MIB,
            object_store_memory=OBJECT_STORE_BYTES,
            labels={
                "aisched/name": name,
                "aisched/rack": rack,
                "aisched/zone": zone,
                "aisched/gpu-model": model,
            },
        )
        self.nodes[name] = node
        return node

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    @contextmanager
    def node_of_a_test(
        self, name: str, rack: str, zone: str, env: dict[str, str] | None = None, **kw: Any
    ) -> Iterator[RayCluster]:
        """Node `name` (as `add`; its raylet started with `env` more in its environment) for
        one test, removed after it, once Ray has marked it dead."""
        with pytest.MonkeyPatch.context() as mp:
            for k, v in (env or {}).items():
                mp.setenv(k, v)
            self.add(name, rack, zone, **kw)
        node_id = self.nodes[name].node_id
        try:
            yield self
        finally:
            self.remove(name)

            def dead() -> bool:
                return not ray_node_alive(self, node_id)

            wait_for("Ray to mark the test's node dead", dead, 30)


@contextmanager
def local_cluster() -> Iterator[RayCluster]:
    """A Ray cluster on this machine, run with `RAY_ENV` (set in this process's environment
    until it is shut down): a head with no CPUs, which aisched leaves out, and no node yet
    (`RayCluster.add` adds them). Ray picks its ports."""
    from ray import cluster_utils  # only where Ray is installed: the tests skip without it

    with pytest.MonkeyPatch.context() as mp:
        for k, v in RAY_ENV.items():
            mp.setenv(k, v)
        cluster = cluster_utils.Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "object_store_memory": OBJECT_STORE_BYTES,
                "include_dashboard": False,
            },
        )
        try:
            yield RayCluster(cluster)
        finally:
            cluster.shutdown()


def cancel_all(svc: Service) -> None:
    """The e2e harness's, with more time: Ray tasks take longer to stop."""
    cancel_every_job(svc, timeout_s=60)


def connect_driver(cluster: RayCluster) -> None:
    """Connects the tests' own Ray driver to `cluster`, once (to read Ray's own accounting)."""
    import ray  # only where Ray is installed: the tests skip without it

    if not ray.is_initialized():
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")


def kill_agents(cluster: RayCluster, data_dir: Path) -> int:
    """Kills every node agent of the service on `data_dir` (its Ray namespace's), as a node's
    (or the cluster's) death would; returns how many there were. Agents are detached and
    outlive their service; in the shared cluster each test's service has its own, a Ray
    worker process each, and those left behind (each with a pool of 256 threads, then) ran
    the machine out of process ids."""
    import ray  # only where Ray is installed: the tests skip without it

    from aisched.executors.ray_executor import namespace_for

    connect_driver(cluster)
    ns = namespace_for(str(data_dir.resolve()))
    named = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == ns]
    for a in named:
        ray.kill(ray.get_actor(a["name"], namespace=ns))
    return len(named)


def ray_node_alive(cluster: RayCluster, node_id: str) -> bool:
    """Whether Ray's node table says Ray node `node_id` is alive (the tests' own look)."""
    import ray  # only where Ray is installed: the tests skip without it

    connect_driver(cluster)
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def ray_in_use(cluster: RayCluster, resource: str) -> dict[str, float]:
    """How much of `resource` ("GPU", "CPU") Ray itself counts as taken, per aisched node name
    (from Ray's own accounting)."""
    import ray  # only where Ray is installed: the tests skip without it

    connect_driver(cluster)
    total = ray._private.state.total_resources_per_node()
    free = ray._private.state.available_resources_per_node()
    by_id = {node.node_id: name for name, node in cluster.nodes.items()}
    return {
        by_id[nid]: round(res.get(resource, 0.0) - free.get(nid, {}).get(resource, 0.0), 6)
        for nid, res in total.items()
        if nid in by_id
    }


def ray_gpus_in_use(cluster: RayCluster) -> dict[str, float]:
    """GPUs Ray itself counts as taken, per aisched node name."""
    return ray_in_use(cluster, "GPU")


def wait_until_ray_holds_none_of(
    cluster: RayCluster, resources: tuple[str, ...], timeout_s: float, what: str = ""
) -> None:
    """Waits for Ray's own accounting to show all of each of `resources` ("GPU", "CPU") free
    on every node of the cluster (the nodes' agents take none): a reservation left behind
    fails later tests far from its cause."""
    wait_for(
        what or f"Ray to hold no {' and no '.join(resources)}",
        lambda: not any(any(ray_in_use(cluster, r).values()) for r in resources),
        timeout_s,
    )

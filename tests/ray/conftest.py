"""A real multi-node Ray cluster on this machine, shared by the tests of this folder, and a
real `aisched up --ray ADDRESS` per test, driven by the real `aisched` command.

The cluster (`ray.cluster_utils.Cluster`): a head node with no CPUs (so aisched leaves it out,
as an operator would keep a head for control) and four worker nodes of 2 declared CPUs, 2
declared GPUs and 2 GiB each, two per rack: `a1`, `a2` in rack `ra` (zone `z1`), `b1`, `b2` in
rack `rb` (zone `z2`), their names, racks and zones set by node labels. Object stores are
small and CPUs few: the machine running the tests may have two cores. Tests that need more
nodes (or kill one) add their own and remove them.

Skipped, with the reason, when Ray is not installed (`pip install -e '.[dev]'` installs it).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from harness import Service, free_port  # noqa: E402
from ray_harness import RAY_AUTH  # noqa: E402
from users import local_users  # noqa: E402, F401 - real local users, for tests/ray/test_ray_users.py

# Ray reads its auth mode once, when it is imported: the token is this process's before that.
os.environ.update(RAY_AUTH)

# Not importorskip here: a conftest cannot skip; the tests skip (with this reason) instead.
try:
    import ray
except ModuleNotFoundError:
    ray = None

NO_RAY = "Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"

from ray_harness import (  # noqa: E402
    RayCluster,
    cancel_all,
    kill_agents,
    local_cluster,
    wait_until_ray_holds_none_of,
)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    if ray is None:
        pytest.skip(NO_RAY)
    with local_cluster() as rc:
        try:
            rc.add("a1", "ra", "z1")
            rc.add("a2", "ra", "z1")
            rc.add("b1", "rb", "z2")
            rc.add("b2", "rb", "z2")
            yield rc
        finally:
            ray.shutdown()  # the tests' own driver (Ray's accounting), if they connected one


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "up_args(*args): more flags for this test's aisched up")
    config.addinivalue_line("markers", "up_config(dict): a config file for this test's aisched up")


@pytest.fixture
def ray_service(
    tmp_path: Path, ray_cluster: RayCluster, request: pytest.FixtureRequest
) -> Iterator[Service]:
    """`aisched up --ray ADDRESS` on a loopback port, with its own data directory (and the
    flags of the test's `up_args` mark)."""
    work = tmp_path / "work"
    work.mkdir()
    mark = request.node.get_closest_marker("up_args")
    extra = list(mark.args) if mark else []
    config = request.node.get_closest_marker("up_config")
    if config:
        (tmp_path / "aisched.json").write_text(json.dumps(config.args[0]))
        extra += ["--config", str(tmp_path / "aisched.json")]
    svc = Service(tmp_path / "home", free_port(), work, ["--ray", ray_cluster.address, *extra])
    # Started apart from Ray, as on a real cluster: its PATH is not the Ray workers'.
    svc.extra_env["PATH"] = "/opt/aisched-service/bin:" + os.environ.get("PATH", "")
    svc.home.mkdir()
    svc.start(timeout_s=90)
    try:
        yield svc
    finally:
        cancel_all(svc)
        try:
            # Every reservation of this test's jobs goes while its service still runs (its
            # sweep removes what no task claims): one left behind would hold GPUs or CPUs in
            # the shared cluster and fail later tests far from its cause.
            wait_until_ray_holds_none_of(ray_cluster, ("GPU", "CPU"), 60)
        finally:
            svc.stop()
            kill_agents(ray_cluster, svc.home)

"""Container jobs on the real multi-node Ray cluster of this folder: each node's agent runs
podman on its node (here every node is this machine, so it is the same podman)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Service, wait_for
from ray_harness import RayCluster, ray_gpus_in_use

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from container_image import MARKER, MARKER_TEXT, build_test_image, missing_tools  # noqa: E402

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")

pytestmark = pytest.mark.skipif(
    (why := missing_tools()) is not None or os.geteuid() != 0,
    reason=why or "the container tests run rootful podman (CI runs as root)",
)


def test_a_gang_in_an_image_runs_on_two_ray_nodes(ray_service: Service) -> None:
    svc = ray_service
    image = build_test_image()
    job = (
        f"name: ray-image\nimage: {image}\nreplicas: 2\nrestart: {{policy: never}}\n"
        "topology: {spread: node}\nresources: {cpus: 0.5, mem: 256M}\n"
        f"command: 'cat {MARKER}; echo rank $RANK of $WORLD_SIZE'\n"
    )
    (svc.work / "ray-image.yaml").write_text(job)
    jid = str(svc.cli_json("submit", "ray-image.yaml")["id"])
    done = svc.wait_state(jid, "succeeded", "failed", timeout_s=120)
    assert done["message"] == "all tasks exited with code 0"
    assert [svc.cli("logs", jid, "--task", f"main-{i}").stdout for i in (0, 1)] == [
        f"{MARKER_TEXT}rank 0 of 2\n",
        f"{MARKER_TEXT}rank 1 of 2\n",
    ]
    assert len({t["node"] for t in svc.job(jid)["tasks"]}) == 2


def _containers_of(svc: Service, jid: str) -> list[str]:
    """The containers (any state) of job `jid` of this service (its Ray namespace's)."""
    from aisched.executors.ray_executor import namespace_for

    instance = hashlib.sha256(namespace_for(str(svc.home)).encode()).hexdigest()[:10]
    out = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label=io.aisched.job={jid}", "--filter",
         f"label=io.aisched.instance={instance}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split()


def test_a_ray_container_gets_its_cores_as_cpuset_and_is_removed_when_its_agent_dies(
    ray_service: Service, ray_cluster: RayCluster
) -> None:
    svc = ray_service
    image = build_test_image()
    job = (
        f"name: ray-pinned\nimage: {image}\nrestart: {{policy: never}}\n"
        "resources: {cpus: 1, mem: 256M}\n"
        "command: 'grep Cpus_allowed_list /proc/self/status | cut -f2; "
        "cat /sys/fs/cgroup/cpuset/cpuset.cpus 2>/dev/null || cat /sys/fs/cgroup/cpuset.cpus; "
        "touch /tmp/up; sleep 600'\n"
    )
    (svc.work / "ray-pinned.yaml").write_text(job)
    jid = str(svc.cli_json("submit", "ray-pinned.yaml")["id"])
    svc.wait_state(jid, "running", timeout_s=120)

    def two_lines() -> list[str] | None:
        out = svc.cli("logs", jid).stdout.splitlines()
        return out if len(out) >= 2 else None

    affinity, cpuset = wait_for("the task's output", two_lines, 60)[:2]
    # One core, the one its node's agent chose: as affinity and as the container's cpuset.
    assert affinity == cpuset and affinity.isdigit()
    assert len(_containers_of(svc, jid)) == 1

    # The node's agent dies (its process killed, as when its worker crashes): the task is
    # lost, and its container does not stay behind.
    from aisched.executors.ray_executor import agent_name, namespace_for

    node = svc.job(jid)["tasks"][0]["node"]
    ray_gpus_in_use(ray_cluster)  # connects the test's driver
    namespace = namespace_for(str(svc.home))
    agent = ray.get_actor(agent_name(ray_cluster.nodes[node].node_id), namespace=namespace)
    ray.kill(agent, no_restart=True)
    job_state = svc.wait_state(jid, "failed", timeout_s=60)
    assert [t["exit_kind"] for t in job_state["tasks"]] == ["lost"]
    wait_for("the container to be removed", lambda: _containers_of(svc, jid) == [], 60)


def test_a_ray_node_passes_its_registries_conf_to_the_engine(
    ray_service: Service, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """A node's raylet started with CONTAINERS_REGISTRIES_CONF (an operator's registries): the
    engine its agent runs reads that file. Here it searches no registry, so a short name is
    refused at once as a missing image, whatever the machine's own file says. Before, a Ray
    node passed the engine only HOME and XDG_RUNTIME_DIR."""
    conf = tmp_path / "registries.conf"
    conf.write_text('unqualified-search-registries = []\nshort-name-mode = "enforcing"\n')
    env = {"CONTAINERS_REGISTRIES_CONF": str(conf)}
    svc = ray_service
    # A node of its own, of a GPU model no other node has: the job runs there.
    with ray_cluster.node_of_a_test("g1", "rg", "z8", env, gpus=1, cpus=1, model="REG"):
        wait_for(
            "the node to be noticed",
            lambda: "g1" in {n["name"] for n in svc.cli_json("nodes")["nodes"]},
            30,
        )
        job = (
            "name: short-name\nimage: aisched-no-such-image:1\ngpu_models: [REG]\n"
            "resources: {cpus: 0.5, gpus: 1, mem: 128M}\ncommand: 'true'\n"
        )
        (svc.work / "short-name.yaml").write_text(job)
        jid = str(svc.cli_json("submit", "short-name.yaml")["id"])
        done = svc.wait_state(jid, "failed", timeout_s=120)
    assert (done["attempt"], done["failures"]) == (1, 1)  # a missing image is not retried
    # podman names the registries.conf it read: the node's, not the machine's.
    assert (
        'short-name "aisched-no-such-image:1" did not resolve to an alias and no '
        f'unqualified-search registries are defined in "{conf}"'
    ) in done["message"]
    assert done["message"].endswith("); not retried")

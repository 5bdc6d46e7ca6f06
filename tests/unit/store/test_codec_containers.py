"""A job's container survives the store: what was accepted is what a restart rebuilds."""

from __future__ import annotations

from aisched.model.job import ContainerSpec, Job, NetworkMode, TaskGroup, Volume
from aisched.model.resources import Resources
from aisched.store.codec import job_from_dict, job_to_dict


def test_a_container_job_round_trips_and_a_host_job_stores_no_container_key() -> None:
    spec = ContainerSpec(
        "localhost/trainer:1",
        network=NetworkMode.BRIDGE,
        bandwidth_bit_s=10**9,
        shm_mib=512,
        volumes=(Volume("/datasets", "/data", True),),
    )
    job = Job(
        "1",
        (
            TaskGroup("w", 2, Resources(milli_cpu=1000), ("python", "x.py"), container=spec),
            TaskGroup("host", 1, Resources(milli_cpu=1000), ("true",)),
        ),
    )
    stored = job_to_dict(job)
    assert job_from_dict(stored) == job
    assert [sorted(g) for g in stored["groups"]] == [
        ["command", "container", "env", "name", "replicas", "request", "workdir"],
        ["command", "env", "name", "replicas", "request", "workdir"],
    ]

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


def test_a_pod_templates_group_round_trips_and_a_row_stored_before_it_was_kept_still_loads() -> (
    None
):
    job = Job("1", (TaskGroup("w", 1, Resources(milli_cpu=1000), ("echo",), kubernetes_pod=True),))
    stored = job_to_dict(job)
    assert stored["groups"][0]["kubernetes_pod"] is True
    assert job_from_dict(stored) == job
    del stored["groups"][0]["kubernetes_pod"]  # as rows written before it existed
    assert job_from_dict(stored).groups[0].kubernetes_pod is False


def test_a_pods_container_keeps_its_workdir_in_its_image_and_older_rows_load_as_native() -> None:
    spec = ContainerSpec("img", workdir_in_image=True)
    job = Job("1", (TaskGroup("w", 1, Resources(milli_cpu=1000), ("true",), container=spec),))
    stored = job_to_dict(job)
    assert job_from_dict(stored) == job
    del stored["groups"][0]["container"]["workdir_in_image"]  # as rows written before it
    assert job_from_dict(stored).groups[0].container == ContainerSpec("img")


def test_a_groups_place_in_its_file_round_trips() -> None:
    job = Job("1", (TaskGroup("m", 1, Resources(milli_cpu=1000), ("t",), file_index=1),))
    assert job_from_dict(job_to_dict(job)) == job

"""The model's `Job` as JSON for the store, and back: `job_from_dict(job_to_dict(j)) == j`.

The encoding is the store's own (plain field names, integer units), not a user-facing format:
users write job files (`aisched.spec.job`); the store keeps what those files were turned into,
so a restart rebuilds exactly the job that was accepted, whatever the config says meanwhile.
Unknown keys are an error: a row this code did not write is not guessed at.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aisched.core.decisions import TaskBinding
from aisched.lifecycle.preemption import VictimWait
from aisched.model.cluster import GPU, Node, TopologyLevel
from aisched.model.job import (
    ContainerSpec,
    Dependency,
    DependencyCondition,
    Job,
    JobKind,
    NetworkMode,
    RestartPolicy,
    TaskGroup,
    TopologyMode,
    TopologyRequirement,
    Volume,
)
from aisched.model.resources import Resources
from aisched.model.service import ScaleMetric, ServiceSpec


class CodecError(ValueError):
    """A stored document is not a job this code can read."""


def resources_to_dict(r: Resources) -> dict[str, Any]:
    out: dict[str, Any] = {
        "milli_cpu": r.milli_cpu,
        "mem_mib": r.mem_mib,
        "gpu": r.gpu,
        "gpu_milli": r.gpu_milli,
        "gpu_mem_mib": r.gpu_mem_mib,
    }
    if r.extended:
        out["extended"] = [[k, v] for k, v in r.extended]
    if r.rdma:
        out["rdma"] = r.rdma
    return out


def resources_from_dict(d: dict[str, Any]) -> Resources:
    return Resources(
        milli_cpu=int(d["milli_cpu"]),
        mem_mib=int(d["mem_mib"]),
        gpu=int(d["gpu"]),
        gpu_milli=int(d["gpu_milli"]),
        gpu_mem_mib=int(d["gpu_mem_mib"]),
        extended=tuple((str(k), int(v)) for k, v in d.get("extended", ())),
        rdma=int(d.get("rdma", 0)),
    )


def _level(v: TopologyLevel | None) -> str | None:
    return None if v is None else v.name.lower()


def _from_level(v: str | None) -> TopologyLevel | None:
    return None if v is None else TopologyLevel[v.upper()]


def job_to_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "kind": job.kind.value,
        "user": job.user,
        "queue": job.queue,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "min_available": job.min_available,
        "topology": {
            "pack": _level(job.topology.pack),
            "mode": job.topology.mode.value,
            "spread": _level(job.topology.spread),
        },
        "gpu_models": list(job.gpu_models),
        "gpu_models_preferred": list(job.gpu_models_preferred),
        "restart_policy": job.restart_policy.value,
        "max_retries": job.max_retries,
        "time_limit_s": job.time_limit_s,
        "estimate_s": job.estimate_s,
        "checkpoint_interval_s": job.checkpoint_interval_s,
        "submit_time_s": job.submit_time_s,
        "grace_period_s": job.grace_period_s,
        "backoff_s": job.backoff_s,
        "depends_on": [[d.job_id, d.condition.value] for d in job.depends_on],
        "service": None if job.service is None else _service_to_dict(job.service),
        "replica_of": job.replica_of,
        "elastic": job.elastic,
        "uid": job.uid,
        "groups": [
            {
                "name": g.name,
                "replicas": g.replicas,
                "request": resources_to_dict(g.request),
                "command": list(g.command),
                "env": [[k, v] for k, v in g.env],
                "workdir": g.workdir,
                **({} if g.container is None else {"container": _container_to_dict(g.container)}),
                **({"kubernetes_pod": True} if g.kubernetes_pod else {}),
                **({} if g.file_index is None else {"file_index": g.file_index}),
            }
            for g in job.groups
        ],
    }


_JOB_KEYS = frozenset(job_to_dict(Job("x", (TaskGroup("g", 1, Resources()),))))


def submitter_uid(d: dict[str, Any]) -> int | None:
    """The uid that submitted the job stored as `d` (`job_to_dict`'s), or None for a job
    stored before the submitter's uid was recorded (such rows have no key)."""
    return None if d.get("uid") is None else int(d["uid"])


def job_from_dict(d: dict[str, Any]) -> Job:
    unknown = set(d) - _JOB_KEYS
    if unknown:
        raise CodecError(f"stored job has unknown fields: {', '.join(sorted(unknown))}")
    try:
        topo = d["topology"]
        return Job(
            id=str(d["id"]),
            name=str(d["name"]),
            kind=JobKind(d["kind"]),
            user=str(d["user"]),
            queue=str(d["queue"]),
            priority=int(d["priority"]),
            preemptible=bool(d["preemptible"]),
            min_available=d["min_available"],
            topology=TopologyRequirement(
                pack=_from_level(topo["pack"]),
                mode=TopologyMode(topo["mode"]),
                spread=_from_level(topo["spread"]),
            ),
            gpu_models=tuple(d["gpu_models"]),
            # Jobs stored before preferences existed have none.
            gpu_models_preferred=tuple(d.get("gpu_models_preferred", ())),
            restart_policy=RestartPolicy(d["restart_policy"]),
            max_retries=int(d["max_retries"]),
            time_limit_s=d["time_limit_s"],
            estimate_s=d["estimate_s"],
            checkpoint_interval_s=d["checkpoint_interval_s"],
            submit_time_s=float(d["submit_time_s"]),
            grace_period_s=float(d["grace_period_s"]),
            backoff_s=float(d["backoff_s"]),
            # Rows written before pipelines existed have no key.
            depends_on=tuple(
                Dependency(str(j), DependencyCondition(c)) for j, c in d.get("depends_on", ())
            ),
            service=None if d.get("service") is None else _service_from_dict(d["service"]),
            replica_of=d.get("replica_of"),
            elastic=bool(d.get("elastic", False)),
            uid=submitter_uid(d),
            groups=tuple(
                TaskGroup(
                    name=str(g["name"]),
                    replicas=int(g["replicas"]),
                    request=resources_from_dict(g["request"]),
                    command=tuple(str(c) for c in g["command"]),
                    env=tuple((str(k), str(v)) for k, v in g["env"]),
                    workdir=g["workdir"],
                    # Rows written before container images existed have no key.
                    container=None
                    if g.get("container") is None
                    else _container_from_dict(g["container"]),
                    # Rows written before Kubernetes' expansion was honoured have no key.
                    kubernetes_pod=bool(g.get("kubernetes_pod", False)),
                    file_index=None if g.get("file_index") is None else int(g["file_index"]),
                )
                for g in d["groups"]
            ),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"stored job {d.get('id')!r} cannot be read: {e!r}") from None


def _container_to_dict(c: ContainerSpec) -> dict[str, Any]:
    return {
        "image": c.image,
        "network": c.network.value,
        "bandwidth_bit_s": c.bandwidth_bit_s,
        "shm_mib": c.shm_mib,
        "volumes": [[v.host_path, v.container_path, v.read_only] for v in c.volumes],
        **({"workdir_in_image": True} if c.workdir_in_image else {}),
    }


def _container_from_dict(d: dict[str, Any]) -> ContainerSpec:
    return ContainerSpec(
        image=str(d["image"]),
        network=NetworkMode(d["network"]),
        bandwidth_bit_s=None if d["bandwidth_bit_s"] is None else int(d["bandwidth_bit_s"]),
        shm_mib=None if d["shm_mib"] is None else int(d["shm_mib"]),
        volumes=tuple(Volume(str(h), str(c), bool(ro)) for h, c, ro in d["volumes"]),
        # Rows written before a pod's workingDir was kept inside its image have no key.
        workdir_in_image=bool(d.get("workdir_in_image", False)),
    )


def _service_to_dict(s: ServiceSpec) -> dict[str, Any]:
    return {
        "min_replicas": s.min_replicas,
        "max_replicas": s.max_replicas,
        "metric": s.metric.value,
        "target": s.target,
        "readiness_path": s.readiness_path,
        "metrics_path": s.metrics_path,
        "scale_up_window_s": s.scale_up_window_s,
        "scale_down_window_s": s.scale_down_window_s,
        "tolerance": s.tolerance,
    }


def _service_from_dict(d: dict[str, Any]) -> ServiceSpec:
    return ServiceSpec(
        min_replicas=int(d["min_replicas"]),
        max_replicas=int(d["max_replicas"]),
        metric=ScaleMetric(d["metric"]),
        target=float(d["target"]),
        readiness_path=d["readiness_path"],
        metrics_path=d["metrics_path"],
        scale_up_window_s=float(d["scale_up_window_s"]),
        scale_down_window_s=float(d["scale_down_window_s"]),
        tolerance=float(d["tolerance"]),
    )


def victim_wait_to_dict(wait: VictimWait) -> dict[str, Any]:
    """A job's wait for its victims, as the jobs table's `waiting_for` keeps it."""
    return {
        "victims": sorted(wait.victims),
        "since": wait.since,
        "tasks": [dataclasses.asdict(t) for t in wait.tasks],
    }


def victim_wait_from_dict(d: dict[str, Any]) -> VictimWait:
    tasks = tuple(TaskBinding(**{**t, "gpus": tuple(t["gpus"])}) for t in d["tasks"])
    return VictimWait(frozenset(d["victims"]), float(d["since"]), tasks)


def node_to_dict(node: Node) -> dict[str, Any]:
    return dataclasses.asdict(node)


def node_from_dict(d: dict[str, Any]) -> Node:
    return Node(
        **{
            **d,
            "gpus": tuple(GPU(**g) for g in d["gpus"]),
            "labels": tuple((str(k), str(v)) for k, v in d["labels"]),
        }
    )

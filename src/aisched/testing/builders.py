"""Fluent builders for nodes, jobs and snapshots (the Kubernetes `st.MakePod()` wrappers).

node("n1").gpus(8, model="A100").rack("r1").build()
job("j1").gang(4, gpu=8).priority(10).build()
"""

from __future__ import annotations

from dataclasses import replace

from aisched.core.snapshot import PendingJob
from aisched.model.cluster import GPU, Cluster, Node, TopologyLevel
from aisched.model.job import Job, JobKind, TaskGroup, TopologyMode, TopologyRequirement
from aisched.model.resources import Resources


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._node = Node(name=name, milli_cpu=64_000, mem_mib=512 * 1024)

    def gpus(
        self, count: int, model: str = "A100", mem_gib: int = 80, nvlink_group_size: int = 4
    ) -> NodeBuilder:
        size = max(nvlink_group_size, 1)
        gpus = tuple(GPU(i, model, mem_gib * 1024, i // size) for i in range(count))
        self._node = replace(self._node, gpus=gpus)
        return self

    def cpus(self, cores: float) -> NodeBuilder:
        self._node = replace(self._node, milli_cpu=int(cores * 1000))
        return self

    def mem_gib(self, gib: float) -> NodeBuilder:
        self._node = replace(self._node, mem_mib=int(gib * 1024))
        return self

    def rack(self, rack: str) -> NodeBuilder:
        self._node = replace(self._node, rack=rack)
        return self

    def zone(self, zone: str) -> NodeBuilder:
        self._node = replace(self._node, zone=zone)
        return self

    def role(self, role: str) -> NodeBuilder:
        self._node = replace(self._node, role=role)
        return self

    def rdma(self, devices: int) -> NodeBuilder:
        self._node = replace(self._node, rdma=devices)
        return self

    def max_per_node(self, n: int) -> NodeBuilder:
        self._node = replace(self._node, max_per_node=n)
        return self

    def unhealthy(self) -> NodeBuilder:
        self._node = replace(self._node, healthy=False)
        return self

    def build(self) -> Node:
        return self._node


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self._id = job_id
        self._groups: list[TaskGroup] = []
        self._fields: dict[str, object] = {}

    def task(
        self,
        replicas: int = 1,
        *,
        gpu: int = 0,
        gpu_milli: int = 0,
        cpu: float = 1.0,
        mem_gib: float = 1.0,
        gpu_mem_gib: float = 0.0,
        name: str | None = None,
        rdma: int = 0,
    ) -> JobBuilder:
        req = Resources(
            milli_cpu=int(cpu * 1000),
            mem_mib=int(mem_gib * 1024),
            gpu=gpu,
            gpu_milli=gpu_milli,
            gpu_mem_mib=int(gpu_mem_gib * 1024),
            rdma=rdma,
        )
        self._groups.append(TaskGroup(name or f"g{len(self._groups)}", replicas, req))
        return self

    def gang(
        self, replicas: int, *, gpu: int = 0, cpu: float = 1.0, mem_gib: float = 1.0
    ) -> JobBuilder:
        return self.task(replicas, gpu=gpu, cpu=cpu, mem_gib=mem_gib, name="worker")

    def _set(self, **kw: object) -> JobBuilder:
        self._fields.update(kw)
        return self

    def name(self, n: str) -> JobBuilder:
        return self._set(name=n)

    def priority(self, p: int) -> JobBuilder:
        return self._set(priority=p)

    def queue(self, q: str) -> JobBuilder:
        return self._set(queue=q)

    def user(self, u: str) -> JobBuilder:
        return self._set(user=u)

    def submitted(self, t: float) -> JobBuilder:
        return self._set(submit_time_s=t)

    def estimate(self, s: float) -> JobBuilder:
        return self._set(estimate_s=s)

    def backoff(self, s: float) -> JobBuilder:
        return self._set(backoff_s=s)

    def time_limit(self, s: float) -> JobBuilder:
        return self._set(time_limit_s=s)

    def min_available(self, n: int) -> JobBuilder:
        return self._set(min_available=n)

    def elastic(self) -> JobBuilder:
        """Elastic: runs with `min_available` up to all its tasks (set min_available too)."""
        return self._set(elastic=True)

    def replica_of(self, service: str) -> JobBuilder:
        return self._set(replica_of=service)

    def not_preemptible(self) -> JobBuilder:
        return self._set(preemptible=False)

    def kind(self, k: JobKind) -> JobBuilder:
        return self._set(kind=k)

    def models(self, *models: str) -> JobBuilder:
        return self._set(gpu_models=tuple(models))

    def pack(self, level: TopologyLevel, mode: TopologyMode = TopologyMode.REQUIRED) -> JobBuilder:
        return self._set(topology=TopologyRequirement(pack=level, mode=mode))

    def spread(self, level: TopologyLevel) -> JobBuilder:
        return self._set(topology=TopologyRequirement(spread=level))

    def build(self) -> Job:
        groups = tuple(self._groups) or (TaskGroup("main", 1, Resources(milli_cpu=1000)),)
        return Job(id=self._id, groups=groups, **self._fields)  # type: ignore[arg-type]

    def pending(self, **kw: float) -> PendingJob:
        return PendingJob(self.build(), **kw)  # type: ignore[arg-type]


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


def cluster(*nodes: NodeBuilder | Node) -> Cluster:
    return Cluster(tuple(n.build() if isinstance(n, NodeBuilder) else n for n in nodes))


def pending(*jobs: JobBuilder | Job) -> tuple[PendingJob, ...]:
    return tuple(PendingJob(j.build() if isinstance(j, JobBuilder) else j) for j in jobs)

"""The cluster as the loop sees it: nodes with their free capacity and GPU owners, and queues
with what they hold (`/v1/nodes`, `/v1/queues`), read from the loop's published views."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from aisched.core.queues import borrowed_usage
from aisched.core.session import usage_along_paths
from aisched.core.snapshot import ZERO, Usage
from aisched.model.resources import Dim, Resources
from aisched.service.app import Service
from aisched.service.auth import CallerDep
from aisched.service.schemas import GPUOut, NodeList, NodeOut, QueueList, QueueOut


def cluster_router(svc: Service) -> APIRouter:
    router = APIRouter()
    sched = svc.scheduler

    @router.get("/v1/nodes", response_model=NodeList)
    def nodes(who: CallerDep) -> Response:
        info = svc.executor.info()
        owners = sched.gpu_owners()
        a, f = sched.arrays, sched.free
        out = []
        for i, node in enumerate(a.nodes):
            gpus = [
                GPUOut(
                    index=g.index,
                    model=g.model,
                    mem_mib=g.mem_mib,
                    free_milli=int(f.gpu_milli[i, g.index]),
                    used_by=[
                        {"job": j, "task": t, "gpu_milli": m}
                        for j, t, m in owners.get((node.name, g.index), [])
                    ],
                )
                for g in node.gpus
            ]
            out.append(
                NodeOut(
                    name=node.name,
                    rack=node.rack,
                    zone=node.zone,
                    healthy=node.healthy,
                    milli_cpu=node.milli_cpu,
                    mem_mib=node.mem_mib,
                    free_milli_cpu=int(f.cpu[i]),
                    free_mem_mib=int(f.mem[i]),
                    gpus=gpus,
                    memory_limit=info.memory_limit,
                    cpu_affinity=info.cpu_affinity,
                    pinning=info.pinning if info.cpu_affinity else "none",
                    # The start-up lines hold the container engine's, which the executor
                    # also says: each line once.
                    notes=list(
                        dict.fromkeys([*svc.node_notes, *info.notes, *svc.health.check().problems])
                    ),
                )
            )
        return JSONResponse(NodeList(nodes=out).model_dump())

    @router.get("/v1/queues", response_model=QueueList)
    def queues(who: CallerDep) -> Response:
        _, per_queue = sched.live_summary()

        def path(qname: str) -> tuple[str, ...]:
            return sched.queues.path(qname) if sched.queues.has(qname) else (qname,)

        # A parent queue counts what its children hold and run, as its usage counts theirs.
        used = usage_along_paths(sched.queues, dict(list(sched.usage.items())))
        borrowed = borrowed_usage(sched.queues, used)
        jobs: dict[str, tuple[int, int]] = {}
        for qname, (pending, running) in per_queue.items():
            for name in path(qname):
                p0, r0 = jobs.get(name, (0, 0))
                jobs[name] = (p0 + pending, r0 + running)
        out = []
        for q in sched.queues.queues:
            u = used.get(q.name, ZERO)
            b = borrowed.get(q.name, ZERO)
            p, r = jobs.get(q.name, (0, 0))
            out.append(
                QueueOut(
                    name=q.name,
                    parent=q.parent,
                    weight=q.weight,
                    guarantee=_amount(q.guarantee),
                    limit=None if q.limit is None else _cap(q.limit, q.limit_caps()),
                    borrowing=q.borrowing,
                    user_limit=(
                        None if q.user_limit is None else _cap(q.user_limit, q.user_limit_caps())
                    ),
                    max_priority=svc.config.max_priority(sched.queues.path(q.name)),
                    used=_usage(u),
                    borrowed=_usage(b),
                    pending=p,
                    running=r,
                )
            )
        return JSONResponse(QueueList(queues=out).model_dump())

    return router


def _usage(u: Usage) -> dict[str, float]:
    return {"cpus": u[0] / 1000, "mem_gib": u[1] / 1024, "gpus": u[2] / 1000}


def _cap(r: Resources, caps: frozenset[Dim]) -> dict[str, float]:
    """A limit as `_amount` writes it, with only the resources it caps (a 0 among them: none
    of that may be used); those it leaves out are not capped."""
    keys = {Dim.CPU: "cpus", Dim.MEMORY: "mem_gib", Dim.GPU: "gpus"}
    return {k: v for k, v in _amount(r).items() if any(keys[d] == k for d in caps)}


def _amount(r: Any) -> dict[str, float]:
    return {
        "cpus": r.milli_cpu / 1000,
        "mem_gib": r.mem_mib / 1024,
        "gpus": r.gpu + r.gpu_milli / 1000,
    }

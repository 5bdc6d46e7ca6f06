"""The REST API's response documents (pydantic, so they appear in the OpenAPI document).

Times are Unix seconds (floats); resources use the units of the model (`milli_cpu`, `mem_mib`,
`gpu`, `gpu_milli`). Built from store rows and live state here, in one place.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field

from aisched.store.db import Row


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("contains a NUL character")
    return v


# Text of a request body that is stored or looked up: PostgreSQL takes no text with a NUL, and
# failed such a request as if the store failed (503).
NoNul = Annotated[str, AfterValidator(_no_nul)]


class TaskOut(BaseModel):
    name: str
    attempt: int
    rank: int
    node: str
    gpus: list[int]
    gpu_milli: int
    milli_cpu: int
    mem_mib: int
    state: str
    exit_kind: str | None = None
    exit_code: int | None = None
    message: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    log_path: str


class GroupOut(BaseModel):
    name: str
    replicas: int
    command: list[str]
    milli_cpu: int
    mem_mib: int
    gpu: int
    gpu_milli: int
    gpu_mem_mib: int


class JobOut(BaseModel):
    id: str
    name: str
    user: str
    queue: str
    priority: int
    kind: str
    format: str
    state: str
    submitted_at: float
    started_at: float | None
    attempt_started_at: float | None
    finished_at: float | None
    attempt: int
    restarts: int
    failures: int
    preemptions: int
    max_retries: int
    restart_policy: str
    stopping: str | None
    reason_code: str | None
    reason: str | None
    eta: float | None
    predicted_s: float | None
    predicted_upper_s: float | None
    not_before: float | None
    exit_code: int | None
    message: str | None
    checkpoint_dir: str
    gpus: float
    groups: list[GroupOut]
    warnings: list[str]
    tasks: list[TaskOut] = []
    # [{job: id, condition: success|any}]: what must end before this job may start.
    depends_on: list[dict[str, str]] = []
    replica_of: str | None = None  # the service a replica serves
    # Elastic jobs run with min_tasks..max_tasks tasks; how many the current attempt runs
    # (its task rows) while running, in the detail view (None elsewhere, and when not running).
    elastic: bool = False
    min_tasks: int = 1
    max_tasks: int = 1
    running_tasks: int | None = None


class EventOut(BaseModel):
    seq: int
    time: float
    kind: str
    message: str


class ServiceStatusOut(BaseModel):
    """A service's bounds and what the autoscaler last saw (None before its first round)."""

    min_replicas: int
    max_replicas: int
    metric: str
    target: float
    replica_ids: list[str]
    replicas: int | None
    ready: int | None
    desired: int | None
    load: float | None
    reason: str | None
    endpoints: list[str]  # host:port of the ready replicas


class MetricsOut(BaseModel):
    service: str  # the service the figures count for


class JobDetail(JobOut):
    events: list[EventOut] = []  # for its owner and admins only
    service: ServiceStatusOut | None = None
    # Each task group's own variables, for its owner and admins only (None for anyone else).
    env: dict[str, dict[str, str]] | None = None


class TokenIn(BaseModel):
    user: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*\$?$")
    admin: bool = False
    read_only: bool = False
    expires_in_s: float | None = None
    note: NoNul | None = Field(default=None, max_length=256)


class TokenOut(BaseModel):
    id: str
    user: str
    admin: bool
    read_only: bool
    created_at: float
    created_by: str
    expires_at: float | None
    revoked_at: float | None
    note: str | None


class TokenCreated(TokenOut):
    token: str  # the secret: shown in this answer only


class AuditOut(BaseModel):
    seq: int
    time: float
    actor: str
    via: str
    action: str
    target: str
    owner: str | None
    detail: str | None


class JobList(BaseModel):
    jobs: list[JobOut]
    # Whether more jobs match than were listed (`limit`), and the ID to list them `before`.
    more: bool = False
    next_before: str | None = None


class SubmitOut(BaseModel):
    id: str  # the first job's, for a pipeline
    warnings: list[str]
    job: JobOut
    jobs: list[JobOut] = []  # every job of a pipeline, in file order; empty for one job


class CancelOut(BaseModel):
    id: str
    state: str


class GPUOut(BaseModel):
    index: int
    model: str
    mem_mib: int
    free_milli: int
    used_by: list[dict[str, Any]]


class NodeOut(BaseModel):
    name: str
    rack: str
    zone: str
    healthy: bool
    milli_cpu: int
    mem_mib: int
    free_milli_cpu: int
    free_mem_mib: int
    gpus: list[GPUOut]
    memory_limit: str
    cpu_affinity: bool
    # What holds a task to its cores: "cpuset cgroup" or "cpu affinity" (which it may widen).
    pinning: str
    notes: list[str]


class NodeList(BaseModel):
    nodes: list[NodeOut]


class QueueOut(BaseModel):
    name: str
    parent: str | None
    weight: float
    guarantee: dict[str, float]
    # A limit lists only the resources it caps (`{"gpus": 0}`: the queue may use no GPU); a
    # resource left out is not capped. None: no limit.
    limit: dict[str, float] | None
    borrowing: bool
    user_limit: dict[str, float] | None = None  # as `limit`, per user
    # The highest priority a user who is no admin may ask for here: the nearest `max_priority`
    # set on it or above it, else 0.
    max_priority: int = 0
    used: dict[str, float]
    # The part of `used` that reclaim may take back: above its guarantee and every guarantee
    # above it (a queue inside its parent's guarantee has borrowed nothing).
    borrowed: dict[str, float] = {}
    pending: int
    running: int


class QueueList(BaseModel):
    queues: list[QueueOut]


class Problem(BaseModel):
    """Every error answer: what is wrong, and one line per problem with its field path."""

    error: str
    problems: list[str] = []


class Info(BaseModel):
    version: str
    policy: str
    data_dir: str
    database: str = Field(
        description="the state database (its URL, password hidden, for admins; its kind for others)"
    )
    started_at: float
    executor: str
    you: str = ""  # the caller, as the service knows them
    admin: bool = False
    via: str = ""  # socket | token


def job_out(row: Row, tasks: list[Row] | None = None) -> JobOut:
    spec = row["spec"]
    groups = [
        GroupOut(
            name=g["name"],
            replicas=g["replicas"],
            command=list(g["command"]),
            milli_cpu=g["request"]["milli_cpu"],
            mem_mib=g["request"]["mem_mib"],
            gpu=g["request"]["gpu"],
            gpu_milli=g["request"]["gpu_milli"],
            gpu_mem_mib=g["request"]["gpu_mem_mib"],
        )
        for g in spec["groups"]
    ]
    gpus = sum((g.gpu * 1000 + g.gpu_milli) * g.replicas for g in groups) / 1000
    max_tasks = sum(g.replicas for g in groups)
    return JobOut(
        id=row["id"],
        name=row["name"],
        user=row["user"],
        queue=row["queue"],
        priority=row["priority"],
        kind=row["kind"],
        format=row["format"],
        state=row["state"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        attempt_started_at=row["attempt_started_at"],
        finished_at=row["finished_at"],
        attempt=row["attempt"],
        restarts=max(row["attempt"] - 1, 0),
        failures=row["failures"],
        preemptions=row["preemptions"],
        max_retries=spec["max_retries"],
        restart_policy=spec["restart_policy"],
        stopping=row["stopping"],
        reason_code=row["reason_code"],
        reason=row["reason"],
        eta=row["eta"],
        predicted_s=row["predicted_s"],
        predicted_upper_s=row["predicted_upper_s"],
        not_before=row["not_before"],
        exit_code=row["exit_code"],
        message=row["message"],
        checkpoint_dir=row["checkpoint_dir"],
        gpus=gpus,
        groups=groups,
        warnings=list(row["warnings"] or []),
        tasks=[task_out(t) for t in tasks or []],
        depends_on=[{"job": j, "condition": c} for j, c in spec.get("depends_on", ())],
        replica_of=spec.get("replica_of"),
        elastic=bool(spec.get("elastic", False)),
        min_tasks=spec["min_available"] or max_tasks,
        max_tasks=max_tasks,
        running_tasks=len(tasks) if tasks and row["state"] == "running" else None,
    )


def task_out(t: Row) -> TaskOut:
    return TaskOut(
        name=t["name"],
        attempt=t["attempt"],
        rank=t["rank"],
        node=t["node"],
        gpus=list(t["gpus"]),
        gpu_milli=t["gpu_milli"],
        milli_cpu=t["milli_cpu"],
        mem_mib=t["mem_mib"],
        state=t["state"],
        exit_kind=t["exit_kind"],
        exit_code=t["exit_code"],
        message=t["message"],
        started_at=t["started_at"],
        finished_at=t["finished_at"],
        log_path=t["log_path"],
    )

"""The native job file (YAML or JSON): validated with pydantic, converted to a `model.Job`.

Two stages, each reporting every problem it finds: (1) pydantic checks every field (types,
units, limits, names, environment); (2) only when all fields are valid, the checks that relate
fields to each other (tasks vs the one-task shorthand, task names unique, `min_available` within
the job's task count, `priority` vs `priority_class`, topology levels, `gpu_mem` without GPUs).

Unknown keys are errors. Pydantic types stay in this module and `job_common`; `native_job` is
the one place they become a `Job`. The job's id, submit time and the submitting OS user are not
read here: the service sets them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from aisched.model.cluster import TopologyLevel
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
from aisched.spec.command_name import name_from_command
from aisched.spec.errors import Number, SpecError, describe
from aisched.spec.job_common import (
    MAX_TASKS,
    Bandwidth,
    Command,
    Delay,
    EnvName,
    GpuMilli,
    GpuModel,
    Gpus,
    Grace,
    Image,
    JobDefaults,
    MemMib,
    MilliCpu,
    MountPath,
    Name,
    ParsedJob,
    Path,
    Priority,
    Problems,
    Replicas,
    Retries,
    Span,
    Text,
    at_least_one_task,
    container_spec,
    duplicates,
    priority_of_class,
)

FORMAT = "native"
DEFAULT_MILLI_CPU = 1000
DEFAULT_MEM_MIB = 1024
SHORTHAND_GROUP = "main"
_SHORTHAND_KEYS = ("command", "replicas", "resources", "env", "workdir")

Level = Literal["node", "rack", "zone"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourcesModel(_Spec):
    cpus: MilliCpu = DEFAULT_MILLI_CPU
    mem: MemMib = DEFAULT_MEM_MIB
    gpus: Gpus = (0, 0)
    # A share of one GPU in thousandths, the same as a fractional `gpus` (0.25 is 250).
    gpu_milli: GpuMilli | None = None
    gpu_mem: MemMib | None = None  # per GPU (or for the share, with a fractional `gpus`)
    # RDMA devices of its node (InfiniBand / RoCE adapters), whole; cluster files give nodes
    # `rdma: N`.
    rdma: Annotated[StrictInt, Field(ge=0, le=1024)] = 0


class GpuModelsModel(_Spec):
    required: list[GpuModel] = Field(default_factory=list)
    preferred: list[GpuModel] = Field(default_factory=list)


def _models_from_list(v: Any) -> Any:
    # A plain list means "required", the form gpu_models had before preferences.
    if isinstance(v, list | tuple):
        return {"required": v}
    if not isinstance(v, dict):
        raise ValueError(
            "expected a list of GPU models (e.g. [A100, H100]) or a mapping "
            "{required: [...], preferred: [...]}"
        )
    return v


GpuModels = Annotated[GpuModelsModel, BeforeValidator(_models_from_list)]


class VolumeModel(_Spec):
    """A host path mounted into the container (`path`: where; default the same path)."""

    host_path: MountPath
    path: MountPath | None = None
    read_only: StrictBool = False


class _ContainerFields(_Spec):
    """What runs a task in an image; on a job, the default of every task that names none."""

    image: Image | None = None
    network: NetworkMode | None = None
    bandwidth: Bandwidth | None = None
    shm_size: MemMib | None = None
    volumes: list[VolumeModel] | None = None


class TaskModel(_ContainerFields):
    name: Name
    replicas: Replicas = 1
    command: Command
    env: dict[EnvName, Text] = Field(default_factory=dict)
    workdir: Path | None = None
    resources: ResourcesModel = Field(default_factory=ResourcesModel)


class TopologyModel(_Spec):
    pack: Level | None = None
    spread: Level | None = None
    mode: TopologyMode = TopologyMode.REQUIRED


class RestartModel(_Spec):
    policy: RestartPolicy = RestartPolicy.ON_FAILURE
    max_retries: Retries | None = None
    backoff: Delay | None = None


class DependencyModel(_Spec):
    job: Name  # a job of the same file by name, else an existing job by id
    condition: DependencyCondition = DependencyCondition.SUCCESS


def _priority_number(v: Any) -> Any:
    """A priority is a number: a class's name (`priority: high`) goes in priority_class."""
    if isinstance(v, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", v):
        raise ValueError(
            f"expected an integer, got {describe(v)}: a priority class goes in priority_class "
            f"(priority_class: {v})"
        )
    return v


def _reference(v: Any) -> Any:
    """`depends_on: [prep]` is short for `depends_on: [{job: prep}]`; a bare number is an id."""
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    return {"job": v} if isinstance(v, str) else v


MAX_SERVICE_REPLICAS = 1000


def _url_path(v: str) -> str:
    if not v.startswith("/") or any(not "!" <= c <= "~" for c in v):
        raise ValueError(f"{v[:80]!r} is not a URL path: it starts with '/' and has no spaces")
    return v


UrlPath = Annotated[StrictStr, Field(max_length=1024), AfterValidator(_url_path)]


class ServiceModel(_Spec):
    min_replicas: Annotated[StrictInt, Field(ge=0, le=MAX_SERVICE_REPLICAS)] = 1
    max_replicas: Annotated[StrictInt, Field(ge=1, le=MAX_SERVICE_REPLICAS)] | None = None
    metric: ScaleMetric = ScaleMetric.RPS
    target: Annotated[Number, Field(gt=0, le=1e9)] = 10.0
    readiness_path: UrlPath | None = "/healthz"
    metrics_path: UrlPath | None = None
    scale_up_window: Delay | None = None
    scale_down_window: Delay | None = None
    tolerance: Annotated[Number, Field(ge=0, lt=1)] = 0.1


class NativeJobModel(_ContainerFields):
    name: Name | None = None
    kind: JobKind = JobKind.BATCH
    queue: Name | None = None
    user: Name | None = None
    priority: Annotated[Priority, BeforeValidator(_priority_number)] | None = None
    priority_class: StrictStr | None = None
    preemptible: StrictBool = True
    min_available: Replicas | None = None
    gpu_models: GpuModels = Field(default_factory=GpuModelsModel)
    topology: TopologyModel | None = None
    restart: RestartModel | None = None
    time_limit: Span | None = None
    estimate: Span | None = None
    checkpoint_interval: Span | None = None
    grace_period: Grace | None = None
    service: ServiceModel | None = None
    elastic: StrictBool = False
    depends_on: list[Annotated[DependencyModel, BeforeValidator(_reference)]] = Field(
        default_factory=list
    )
    tasks: Annotated[list[TaskModel], AfterValidator(at_least_one_task)] | None = None
    # The one-task shorthand: a group named "main".
    command: Command | None = None
    replicas: Replicas | None = None
    resources: ResourcesModel | None = None
    env: dict[EnvName, Text] | None = None
    workdir: Path | None = None


def native_job(data: dict[Any, Any], source: str, defaults: JobDefaults) -> ParsedJob:
    """Validate a native job document and build its `Job`; every problem is a SpecError."""
    try:
        spec = NativeJobModel.model_validate(data)
    except ValidationError as e:
        raise SpecError.from_validation_error(e, source) from None
    p = Problems(source)
    groups = _groups(spec, p)
    num_tasks = sum(g.replicas for g in groups)
    if num_tasks > MAX_TASKS:
        p.add("tasks", f"{num_tasks} tasks in all, more than the limit of {MAX_TASKS}")
    if spec.min_available is not None and groups and spec.min_available > num_tasks:
        p.add("min_available", f"{spec.min_available} is more than the job's {num_tasks} tasks")
    elif spec.elastic and groups and (spec.min_available or num_tasks) >= num_tasks:
        p.add(
            "elastic",
            f"needs min_available below the job's {num_tasks} tasks: the fewest it runs with",
        )
    service = _service(spec, groups, p)
    priority = _priority(spec, defaults, p)
    topology = _topology(spec.topology, p)
    _check_models(spec.gpu_models, p)
    if p.lines:
        raise SpecError(p.lines)

    restart = spec.restart or RestartModel()
    job = Job(
        id="",
        groups=tuple(groups),
        name=spec.name or name_from_command(groups[0].command),
        kind=spec.kind,
        user=spec.user or defaults.user,
        queue=spec.queue or defaults.queue,
        priority=priority,
        preemptible=spec.preemptible,
        min_available=spec.min_available,
        topology=topology,
        gpu_models=tuple(spec.gpu_models.required),
        gpu_models_preferred=tuple(spec.gpu_models.preferred),
        restart_policy=restart.policy,
        max_retries=defaults.max_retries if restart.max_retries is None else restart.max_retries,
        time_limit_s=spec.time_limit,
        estimate_s=spec.estimate,
        checkpoint_interval_s=spec.checkpoint_interval,
        grace_period_s=defaults.grace_period_s if spec.grace_period is None else spec.grace_period,
        backoff_s=defaults.backoff_s if restart.backoff is None else restart.backoff,
        # References as written; `spec.pipeline` resolves names of the same file, the service
        # checks the rest are existing jobs.
        depends_on=tuple(Dependency(d.job, d.condition) for d in spec.depends_on),
        service=service,
        elastic=spec.elastic,
    )
    return ParsedJob(job=job, format=FORMAT)


def _groups(spec: NativeJobModel, p: Problems) -> list[TaskGroup]:
    given = [k for k in _SHORTHAND_KEYS if k in spec.model_fields_set]
    if spec.tasks is not None:
        for k in given:
            p.add(k, "cannot be used together with tasks: put it inside a task")
        for i, first in duplicates(t.name for t in spec.tasks):
            p.add(f"tasks.{i}.name", f"{spec.tasks[i].name!r} is already the name of tasks.{first}")
        return [_group(t, f"tasks.{i}", p, spec) for i, t in enumerate(spec.tasks)]
    if spec.command is None:
        p.add("command", "a job needs a command (or a list of tasks)")
        return []
    # Already validated field by field; model_construct keeps the values as they are.
    one = TaskModel.model_construct(
        name=SHORTHAND_GROUP,
        replicas=spec.replicas or 1,
        command=spec.command,
        env=spec.env or {},
        workdir=spec.workdir,
        resources=spec.resources or ResourcesModel(),
    )
    return [_group(one, "", p, spec)]


def _group(t: TaskModel, path: str, p: Problems, job: NativeJobModel) -> TaskGroup:
    r = t.resources
    gpu, gpu_milli = r.gpus
    if r.gpu_milli is not None:
        if "gpus" in r.model_fields_set:
            p.add(_join(path, "resources.gpu_milli"), "give gpus or gpu_milli, not both")
        gpu, gpu_milli = 0, r.gpu_milli
    gpu_mem_mib = 0
    if r.gpu_mem is not None:
        if not gpu and not gpu_milli:
            p.add(_join(path, "resources.gpu_mem"), "needs gpus: ask for a GPU or a share of one")
        # `gpu_mem` is per GPU; the model counts the task's total over its whole GPUs.
        gpu_mem_mib = r.gpu_mem * gpu if gpu else r.gpu_mem
    return TaskGroup(
        name=t.name,
        replicas=t.replicas,
        request=Resources(
            milli_cpu=r.cpus,
            mem_mib=r.mem,
            gpu=gpu,
            gpu_milli=gpu_milli,
            gpu_mem_mib=gpu_mem_mib,
            rdma=r.rdma,
        ),
        command=t.command,
        env=tuple(t.env.items()),
        workdir=t.workdir,
        container=_container(t, path, p, job),
    )


def _container(t: TaskModel, path: str, p: Problems, job: NativeJobModel) -> ContainerSpec | None:
    """The task's container: its own fields, else the job's (a task inherits each one)."""

    def pick(key: str) -> Any:
        own = getattr(t, key, None)
        return own if own is not None else getattr(job, key)

    volumes = tuple(
        Volume(v.host_path, v.path or v.host_path, v.read_only) for v in pick("volumes") or ()
    )
    return container_spec(
        pick("image"),
        pick("network"),
        pick("bandwidth"),
        pick("shm_size"),
        volumes,
        f"{path}." if path else "",
        p,
        [(f"{path}.env.{k}" if path else f"env.{k}", str(v)) for k, v in t.env.items()],
    )


def _check_models(m: GpuModelsModel, p: Problems) -> None:
    for i, name in duplicates(m.required):
        p.add(f"gpu_models.required.{i}", f"{m.required[i]!r} repeats required.{name}")
    for i, name in duplicates(m.preferred):
        p.add(f"gpu_models.preferred.{i}", f"{m.preferred[i]!r} repeats preferred.{name}")
    if m.required:
        for i, model in enumerate(m.preferred):
            if model not in m.required:
                p.add(
                    f"gpu_models.preferred.{i}",
                    f"{model!r} is not among the required models "
                    f"({', '.join(m.required)}): the job could never run there",
                )


def _service(spec: NativeJobModel, groups: list[TaskGroup], p: Problems) -> ServiceSpec | None:
    """The service block, checked against the rest: only on `kind: service`, one replica task."""
    s = spec.service
    if spec.kind != JobKind.SERVICE:
        if s is not None:
            p.add("service", "only a job of kind service has a service block")
        return None
    s = s or ServiceModel()
    # Unsaid, as many as the minimum, and one for a service that may scale to zero.
    max_replicas = max(s.min_replicas, 1) if s.max_replicas is None else s.max_replicas
    if s.min_replicas > max_replicas:
        p.add("service.min_replicas", f"{s.min_replicas} is more than max_replicas {max_replicas}")
    if s.min_replicas == 0 and s.metric == ScaleMetric.LATENCY_MS:
        p.add(
            "service.min_replicas",
            "0 needs metric rps: a latency is measured on a running replica, so a latency_ms "
            "service scaled to zero would never get a replica again; give at least 1",
        )
    if groups and (len(groups) != 1 or groups[0].replicas != 1):
        p.add(
            "replicas" if spec.tasks is None else "tasks",
            "a service's replica is one task; scale it with service.min_replicas and "
            "service.max_replicas",
        )
    if spec.min_available is not None:
        p.add("min_available", "a service's replicas start one by one; leave it out")
    if p.lines:
        return None
    return ServiceSpec(
        min_replicas=s.min_replicas,
        max_replicas=max_replicas,
        metric=s.metric,
        target=s.target,
        readiness_path=s.readiness_path,
        metrics_path=s.metrics_path,
        scale_up_window_s=0.0 if s.scale_up_window is None else s.scale_up_window,
        scale_down_window_s=300.0 if s.scale_down_window is None else s.scale_down_window,
        tolerance=s.tolerance,
    )


def _priority(spec: NativeJobModel, defaults: JobDefaults, p: Problems) -> int:
    if spec.priority_class is None:
        return spec.priority or 0
    if spec.priority is not None:
        p.add("priority_class", "give priority or priority_class, not both")
        return 0
    try:
        return priority_of_class(spec.priority_class, defaults.priority_classes)
    except ValueError as e:
        p.add("priority_class", str(e))
        return 0


def _topology(t: TopologyModel | None, p: Problems) -> TopologyRequirement:
    if t is None:
        return TopologyRequirement()
    pack = None if t.pack is None else TopologyLevel[t.pack.upper()]
    spread = None if t.spread is None else TopologyLevel[t.spread.upper()]
    if pack is not None and spread is not None and spread >= pack:
        p.add(
            "topology.spread",
            f"must be a smaller level than pack ({t.pack}): one task per {t.spread} "
            f"inside one {t.pack} leaves room for one task",
        )
    return TopologyRequirement(pack=pack, mode=t.mode, spread=spread)


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix else path

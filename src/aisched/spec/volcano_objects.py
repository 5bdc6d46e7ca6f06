"""The Kubernetes and Volcano objects of a `batch.volcano.sh/v1alpha1` Job file, as pydantic
models: what `spec.job_volcano` reads before it maps a file to a `model.Job`.

Unknown keys are accepted everywhere (Kubernetes and Volcano add fields over versions) and not
kept, except where they are kept to be warned about by name (extended resources, other volume
kinds); every field aisched acts on is type-checked here, with its bounds. What cannot be
honoured at all is refused here with its path: a second container, a value or environment
taken from a ConfigMap, a Secret or a pod field. No mapping and no defaults: those are the
job module's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from aisched.spec.job_common import (
    MAX_DURATION_S,
    MAX_GRACE_S,
    EnvName,
    Image,
    K8sGpus,
    K8sMemMib,
    K8sMilliCpu,
    MountPath,
    Name,
    Path,
    Replicas,
    Retries,
    Span,
    Text,
    at_least_one_task,
)


def _refuse_value_from(v: Any) -> Any:
    if v is not None:
        raise ValueError(
            "aisched cannot read ConfigMaps, Secrets or pod fields: give the value itself"
        )
    return v


def _refuse_env_from(v: Any) -> Any:
    if v is not None:
        raise ValueError(
            "aisched cannot read ConfigMaps or Secrets: list each variable under env with its value"
        )
    return v


def _one_container(v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Exactly one container; a second one is reported together with the first one's mistakes."""
    if not isinstance(v, list) or len(v) <= 1:
        out = handler(v)
        if not out:
            raise ValueError("a task needs one container with a command")
        return out
    errors: list[InitErrorDetails] = []
    try:
        handler(v)
    except ValidationError as e:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(x["type"], x["msg"]), loc=x["loc"], input=x["input"]
            )
            for x in e.errors(include_url=False)
        ]
    errors.append(
        InitErrorDetails(
            type=PydanticCustomError(
                "value_error",
                "aisched runs one process per task; this task has {n} containers (make each its "
                "own task, or start them all from one command)",
                {"n": len(v)},
            ),
            loc=(),
            input=v,
        )
    )
    raise ValidationError.from_exception_data("containers", errors)


class _K8s(BaseModel):
    """Kubernetes objects: camelCase keys, unknown keys accepted (and not kept)."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel)


class ResourceList(BaseModel):
    # Extra keys are kept so that unsupported extended resources can be warned about.
    model_config = ConfigDict(extra="allow", frozen=True)

    cpu: K8sMilliCpu | None = None
    memory: K8sMemMib | None = None
    gpu: K8sGpus | None = Field(default=None, alias="nvidia.com/gpu")


class ContainerResources(_K8s):
    limits: ResourceList | None = None
    requests: ResourceList | None = None


class EnvVar(_K8s):
    name: EnvName
    value: Text = ""
    value_from: Annotated[Any, AfterValidator(_refuse_value_from)] = None


class VolumeMount(_K8s):
    name: StrictStr
    mount_path: MountPath
    read_only: bool = False
    sub_path: Any = None


class HostPathSource(_K8s):
    path: MountPath
    type: StrictStr | None = None


class PodVolume(BaseModel):
    # Other volume kinds (emptyDir, configMap, persistentVolumeClaim...) are kept to be named.
    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel)

    name: StrictStr
    host_path: HostPathSource | None = None


class Container(_K8s):
    image: Image | None = None
    command: list[Text] | None = None
    args: list[Text] | None = None
    env: list[EnvVar] = Field(default_factory=list)
    env_from: Annotated[Any, AfterValidator(_refuse_env_from)] = None
    working_dir: Path | None = None
    resources: ContainerResources | None = None
    volume_mounts: list[VolumeMount] | None = None
    security_context: Any = None


class PodSpec(_K8s):
    containers: Annotated[list[Container], WrapValidator(_one_container)]
    init_containers: Any = None
    restart_policy: Literal["Always", "OnFailure", "Never"] | None = None
    active_deadline_seconds: StrictInt | None = Field(default=None, ge=1, le=int(MAX_DURATION_S))
    termination_grace_period_seconds: StrictInt | None = Field(
        default=None, ge=0, le=int(MAX_GRACE_S)
    )
    volumes: list[PodVolume] | None = None
    host_network: bool | None = None
    host_pid: bool | None = Field(default=None, alias="hostPID")
    host_ipc: bool | None = Field(default=None, alias="hostIPC")
    node_selector: Any = None
    affinity: Any = None
    topology_spread_constraints: Any = None
    node_name: Any = None
    priority_class_name: Any = None
    security_context: Any = None


class TemplateMeta(_K8s):
    annotations: dict[StrictStr, Any] | None = None
    labels: dict[StrictStr, Any] | None = None


class PodTemplate(_K8s):
    metadata: TemplateMeta | None = None
    spec: PodSpec


class LifecyclePolicy(_K8s):
    event: StrictStr | None = None
    events: list[StrictStr] | None = None
    action: StrictStr | None = None
    exit_code: StrictInt | None = None


class TaskSpec(_K8s):
    name: Name | None = None
    replicas: Replicas = 1
    min_available: StrictInt | None = Field(default=None, ge=0)
    template: PodTemplate
    policies: list[LifecyclePolicy] = Field(default_factory=list)
    max_retry: Any = None
    depends_on: Any = None
    partition_policy: Any = None


class JobSpec(_K8s):
    min_available: StrictInt | None = Field(default=None, ge=0)
    queue: Name | None = None
    priority_class_name: StrictStr | None = None
    max_retry: Retries | None = None
    running_estimate: Span | None = None
    policies: list[LifecyclePolicy] = Field(default_factory=list)
    plugins: dict[StrictStr, list[StrictStr] | None] | None = None
    tasks: Annotated[list[TaskSpec], AfterValidator(at_least_one_task)]
    volumes: Any = None
    network_topology: Any = None
    min_success: Any = None


class ObjectMeta(_K8s):
    name: Name
    annotations: dict[StrictStr, Any] | None = None
    labels: dict[StrictStr, Any] | None = None


class VolcanoJob(_K8s):
    metadata: ObjectMeta
    spec: JobSpec

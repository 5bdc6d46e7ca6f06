"""Volcano `batch.volcano.sh/v1alpha1` Job files, accepted as users have them, made a `model.Job`.

Kubernetes and Volcano add fields over versions, so unknown keys are accepted everywhere; every
field aisched acts on is type-checked. Fields that would change what the author expects but that
aisched cannot honour (volumes other than hostPath, a node selector, init containers, other
extended resources, per-task retry limits...) give a warning with their path; fields that cannot
be honoured at all give an error (a second container, an environment value taken from a Secret,
a container without a command: aisched runs a command, and an image's entrypoint is unknown).

The mapping (docs/jobs.md has it as a table):

- `metadata.name` -> name (required); `metadata.namespace` is ignored: aisched has no namespaces.
- `spec.queue`, `spec.minAvailable` (0 or absent: the sum of the tasks' `minAvailable`, each
  defaulting to its replicas, as Volcano's webhook does), `spec.priorityClassName` (through the
  configured priority classes), `spec.maxRetry` (absent: 3, Volcano's default),
  `spec.runningEstimate` -> estimate.
- `spec.tasks[i]`: `name` (absent: `default<i>`, as Volcano names it), `replicas` (absent: 1),
  `template.spec.containers[0]`: `command` + `args`, `env`, `workingDir`,
  `resources.limits` else `resources.requests` per resource (`cpu`, default 1; `memory`,
  default 1Gi; `nvidia.com/gpu`); `image` runs the task in that image (docs/containers.md),
  with the pod's `hostPath` volumes mounted at the container's `volumeMounts`, and the CNI
  bandwidth plugin's `kubernetes.io/egress-bandwidth` annotation shaping its traffic.
- Pod `activeDeadlineSeconds` -> time limit (the smallest over the tasks);
  `terminationGracePeriodSeconds` -> grace period (the largest over the tasks).
- Restart policy: (1) a lifecycle policy (job's or a task's) that restarts on a failure event
  (`PodFailed`, `TaskFailed`, `Unknown`, `*`) or on an exit code -> on-failure; (2) else one
  that aborts or terminates the job on such an event -> never; (3) else the pods'
  `restartPolicy`: all `Never` -> never, all `Always` -> always, anything else (a task that
  gives none among them) or none given -> on-failure (not Kubernetes' default `Always`,
  which would run finished work again forever).
  `PodEvicted` policies are accepted silently: aisched requeues preempted work by itself.
- Kind: train when a `pytorch`, `tensorflow` or `mpi` plugin is on, else batch. The `pytorch`
  plugin's master task group is put first, so that its ranks are the plugin's (its `--port`
  is warned about: MASTER_PORT is chosen free at start).
- `volcano.sh/preemptable: "false"` (job annotation, else job label, else any task template's
  annotation or label) -> not preemptible.
- No `spec.queue`: the queue of a Kueue or KAI scheduler label (`QUEUE_LABELS`).

The file's objects (pods, containers, tasks, policies) are read as the pydantic models of
`spec.volcano_objects`; this module maps them, with the defaults and warnings above.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import TypeAdapter, ValidationError

from aisched.model.expansion import expand, expand_env
from aisched.model.job import (
    ContainerSpec,
    Job,
    JobKind,
    NetworkMode,
    RestartPolicy,
    TaskGroup,
    Volume,
)
from aisched.model.resources import Resources
from aisched.spec.errors import SpecError, describe
from aisched.spec.job_common import (
    MAX_TASKS,
    JobDefaults,
    Name,
    ParsedJob,
    Problems,
    container_spec,
    duplicates,
    exec_size_problems,
    nonempty_command,
    priority_of_class,
    to_bandwidth_bit_s,
)
from aisched.spec.units import UnitError, k8s_quantity
from aisched.spec.volcano_objects import (
    ContainerResources,
    JobSpec,
    ObjectMeta,
    ResourceList,
    TaskSpec,
    TemplateMeta,
    VolcanoJob,
)

FORMAT = "volcano"
API_VERSION = "batch.volcano.sh/v1alpha1"
KIND = "Job"
# Volcano's own default for spec.maxRetry.
DEFAULT_MAX_RETRY = 3
DEFAULT_MILLI_CPU = 1000
DEFAULT_MEM_MIB = 1024
PREEMPTABLE_ANNOTATION = "volcano.sh/preemptable"
# Kueue's and NVIDIA KAI scheduler's job labels naming a queue: the queue without spec.queue.
QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "kai.scheduler/queue")
_QUEUE_NAME: TypeAdapter[str] = TypeAdapter(Name)

FAILURE_EVENTS = frozenset({"PodFailed", "TaskFailed", "Unknown", "*"})
KNOWN_EVENTS = FAILURE_EVENTS | {
    "PodEvicted",
    "PodPending",
    "PodRunning",
    "TaskCompleted",
    "OutOfSync",
    "CommandIssued",
    "JobUpdated",
}
RESTART_ACTIONS = frozenset({"RestartJob", "RestartTask", "RestartPod", "RestartPartition"})
STOP_ACTIONS = frozenset({"AbortJob", "TerminateJob"})
KNOWN_ACTIONS = (
    RESTART_ACTIONS
    | STOP_ACTIONS
    | {"CompleteJob", "ResumeJob", "SyncJob", "EnqueueJob", "SyncQueue", "OpenQueue", "CloseQueue"}
)
TRAIN_PLUGINS = frozenset({"pytorch", "tensorflow", "mpi"})
# The pytorch plugin's variables are the ones aisched sets for every task (its ranks: see
# `_pytorch_master_first`).
SILENT_PLUGINS = frozenset({"pytorch"})
_BOOL_WORDS = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}

# --- warnings, by what was ignored ----------------------------------------------------------

_IGNORED_VOLUMES = "ignored: aisched mounts only hostPath volumes into a container"
_IGNORED_VOLUMES_HOST = "ignored: without an image the task runs on the host and sees its files"
# The CNI bandwidth plugin's pod annotations.
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
_IGNORED_SHAPING_HOST = "ignored: traffic is shaped in a container only; this task has no image"
_IGNORED_PLACEMENT = "ignored: aisched does not place tasks by node labels or affinity"
# A user asking for root or privileges must hear that they get neither.
_IGNORED_SECURITY = (
    "ignored: every task runs as the user who submits it, without privileges (docs/security.md)"
)
_IGNORED_INIT = "not run: aisched runs only the task's container"
_IGNORED_TOPOLOGY = "ignored: use a native job file's topology (pack/spread) instead"
# A Kubernetes object's own keys; anything else beside them (`depends_on:` of a native job file,
# say) would be dropped without a word.
_OBJECT_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
_IGNORED_TOP_LEVEL = (
    "ignored: a Volcano Job has apiVersion, kind, metadata and spec (a native job file's "
    "fields do not apply to it)"
)


def volcano_job(data: dict[Any, Any], source: str, defaults: JobDefaults) -> ParsedJob:
    """Validate a Volcano Job document (its apiVersion and kind already checked) and build its
    `Job`; every problem is a SpecError, every ignored-but-meaningful field a warning."""
    try:
        doc = VolcanoJob.model_validate(data)
    except ValidationError as e:
        raise SpecError.from_validation_error(e, source) from None
    spec = doc.spec
    p = Problems(source)
    w = Problems(source)
    for key in data:
        if key not in _OBJECT_KEYS:
            w.add(str(key), _IGNORED_TOP_LEVEL)

    groups = [_group(t, i, p, w) for i, t in enumerate(spec.tasks)]
    for i, first in duplicates(g.name for g in groups):
        p.add(
            f"spec.tasks.{i}.name", f"{groups[i].name!r} is already the name of spec.tasks.{first}"
        )
    groups = _pytorch_master_first(spec, groups, p, w)
    num_tasks = sum(g.replicas for g in groups)
    if num_tasks > MAX_TASKS:
        p.add("spec.tasks", f"{num_tasks} tasks in all, more than the limit of {MAX_TASKS}")
    min_available = _min_available(spec, num_tasks, p, w)

    priority = 0
    if spec.priority_class_name is not None:
        try:
            priority = priority_of_class(spec.priority_class_name, defaults.priority_classes)
        except ValueError as e:
            p.add("spec.priorityClassName", str(e))
    preemptible = _preemptible(doc, p)
    queue, queue_path = _queue(doc, p, w)
    restart = _restart_policy(spec, w)
    kind = _kind(spec, w)
    _warn_job_level(spec, w)
    if p.lines:
        raise SpecError(p.lines)

    pods = [t.template.spec for t in spec.tasks]
    deadlines = [s.active_deadline_seconds for s in pods if s.active_deadline_seconds is not None]
    graces = [
        s.termination_grace_period_seconds
        for s in pods
        if s.termination_grace_period_seconds is not None
    ]
    job = Job(
        id="",
        groups=tuple(groups),
        name=doc.metadata.name,
        kind=kind,
        user=defaults.user,
        queue=queue or defaults.queue,
        priority=priority,
        preemptible=preemptible,
        min_available=min_available,
        restart_policy=restart,
        max_retries=DEFAULT_MAX_RETRY if spec.max_retry is None else spec.max_retry,
        time_limit_s=float(min(deadlines)) if deadlines else None,
        estimate_s=spec.running_estimate,
        grace_period_s=float(max(graces)) if graces else defaults.grace_period_s,
        backoff_s=defaults.backoff_s,
    )
    return ParsedJob(job=job, format=FORMAT, warnings=tuple(w.lines), queue_path=queue_path)


def _group(t: TaskSpec, i: int, p: Problems, w: Problems) -> TaskGroup:
    tp = f"spec.tasks.{i}"
    pod = t.template.spec
    c = pod.containers[0]
    cp = f"{tp}.template.spec.containers.0"

    command = tuple(c.command or ()) + tuple(c.args or ())
    if not c.command:
        p.add(
            f"{cp}.command",
            "required: aisched runs a command, and the image's entrypoint is not known"
            + (" (args alone are not enough)" if c.args else ""),
        )
    else:
        try:
            nonempty_command(command)
        except ValueError as e:
            p.add(f"{cp}.command", str(e))
    names = [e.name for e in c.env]
    for j, first in duplicates(names):
        p.add(f"{cp}.env.{j}.name", f"{names[j]!r} is already set by env.{first}")
    env = expand_env(tuple((e.name, e.value) for e in c.env))
    _check_expanded_sizes(c.command or [], c.args or [], env, cp, p)

    if c.image is not None and c.working_dir is not None and not c.working_dir.startswith("/"):
        # A path inside the image, where the runtime wants it absolute (runc refuses others).
        p.add(f"{cp}.workingDir", f"{c.working_dir!r}: give an absolute path inside the image")
    request = _request(c.resources, f"{cp}.resources", p, w)
    sp = f"{tp}.template.spec"
    container = _container(t, tp, p, w)
    for value, key, message in (
        (pod.init_containers, "initContainers", _IGNORED_INIT),
        (pod.node_selector, "nodeSelector", _IGNORED_PLACEMENT),
        (pod.affinity, "affinity", _IGNORED_PLACEMENT),
        (pod.topology_spread_constraints, "topologySpreadConstraints", _IGNORED_PLACEMENT),
        (pod.node_name, "nodeName", _IGNORED_PLACEMENT),
        (
            pod.priority_class_name,
            "priorityClassName",
            "ignored: aisched reads spec.priorityClassName",
        ),
        (pod.security_context, "securityContext", _IGNORED_SECURITY),
    ):
        if value:
            w.add(f"{sp}.{key}", message)
    if c.security_context:
        w.add(f"{cp}.securityContext", _IGNORED_SECURITY)
    if c.image is not None:  # a task on the host shares the host's namespaces anyway
        for shared, key, what in ((pod.host_pid, "hostPID", "process IDs"),
                                  (pod.host_ipc, "hostIPC", "IPC")):  # fmt: skip
            if shared:
                w.add(f"{sp}.{key}", f"ignored: a container has its own {what}, not the host's")
    if t.max_retry is not None:
        w.add(f"{tp}.maxRetry", "ignored: aisched retries the whole job, up to spec.maxRetry")
    if t.depends_on:
        w.add(f"{tp}.dependsOn", "ignored: aisched starts a job's tasks together")
    if t.partition_policy:
        w.add(f"{tp}.partitionPolicy", _IGNORED_TOPOLOGY)

    return TaskGroup(
        name=t.name or f"default{i}",
        replicas=t.replicas,
        request=request,
        command=command,
        env=env,
        workdir=c.working_dir,
        container=container,
        kubernetes_pod=True,
    )


def _check_expanded_sizes(
    command: list[str], args: list[str], env: tuple[tuple[str, str], ...], cp: str, p: Problems
) -> None:
    """Refuse a command or an env value that `$(NAME)` makes too large for the kernel: each was
    checked as written, and the kernel would refuse it at every start. Only the file's own
    variables are known here; the launch checks again with the scheduler's (`Launches`)."""
    for j, (_, value) in enumerate(env):
        for _, message in exec_size_problems([value], ()):
            p.add(f"{cp}.env.{j}.value", message)
    defined = dict(env)
    words = [expand(word, defined) for word in [*command, *args]]
    for i, message in exec_size_problems(words, env):
        if i is None:
            p.add(cp, message)
        elif i < len(command):
            p.add(f"{cp}.command.{i}", message)
        else:
            p.add(f"{cp}.args.{i - len(command)}", message)


def _container(t: TaskSpec, tp: str, p: Problems, w: Problems) -> ContainerSpec | None:
    """The task's container (None without an image): its hostPath volumes mounted where the
    container's volumeMounts say, the network of the pod (hostNetwork: the host's; else the
    host's too, unless the CNI bandwidth annotation asks for shaping, which needs a bridge)."""
    pod = t.template.spec
    c = pod.containers[0]
    cp = f"{tp}.template.spec.containers.0"
    sp = f"{tp}.template.spec"
    annotations = (t.template.metadata.annotations if t.template.metadata else None) or {}
    ap = f"{tp}.template.metadata.annotations"
    if c.image is None:
        if c.volume_mounts:
            w.add(f"{cp}.volumeMounts", _IGNORED_VOLUMES_HOST)
        if pod.volumes:
            w.add(f"{sp}.volumes", _IGNORED_VOLUMES_HOST)
        for key in (EGRESS_ANNOTATION, INGRESS_ANNOTATION):
            if key in annotations:
                w.add(f"{ap}.{key}", _IGNORED_SHAPING_HOST)
        return None
    by_name = {v.name: (i, v) for i, v in enumerate(pod.volumes or ())}
    for i, v in enumerate(pod.volumes or ()):
        if v.host_path is None:
            kinds = ", ".join(sorted(v.model_extra or {})) or "no source"
            w.add(f"{sp}.volumes.{i}", f"{_IGNORED_VOLUMES} ({v.name}: {kinds})")
    volumes: list[Volume] = []
    for j, m in enumerate(c.volume_mounts or ()):
        found = by_name.get(m.name)
        if found is None:
            p.add(f"{cp}.volumeMounts.{j}.name", f"no volume named {m.name!r} in {sp}.volumes")
            continue
        i, v = found
        if v.host_path is None:
            continue  # warned about above
        if m.sub_path:
            w.add(f"{cp}.volumeMounts.{j}.subPath", "ignored: the whole hostPath is mounted")
        volumes.append(Volume(v.host_path.path, m.mount_path, m.read_only))
    bandwidth: int | None = None
    if EGRESS_ANNOTATION in annotations:
        try:
            bandwidth = to_bandwidth_bit_s(_k8s_rate(annotations[EGRESS_ANNOTATION]))
        except (ValueError, UnitError) as e:
            p.add(f"{ap}.{EGRESS_ANNOTATION}", str(e))
    if INGRESS_ANNOTATION in annotations:
        w.add(f"{ap}.{INGRESS_ANNOTATION}", "ignored: aisched shapes egress only")
    network = NetworkMode.BRIDGE if bandwidth is not None else NetworkMode.HOST
    if pod.host_network and bandwidth is not None:
        p.add(f"{sp}.hostNetwork", f"cannot be shaped ({EGRESS_ANNOTATION}): it needs a bridge")
    env = [(f"{cp}.env.{j}.value", e.value) for j, e in enumerate(c.env)]
    spec = container_spec(c.image, network, bandwidth, None, tuple(volumes), f"{tp}.", p, env)
    # A pod's workingDir is a path in its image, and none means the image's WORKDIR.
    return None if spec is None else replace(spec, workdir_in_image=True)


def _k8s_rate(v: Any) -> int:
    """The bandwidth plugin's quantities are bits per second: `10M` is 10 Mbit/s."""
    return int(k8s_quantity(v))


# Each resource aisched reads: its attribute of ResourceList, its key, its quantity in words.
_RESOURCES = (
    ("cpu", "cpu", lambda v: f"{v / 1000:g}"),
    ("memory", "memory", lambda v: f"{v}Mi"),
    ("gpu", "nvidia.com/gpu", str),
)


def _request(r: ContainerResources | None, path: str, p: Problems, w: Problems) -> Resources:
    limits = (r.limits if r else None) or ResourceList()
    requests = (r.requests if r else None) or ResourceList()
    for attr, key, shown in _RESOURCES:
        asked, limit = getattr(requests, attr), getattr(limits, attr)
        if asked is not None and limit is not None and asked > limit:
            # Kubernetes refuses it too: a request is what the pod is sure to get, the limit
            # the most it may use.
            p.add(
                f"{path}.requests.{key}",
                f"{shown(asked)} is more than its limit ({shown(limit)}): a request must be "
                "less than or equal to the limit",
            )
    for key, rl in (("limits", limits), ("requests", requests)):
        for name in sorted((rl.model_extra or {}).keys()):
            # Standard resources (ephemeral-storage, hugepages-*) do not change what runs.
            if "/" in name:
                w.add(f"{path}.{key}.{name}", f"ignored: aisched does not manage {name}")

    def pick(attr: str, default: int) -> int:
        for rl in (limits, requests):
            v: int | None = getattr(rl, attr)
            if v is not None:
                return v
        return default

    return Resources(
        milli_cpu=pick("cpu", DEFAULT_MILLI_CPU),
        mem_mib=pick("memory", DEFAULT_MEM_MIB),
        gpu=pick("gpu", 0),
    )


def _min_available(spec: JobSpec, num_tasks: int, p: Problems, w: Problems) -> int | None:
    per_task = 0
    for i, t in enumerate(spec.tasks):
        if t.min_available is None:
            per_task += t.replicas
            continue
        if t.min_available > t.replicas:
            p.add(
                f"spec.tasks.{i}.minAvailable",
                f"{t.min_available} is more than the task's {t.replicas} replicas",
            )
        per_task += min(t.min_available, t.replicas)
    if spec.min_available:
        if spec.min_available > num_tasks:
            p.add(
                "spec.minAvailable",
                f"{spec.min_available} is more than the job's {num_tasks} tasks",
            )
            return None
        want = spec.min_available
    else:
        # Go's zero value: Volcano reads 0 as "not set" and sums the tasks' minimums.
        want = max(1, per_task)
    for i, t in enumerate(spec.tasks):
        if t.min_available is not None and t.min_available != t.replicas:
            w.add(
                f"spec.tasks.{i}.minAvailable",
                f"aisched keeps one minimum for the whole job ({want} of {num_tasks} tasks), "
                "not one per task",
            )
    if want < num_tasks:
        # Volcano starts the pods past the gang minimum later, as room appears; aisched's
        # minimum is how few a job may start with, and it never adds tasks to a non-elastic
        # job, so a job that needs every task to run must not set one.
        given = bool(spec.min_available)
        summed = "" if given else "the tasks' minAvailable add up to "
        w.add(
            "spec.minAvailable" if given else "spec.tasks",
            f"{summed}{want} of the job's "
            f"{num_tasks} tasks: aisched starts as many of the {num_tasks} tasks as fit at "
            f"once (at least {want}) and never starts the others later, as Volcano does; a "
            "job whose every task must run should leave minAvailable out"
            + (f" (or set it to {num_tasks})" if given else ""),
        )
    return None if want >= num_tasks else want


def _preemptable_mark(where: str, meta: ObjectMeta | TemplateMeta | None) -> tuple[str, Any] | None:
    """`volcano.sh/preemptable` of an object, with its path: its annotation, else its label
    (Volcano reads the label when there is no annotation)."""
    for kind in ("annotations", "labels"):
        marks = getattr(meta, kind, None) or {}
        if PREEMPTABLE_ANNOTATION in marks:
            return f"{where}.{kind}.{PREEMPTABLE_ANNOTATION}", marks[PREEMPTABLE_ANNOTATION]
    return None


def _preemptible(doc: VolcanoJob, p: Problems) -> bool:
    found: list[tuple[str, Any]] = []
    if (job_mark := _preemptable_mark("metadata", doc.metadata)) is not None:
        found.append(job_mark)
    else:
        for i, t in enumerate(doc.spec.tasks):
            where = f"spec.tasks.{i}.template.metadata"
            if (mark := _preemptable_mark(where, t.template.metadata)) is not None:
                found.append(mark)
    preemptible = True
    for path, value in found:
        flag = _BOOL_WORDS.get(value.lower()) if isinstance(value, str) else None
        if flag is None:
            p.add(path, f'expected "true" or "false", got {describe(value)}')
        preemptible = preemptible and flag is not False
    return preemptible


def _queue(doc: VolcanoJob, p: Problems, w: Problems) -> tuple[str | None, str]:
    """`spec.queue`, else the queue a Kueue or KAI scheduler label names (a file written for
    either, run under Volcano's fields); None: the service's default. With the path of the
    field that named it."""
    labels = doc.metadata.labels or {}
    named: list[tuple[str, str]] = []
    for key in QUEUE_LABELS:
        if key in labels:
            path = f"metadata.labels.{key}"
            try:
                named.append((path, _QUEUE_NAME.validate_python(labels[key])))
            except ValidationError as e:
                p.add(path, e.errors(include_url=False)[0]["msg"].removeprefix("Value error, "))
    queue, where = doc.spec.queue, "spec.queue"
    for path, name in named:
        if queue is None:
            queue, where = name, path
        elif name != queue:
            w.add(path, f"ignored: {where} names the job's queue ({queue})")
    return queue, where


def _restart_policy(spec: JobSpec, w: Problems) -> RestartPolicy:
    policies = [(f"spec.policies.{k}", pol) for k, pol in enumerate(spec.policies)] + [
        (f"spec.tasks.{i}.policies.{k}", pol)
        for i, t in enumerate(spec.tasks)
        for k, pol in enumerate(t.policies)
    ]
    restarts = stops = False
    for path, pol in policies:
        events = ([pol.event] if pol.event else []) + list(pol.events or [])
        action = pol.action or ""
        unknown = [e for e in events if e not in KNOWN_EVENTS]
        if action and action not in KNOWN_ACTIONS:
            unknown.append(action)
        if unknown:
            w.add(path, f"ignored: {', '.join(unknown)} unknown to aisched")
            continue
        on_failure = pol.exit_code is not None or bool(FAILURE_EVENTS.intersection(events))
        if action in RESTART_ACTIONS and on_failure:
            restarts = True
            if action != "RestartJob":
                w.add(f"{path}.action", f"{action}: aisched restarts the whole job")
            if pol.exit_code is not None:
                w.add(
                    f"{path}.exitCode",
                    f"aisched restarts on any failure, not only on exit code {pol.exit_code}",
                )
        elif action in STOP_ACTIONS and on_failure:
            stops = True
        elif action in RESTART_ACTIONS and events == ["PodEvicted"]:
            pass  # aisched requeues preempted work by itself
        else:
            when = ", ".join(events) or (
                f"exit code {pol.exit_code}" if pol.exit_code is not None else "no event"
            )
            w.add(path, f"ignored: aisched does not act on {when} -> {action or 'no action'}")
    if restarts:
        return RestartPolicy.ON_FAILURE
    if stops:
        return RestartPolicy.NEVER
    # A task that gives none counts as one of its own: `Never` on one task is not the job's.
    given = {t.template.spec.restart_policy for t in spec.tasks}
    if given == {"Never"}:
        return RestartPolicy.NEVER
    if given == {"Always"}:
        return RestartPolicy.ALWAYS
    if len(given) > 1:
        w.add(
            "spec.tasks",
            "the tasks' restartPolicy differ (or some give none); aisched restarts the whole "
            "job on failure",
        )
    return RestartPolicy.ON_FAILURE


def _kind(spec: JobSpec, w: Problems) -> JobKind:
    plugins = spec.plugins or {}
    for name in plugins:
        if name not in SILENT_PLUGINS:
            w.add(
                f"spec.plugins.{name}",
                "ignored: aisched sets its own environment in every task (AISCHED_TASK_INDEX, "
                "MASTER_ADDR, WORLD_SIZE, RANK...; see docs/jobs.md)",
            )
    return JobKind.TRAIN if TRAIN_PLUGINS.intersection(plugins) else JobKind.BATCH


def _plugin_flags(args: list[str]) -> dict[str, str]:
    """A Volcano plugin's arguments as Go's flag package reads them: `--name=value`,
    `-name=value`, or the flag and its value as two words."""
    out: dict[str, str] = {}
    words = iter(args)
    for word in words:
        if not word.startswith("-"):
            continue
        name, eq, value = word.lstrip("-").partition("=")
        out[name] = value if eq else next(words, "")
    return out


def _pytorch_master_first(
    spec: JobSpec, groups: list[TaskGroup], p: Problems, w: Problems
) -> list[TaskGroup]:
    """The groups in rank order as Volcano's pytorch plugin gives ranks: its `--master` task
    (default `master`) first, so its task is RANK 0 and MASTER_ADDR its host, and its
    `--worker` tasks (default `worker`) after, RANK index + 1, wherever the file lists them.
    The plugin does nothing unless both tasks are there; nor does this. A master task of more
    than one replica is refused: the plugin gives each of them RANK 0 (and the workers' ranks
    start at 1 whatever their number), so no rank order matches it. Its `--port` cannot be
    honoured: MASTER_PORT is a port found free when the job starts (a fixed one would clash
    between two jobs on one host), which is warned about."""
    plugins = spec.plugins or {}
    if "pytorch" not in plugins:
        return groups
    flags = _plugin_flags(plugins["pytorch"] or [])
    if "port" in flags:
        w.add(
            "spec.plugins.pytorch",
            f"--port={flags['port']} not honoured: MASTER_PORT is a free port chosen when the "
            "job starts (a fixed port would clash between jobs on one host); read MASTER_PORT",
        )
    names = [g.name for g in groups]
    master, worker = flags.get("master", "master"), flags.get("worker", "worker")
    if master not in names or worker not in names:
        return groups
    m = names.index(master)
    if groups[m].replicas > 1:
        p.add(
            f"spec.tasks.{m}.replicas",
            f"{groups[m].replicas} replicas of the pytorch plugin's master task {master!r}: it "
            "is one process (the plugin gives each replica RANK 0 and its workers RANK 1 on); "
            f"give it 1 replica and the others to the worker task {worker!r}",
        )
    if m == 0:
        return groups
    order = [m, *(i for i in range(len(groups)) if i != m)]
    return [replace(groups[i], file_index=i) for i in order]


def _warn_job_level(spec: JobSpec, w: Problems) -> None:
    if spec.volumes:
        w.add("spec.volumes", "ignored: aisched mounts only a pod's own hostPath volumes")
    if spec.network_topology:
        w.add("spec.networkTopology", _IGNORED_TOPOLOGY)
    if spec.min_success is not None:
        w.add("spec.minSuccess", "ignored by aisched")
